"""Files written by FFCV 1.0.2 itself (tests/data/ffcv) read through Reader and Loader."""

from __future__ import annotations

import gzip
import json
import pathlib

import cv2
import numpy as np
import pytest

import beton
from beton import Loader, OrderOption
from beton.errors import FormatError
from beton.decoders import (
    BytesDecoder,
    CenterCropRGBImageDecoder,
    FloatDecoder,
    IntDecoder,
    JSONDecoder,
    NDArrayDecoder,
    RandomResizedCropRGBImageDecoder,
)
from beton.transforms import ToTensor

from cli_runs import run_cli
from conftest import DATA

FIXTURES = DATA / "ffcv"
EXPECTED = json.loads((FIXTURES / "expected.json").read_text())
ARRAYS = np.load(FIXTURES / "expected_arrays.npz")


@pytest.fixture(scope="module")
def ffcv_files(tmp_path_factory) -> dict[str, pathlib.Path]:
    """The FFCV files, unpacked from their gzip copies: mode -> path."""
    folder = tmp_path_factory.mktemp("ffcv")
    files = {}
    for mode in ("raw", "jpg"):
        files[mode] = folder / f"ffcv_v2_{mode}.beton"
        files[mode].write_bytes(gzip.decompress((FIXTURES / f"ffcv_v2_{mode}.beton.gz").read_bytes()))
    return files


def psnr(a, b):
    return 10 * np.log10(255**2 / np.mean((a.astype(np.float64) - b) ** 2))


@pytest.mark.parametrize("mode", ["raw", "jpg"])
def test_reader_gives_back_what_ffcv_wrote(ffcv_files, mode):
    with beton.Reader(ffcv_files[mode]) as reader:
        assert reader.format.startswith("FFCV v2") and not reader.checksummed
        assert len(reader) == 40 and list(reader.fields) == ["label", "score", "arr", "blob", "meta", "image"]
        psnrs = []
        for i, expected in enumerate(EXPECTED):
            label, score, arr, blob, meta, image = reader[i]
            assert (label, score, blob.decode(), meta) == (expected["label"], expected["score"], expected["blob"],
                                                           expected["meta"])
            np.testing.assert_array_equal(arr, ARRAYS[f"arr_{i}"])
            reference = ARRAYS[f"image_{i}"]
            if mode == "raw":
                np.testing.assert_array_equal(image, reference)
                continue
            # JPEG: pixel-identical to OpenCV decoding the stored bytes, and no further from the original than a
            # fresh quality-90 OpenCV encode of it (FFCV's own encoder).
            stored = np.frombuffer(reader.payload(i, "image").tobytes(), np.uint8)
            decoded_by_cv2 = cv2.cvtColor(cv2.imdecode(stored, cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)
            np.testing.assert_array_equal(image, decoded_by_cv2)
            _, fresh = cv2.imencode(".jpg", cv2.cvtColor(reference, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, 90])
            fresh = cv2.cvtColor(cv2.imdecode(fresh, cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)
            assert psnr(image, reference) >= psnr(fresh, reference) - 0.01
            psnrs.append(psnr(image, reference))
        if mode == "jpg":
            assert np.mean(psnrs) > 30  # tiny noisy images: single ones go down to ~24 dB at quality 90


@pytest.mark.parametrize("mode", ["raw", "jpg"])
@pytest.mark.parametrize("os_cache", [True, False])
def test_loader_runs_the_same_pipelines_on_ffcv_files(ffcv_files, mode, os_cache):
    pipelines = {"label": [IntDecoder(), ToTensor()], "score": [FloatDecoder(), ToTensor()],
                 "arr": [NDArrayDecoder(), ToTensor()], "blob": [BytesDecoder(exact=True)], "meta": [JSONDecoder()],
                 "image": [CenterCropRGBImageDecoder((16, 16), ratio=1.0), ToTensor()]}
    with Loader(ffcv_files[mode], batch_size=7, num_workers=2, os_cache=os_cache,
                order=OrderOption.RANDOM, seed=1, pipelines=pipelines) as loader:
        seen = 0
        for labels, scores, arrs, blobs, metas, images in loader:
            for k, label in enumerate(labels.tolist()):
                i = next(j for j, e in enumerate(EXPECTED) if e["label"] == label)
                assert scores[k].item() == EXPECTED[i]["score"] and blobs[k].decode() == EXPECTED[i]["blob"]
                assert metas[k] == EXPECTED[i]["meta"]
                np.testing.assert_array_equal(arrs[k].numpy(), ARRAYS[f"arr_{i}"])
                assert images[k].shape == (16, 16, 3)
                seen += 1
        assert seen == 40
    with Loader(ffcv_files[mode], batch_size=8, num_workers=1,
                pipelines={"image": [RandomResizedCropRGBImageDecoder((24, 24)), ToTensor()]}) as loader:
        assert sum(len(batch[0]) for batch in loader) == 40


def test_verify_and_info_say_ffcv_files_have_no_checksums(ffcv_files):
    report = beton.verify(ffcv_files["raw"])
    assert not report.checksummed and report.num_samples == 40
    shown = run_cli("verify", ffcv_files["raw"])
    assert shown.returncode == 0 and "OK (structure only: the file has no checksums)" in shown.stdout


def test_content_checks_asked_of_an_ffcv_file_are_refused_not_skipped(ffcv_files):
    """An FFCV file has no digests: verify_content=True cannot be honoured and says so; None (check where there
    are digests) reads it unchecked."""
    for refuse in (lambda: beton.Reader(ffcv_files["raw"], verify_content=True),
                   lambda: Loader(ffcv_files["raw"], batch_size=8, verify_content=True)):
        with pytest.raises(FormatError, match="verify_content=True: an FFCV file has no content digests"):
            refuse()
    with beton.Reader(ffcv_files["raw"], verify_content=None) as reader:
        assert not reader.verify_content and reader.page_digests is None and len(reader) == 40


def test_a_truncated_ffcv_file_is_refused(ffcv_files, tmp_path):
    data = ffcv_files["raw"].read_bytes()
    for length in (30, 2000, len(data) - 5, len(data) - 24):
        path = tmp_path / "cut.beton"
        path.write_bytes(data[:length])
        with pytest.raises(FormatError):
            beton.Reader(path)


def test_tune_turns_an_ffcv_file_into_a_balanced_beton_file(ffcv_files, tmp_path):
    from beton.tools.tune import tune

    output = tmp_path / "balanced.beton"
    _, plan = tune(ffcv_files["jpg"], output, batch_size=4, read_bandwidth=1e8, num_workers=0,
                   progress=False)
    assert output.stat().st_size == plan.size_after  # computed, FFCV's JSON re-serialised included
    with beton.Reader(ffcv_files["jpg"]) as source, beton.Reader(output) as balanced:
        assert balanced.format.startswith("beton") and balanced.num_samples == source.num_samples
        assert set(np.flatnonzero(balanced.data_table["image"]["mode"] == 0)) == set(plan.raw_samples.tolist())
        for i in range(source.num_samples):
            for stored, original in zip(balanced[i], source[i]):
                if isinstance(original, np.ndarray):
                    np.testing.assert_array_equal(stored, original)
                else:
                    assert stored == original
    # every JPEG kept: copied byte for byte (no restart markers added), as the plan sizes them
    from beton.tools.tune import write_balanced

    write_balanced(ffcv_files["jpg"], tmp_path / "kept.beton", "image", np.zeros(0, np.int64), num_workers=0,
                   progress=False)
    with beton.Reader(ffcv_files["jpg"]) as source, beton.Reader(tmp_path / "kept.beton") as kept:
        assert (kept.data_table["image"]["mode"] == 1).all()
        for i in range(source.num_samples):
            assert bytes(kept.payload(i, "image")) == bytes(source.payload(i, "image"))


def test_the_planned_size_of_a_balanced_file_counts_json_that_grows_when_written_anew(ffcv_files, tmp_path):
    """A document another tool wrote ("1E9") is serialised anew by the writer ("1000000000.0"): the plan that
    bounds --max-size must count the bytes written, not the source's."""
    from beton.tools.tune import balanced_size, write_balanced

    source = tmp_path / "grown.beton"
    data = bytearray(ffcv_files["jpg"].read_bytes())
    with beton.Reader(ffcv_files["jpg"]) as reader:  # FFCV files carry no checksums: edited in place
        column = reader.descriptors["meta"].payload_column
        allocations = reader.allocation_table[:, column]
    for offset, size in zip(allocations["offset"].tolist(), allocations["size"].tolist()):
        items = (size - 5) // 4 + 1
        text = ("[" + ",".join(["1E9"] * items) + "]").ljust(size).encode()
        data[offset : offset + size] = text
    source.write_bytes(bytes(data))
    raw = np.array([1, 5], np.int64)
    with beton.Reader(source) as reader:
        assert reader[0][4] == [1e9] * ((allocations["size"][0] - 5) // 4 + 1)
        planned = balanced_size(reader, "image", raw)
    write_balanced(source, tmp_path / "out.beton", "image", raw, num_workers=0, progress=False)
    assert (tmp_path / "out.beton").stat().st_size == planned
