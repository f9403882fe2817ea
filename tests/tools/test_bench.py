"""The benchmark suite: its decode limits (beton's own crop decoder, alone; errors are not swallowed) and its optional
peers (Mosaic Streaming, LitData: skipped with their reason when missing, the same images when present)."""

from __future__ import annotations

import sys

import pytest
import torch

from beton.codecs.jpeg_restarts import with_restart_markers
from beton.errors import DecodeError
from beton.tools.bench import contenders as c
from beton.tools.bench.data import make_jpegs
from beton.tools.bench.timing import epoch_rate


@pytest.mark.parametrize("kind, size", [("rrc", 160), ("center", 224)])
def test_the_limits_are_the_decoders_own_decode_step(kind, size):
    task = c.ImageTask(kind, size, 8)
    jpegs = make_jpegs(6, 256)
    whole, crop = c.DecodeLimit(jpegs, task, "whole"), c.DecodeLimit(jpegs, task, "crop")
    assert (whole.decoder.decode_whole, crop.decoder.decode_whole) == (True, False)
    for limit in (whole, crop):  # everything else is the task's decoder: output size, crop, upsampling
        assert limit.decoder.output_size == task.decoder.output_size == (size, size)
        assert limit.decoder.fast_upsample == task.decoder.fast_upsample == (kind == "rrc")
        assert epoch_rate(limit) > 0 and limit.epoch == 1
    with pytest.raises(ValueError, match="rows"):
        c.DecodeLimit(jpegs, task, "some")
    # the JPEGs as beton's field stores them (restart markers added), or as given for the crop-rows limit
    assert [p.tobytes() for p in crop.payloads] == [with_restart_markers(j) for j in jpegs] != jpegs
    assert [p.tobytes() for p in c.DecodeLimit(jpegs, task, "crop", restart_markers=False).payloads] == jpegs


def test_the_resize_limit_resizes_each_crop_as_the_decoder_does(monkeypatch):
    """The crop-only + resize limit calls the decoder's own resize once per image, on the decoded crop and its
    mapped rectangle, into an output of the task's size; the other limits never resize."""
    task = c.ImageTask("rrc", 160, 8)
    jpegs = make_jpegs(6, 500)
    calls = []
    monkeypatch.setattr(c, "resize_into", lambda image, out, crop, scratch: calls.append((image.shape, out.shape,
                                                                                            crop)))
    epoch_rate(c.DecodeLimit(jpegs, task, "crop"))
    assert calls == []
    epoch_rate(c.DecodeLimit(jpegs, task, "crop", resize=True))
    assert len(calls) == 6 and all(out == (160, 160, 3) for _, out, _ in calls)
    assert all(crop[2] <= image[0] and crop[3] <= image[1] for image, _, crop in calls)


def test_a_limit_that_cannot_decode_an_image_raises_instead_of_reporting_a_rate():
    jpegs = make_jpegs(4, 256)
    jpegs[3] = jpegs[3][: len(jpegs[3]) // 2]  # truncated: libjpeg-turbo warns of the premature end
    limit = c.DecodeLimit(jpegs, c.ImageTask("center", 224, 8), "whole")
    with pytest.raises(DecodeError):
        epoch_rate(limit)


# ---- peers: Mosaic Streaming and LitData (optional; CI does not install them) -----------------------------

PEERS = {"Mosaic Streaming": ("streaming", "mosaic_images"), "LitData": ("litdata", "litdata_images")}


@pytest.mark.parametrize("name", PEERS)
def test_a_peer_that_is_not_installed_is_skipped_with_its_reason(name, tmp_path, monkeypatch):
    from beton.tools.bench import peers
    from beton.tools.bench.suite import measure_contenders

    module, builder = PEERS[name]
    monkeypatch.setitem(sys.modules, module, None)  # what `import` meets when the package is missing
    build = getattr(peers, builder)
    result = measure_contenders({name: lambda: build(make_jpegs(2, 256), c.ImageTask("rrc", 160, 2),
                                                     str(tmp_path / "files"))}, repeats=1)
    assert name in result["skipped"] and "not importable" in result["skipped"][name]
    assert module in result["skipped"][name]
    assert result["images_per_s"] == result["conversion_seconds"] == {}
    assert not (tmp_path / "files").exists()  # nothing converted for a contender that cannot run


@pytest.mark.parametrize("name", PEERS)
def test_a_peer_delivers_every_image_cropped_like_the_torch_contender(name, tmp_path):
    from beton.tools.bench import peers

    module, builder = PEERS[name]
    pytest.importorskip(module, reason=f"{name} is not installed (an optional benchmark contender)")
    jpegs, task = make_jpegs(10, 256), c.ImageTask("center", 224, 4)
    built = getattr(peers, builder)(jpegs, task, str(tmp_path / "files"))
    assert isinstance(built, c.Converted) and built.seconds > 0
    reference = c.TorchImages(jpegs, task, "simplejpeg")
    for _ in range(2):  # two epochs: each delivers every image once, its pixels those of the torch contender
        seen = []
        for images, labels in built.loader:
            assert images.dtype == torch.uint8 and images.shape[1:] == (3, 224, 224)
            for image, label in zip(images, labels.tolist()):
                assert torch.equal(image, reference.from_bytes(jpegs[label]))
                seen.append(label)
        assert sorted(seen) == list(range(len(jpegs)))
