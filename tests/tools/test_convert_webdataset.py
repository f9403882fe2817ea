"""``convert webdataset``: tar shards grouped by key, extensions to fields, bad samples named, streamed."""

from __future__ import annotations

import io
import json
import tarfile
import tracemalloc

import numpy as np
import pytest
import simplejpeg
from PIL import Image

import beton
import beton.convert
from beton.fields import BytesField, IntField, JSONField, RGBImageField
from beton.tools.convert import ConversionError
from beton.tools.convert.webdataset import expand_braces
from beton.tools.sample_photos import photo_crop
from beton.codecs.jpeg_restarts import with_restart_markers

from cli_runs import run_cli


def jpeg(i: int) -> bytes:
    return simplejpeg.encode_jpeg(photo_crop(i, 24 + i % 5, 32), quality=90)


def png(i: int) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(photo_crop(i, 20, 20)).save(buffer, "PNG")
    return buffer.getvalue()


def sample(i: int, image: str = "jpg") -> dict[str, bytes]:
    return {image: jpeg(i) if image == "jpg" else png(i), "cls": f"{i % 4}\n".encode(),
            "json": json.dumps({"i": i, "caption": f"photo {i}"}).encode(), "txt": f"text ü {i}".encode(),
            "seg.raw": bytes([i]) * (i + 1)}


def shard(path, samples: list[tuple[str, dict[str, bytes]]], mode: str = "w") -> str:
    with tarfile.open(path, mode) as archive:
        for key, members in samples:
            for extension, data in members.items():
                info = tarfile.TarInfo(f"{key}.{extension}")
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))
    return str(path)


def shards(tmp_path, count: int = 3, per_shard: int = 4) -> list[str]:
    return [shard(tmp_path / f"train-{s:03d}.tar", [(f"dir/s{s * per_shard + k:05d}", sample(s * per_shard + k))
                                                   for k in range(per_shard)]) for s in range(count)]


def test_extensions_become_fields_and_samples_round_trip(tmp_path):
    shards(tmp_path)
    report = beton.convert.webdataset(str(tmp_path / "train-{000..002}.tar"), tmp_path / "w.beton", num_workers=2,
                                      progress=False)
    assert report.num_samples == 12 and not report.skipped
    with beton.Reader(tmp_path / "w.beton") as reader:
        assert {name: type(field) for name, field in reader.fields.items()} == {
            "jpg": RGBImageField, "cls": IntField, "json": JSONField, "txt": JSONField, "seg.raw": BytesField,
            "__key__": JSONField}
        for i in range(12):
            image, label, meta, text, raw, key = reader[i]
            assert bytes(reader.payload(i, "jpg")) == with_restart_markers(jpeg(i)) and image.shape == (24 + i % 5, 32, 3)
            assert (label, meta, text, raw, key) == (i % 4, {"i": i, "caption": f"photo {i}"}, f"text ü {i}",
                                                     bytes([i]) * (i + 1), f"dir/s{i:05d}")
        assert reader.metadata["source"]["format"] == "webdataset"
        assert reader.metadata["source"]["shards"] == [str(tmp_path / f"train-{s:03d}.tar") for s in range(3)]


def test_alternatives_selection_overrides_folders_and_compressed_shards(tmp_path):
    (tmp_path / "shards").mkdir()
    mixed = [(f"k{i}", {("jpg" if i % 2 else "png"): sample(i, "jpg" if i % 2 else "png")["jpg" if i % 2 else "png"],
                        "cls": b"%d" % i, "json": b"{}"}) for i in range(6)]
    shard(tmp_path / "shards" / "a.tar.gz", mixed[:3], "w:gz")
    shard(tmp_path / "shards" / "b.tar", mixed[3:])
    result = run_cli("convert", "webdataset", tmp_path / "shards", tmp_path / "m.beton", "--extensions", "jpg;png,cls",
                 "--type", "cls=bytes", "--no-key", "--write-mode", "lossless", "--no-progress")
    assert result.returncode == 0, result.stderr
    with beton.Reader(tmp_path / "m.beton") as reader:
        assert reader.field_names == ["jpg", "cls"] and len(reader) == 6
        for i in range(6):
            image, label = reader[i]
            assert label == b"%d" % i
            if i % 2 == 0:  # PNGs stored exactly
                np.testing.assert_array_equal(image, photo_crop(i, 20, 20))


def test_bad_samples_fail_or_are_skipped_with_shard_and_key(tmp_path):
    good = [(f"g{i}", sample(i)) for i in range(3)]
    missing = ("no-label", {k: v for k, v in sample(3).items() if k != "cls"})
    extra = ("extra", {**sample(4), "depth.png": png(4)})
    bad_int = ("bad-int", {**sample(5), "cls": b"cat"})
    bad_json = ("bad-json", {**sample(6), "json": b"{not json"})
    bad_text = ("bad-text", {**sample(7), "txt": b"\xff\xfe"})
    bad_image = ("bad-image", {**sample(8), "jpg": jpeg(8)[:300]})
    path = shard(tmp_path / "s.tar", good[:1] + [missing, extra, bad_int, bad_json] + good[1:2] +
                 [bad_text, bad_image] + good[2:])
    with pytest.raises(ConversionError, match=r"s.tar no-label: has no .cls"):
        beton.convert.webdataset(path, tmp_path / "o.beton", num_workers=0, progress=False)
    report = beton.convert.webdataset(path, tmp_path / "o.beton", on_error="skip", num_workers=2, progress=False)
    reasons = {item.source.rsplit(" ", 1)[1]: item.reason for item in report.skipped}
    assert reasons == {
        "no-label": "has no .cls (if the key's other files come later in the shard, the tar is not grouped by key)",
        "extra": "has extensions the first sample lacks: depth.png (choose the fields with extensions=..., "
                 "--extensions)",
        "bad-int": ".cls holds b'cat', not an integer",
        "bad-json": reasons["bad-json"] if reasons["bad-json"].startswith(".json is not valid JSON: ") else "?",
        "bad-text": reasons["bad-text"] if reasons["bad-text"].startswith(".txt is not UTF-8 text: ") else "?",
        "bad-image": "field 'jpg': JPEG header cannot be read: " + reasons["bad-image"].split(": ", 2)[2],
    }
    with beton.Reader(tmp_path / "o.beton") as reader:
        assert [reader[i][-1] for i in range(len(reader))] == ["g0", "g1", "g2"]


def test_a_tar_not_grouped_by_key_is_named_as_such(tmp_path):
    """A key whose files are split by another key's (a tar written unsorted) was two incomplete samples, each
    refused only as missing what the other held; a key met again after a complete sample made a second sample
    with the same key."""
    split, whole = sample(0), sample(1)
    first_part = {extension: split[extension] for extension in ("jpg", "cls")}
    second_part = {extension: data for extension, data in split.items() if extension not in first_part}
    path = shard(tmp_path / "unsorted.tar", [("a", first_part), ("b", whole), ("a", second_part), ("c", sample(2)),
                                             ("b", sample(3))])
    with pytest.raises(ConversionError, match=r"unsorted.tar a: has no .json \(if the key's other files come later "
                                              r"in the shard, the tar is not grouped by key\)"):
        beton.convert.webdataset(path, tmp_path / "o.beton", extensions=["jpg", "cls", "json"], num_workers=0,
                                 progress=False)
    report = beton.convert.webdataset(path, tmp_path / "o.beton", extensions=["jpg", "cls", "json"], on_error="skip",
                                      num_workers=0, progress=False)
    reasons = [(item.source.rsplit(" ", 1)[1], item.reason) for item in report.skipped]
    together = ("its files are not together: the key came earlier in this shard, apart from these (a tar not grouped "
                "by key; write each key's files one after another, e.g. tar --sort=name)")
    assert [key for key, _ in reasons] == ["a", "a", "b"] and reasons[1][1] == reasons[2][1] == together
    with beton.Reader(tmp_path / "o.beton") as reader:
        assert [reader[i][-1] for i in range(len(reader))] == ["b", "c"]  # b once: the first, complete one


def member_offsets(path) -> list[tuple[str, int, int]]:
    with tarfile.open(path) as archive:
        return [(member.name, member.offset, member.offset_data + member.size) for member in archive]


@pytest.mark.parametrize("where", ["inside data", "at a header", "inside a header", "damaged header"])
def test_a_damaged_shard_keeps_what_came_before_and_names_where_it_broke(tmp_path, where):
    whole = shard(tmp_path / "whole.tar", [(f"k{i}", sample(i)) for i in range(6)])
    content = bytearray(open(whole, "rb").read())
    name, header, end = next(m for m in member_offsets(whole) if m[0] == "k3.json")  # k0..k2 whole, k3 broken
    if where == "damaged header":
        content[header : header + 100] = b"\xab" * 100
    else:
        cut = {"inside data": end - 5, "at a header": header, "inside a header": header + 100}[where]
        content = content[:cut]
    (tmp_path / "cut.tar").write_bytes(bytes(content))
    good = shard(tmp_path / "next.tar", [("n0", sample(9))])
    with pytest.raises(ConversionError, match="cut.tar after k3: the shard cannot be read on"):
        beton.convert.webdataset([str(tmp_path / "cut.tar"), good], tmp_path / "o.beton", num_workers=0,
                                 progress=False)
    report = beton.convert.webdataset([str(tmp_path / "cut.tar"), good], tmp_path / "o.beton", on_error="skip",
                                      num_workers=0, progress=False)
    assert [item.source for item in report.skipped] == [str(tmp_path / "cut.tar") + " after k3"]
    assert "the shard cannot be read on" in report.skipped[0].reason
    with beton.Reader(tmp_path / "o.beton") as reader:
        assert [reader[i][-1] for i in range(len(reader))] == ["k0", "k1", "k2", "n0"]


def test_shards_written_by_the_webdataset_package(tmp_path):
    webdataset = pytest.importorskip("webdataset", reason="the webdataset package is not installed")
    with webdataset.TarWriter(str(tmp_path / "wds-000000.tar")) as sink:
        for i in range(5):
            sink.write({"__key__": f"sample{i:04d}", "jpg": jpeg(i), "cls": i % 2, "json": {"n": i}})
    report = beton.convert.webdataset(str(tmp_path / "wds-{000000..000000}.tar"), tmp_path / "o.beton",
                                      num_workers=0, progress=False)
    assert report.num_samples == 5
    with beton.Reader(tmp_path / "o.beton") as reader:
        for i in range(5):
            values = dict(zip(reader.field_names, reader[i]))
            assert (values["cls"], values["json"], values["__key__"]) == (i % 2, {"n": i}, f"sample{i:04d}")
            assert bytes(reader.payload(i, "jpg")) == with_restart_markers(jpeg(i))


def test_streaming_holds_samples_in_flight_not_the_shard(tmp_path):
    """A 48 MB shard converts in far less memory than the shard (the writer keeps a few chunks in flight)."""
    rng = np.random.default_rng(0)
    blob = rng.integers(0, 256, 200_000, dtype=np.uint8).tobytes()
    path = shard(tmp_path / "big.tar", [(f"k{i:04d}", {"bin": blob, "cls": b"%d" % i}) for i in range(240)])
    tracemalloc.start()
    try:
        report = beton.convert.webdataset(path, tmp_path / "big.beton", num_workers=0, progress=False)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert report.num_samples == 240
    assert peak < 48e6 / 3, f"peak {peak / 1e6:.1f} MB for a 48 MB shard"


def test_brace_patterns():
    assert expand_braces("a{08..11}b") == ["a08b", "a09b", "a10b", "a11b"]
    assert expand_braces("s{0..1}-{x,y}.tar") == ["s0-x.tar", "s0-y.tar", "s1-x.tar", "s1-y.tar"]
    assert expand_braces("plain.tar") == ["plain.tar"]
    with pytest.raises(ConversionError, match="runs backwards"):
        expand_braces("{3..1}")


def test_missing_shards_and_empty_shards_are_named(tmp_path):
    with pytest.raises(ConversionError, match=r"shard '.*train-001.tar' does not exist"):
        shards(tmp_path, count=1)
        beton.convert.webdataset(str(tmp_path / "train-{000..001}.tar"), tmp_path / "o.beton", progress=False)
    shard(tmp_path / "empty.tar", [])
    with pytest.raises(ConversionError, match="the shards hold no samples"):
        beton.convert.webdataset(str(tmp_path / "empty.tar"), tmp_path / "o.beton", progress=False)


def test_every_sample_skipped_fails_and_keeps_the_target(tmp_path):
    path = shard(tmp_path / "s.tar", [("a", {"jpg": jpeg(1), "cls": b"1"}), ("b", {"jpg": jpeg(2), "cls": b"x"}),
                                      ("c", {"jpg": b"junk", "cls": b"3"})])
    (tmp_path / "o.beton").write_bytes(b"an older file")
    with pytest.raises(ConversionError, match="every sample was skipped; the first: .*s.tar a: "):
        beton.convert.webdataset(path, tmp_path / "o.beton", extensions=["png", "cls"], on_error="skip",
                                 num_workers=0, progress=False)
    assert (tmp_path / "o.beton").read_bytes() == b"an older file"


def test_dataset_writer_from_webdataset_writes_what_the_pipeline_yields(tmp_path):
    """FFCV's DatasetWriter.from_webdataset(shards, pipeline): the pipeline maps each shard's WebDataset."""
    webdataset = pytest.importorskip("webdataset")
    from beton import DatasetWriter, Reader
    from beton.fields import IntField, JSONField

    shards = []
    for shard in range(2):
        path = str(tmp_path / f"part-{shard}.tar")
        with webdataset.TarWriter(path) as sink:
            for i in range(3):
                key = shard * 3 + i
                sink.write({"__key__": f"{key:04d}", "cls": str(key * 7).encode(), "json": {"k": key}})
        shards.append(path)

    def pipeline(dataset):
        return dataset.decode().to_tuple("cls", "json")

    out = tmp_path / "from_wds.beton"
    DatasetWriter(str(out), {"label": IntField(), "meta": JSONField()}, num_workers=1).from_webdataset(
        shards, pipeline)
    with Reader(str(out)) as reader:
        assert [reader[i] for i in range(len(reader))] == [(key * 7, {"k": key}) for key in range(6)]
