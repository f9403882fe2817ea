"""Shard-parallel writing and ``beton merge``: a dataset written as several files, each by its own writer, then
combined, is the file one writer makes of the whole dataset, byte for byte; anything that does not fit together is
refused with an error naming the shard, field or key, and the target path is left as it was."""

from __future__ import annotations

import importlib
import json
import os
import pathlib
import signal
import subprocess
import sys
import time
import tracemalloc

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import beton
from beton.codecs.jpeg_scans import progressive_prefix
from beton.errors import CorruptDataError, FieldError, FormatError, ShardError
from beton.fields import BytesField, FloatField, IntField, NDArrayField, RaggedArrayField, RGBImageField
from beton.dataset.merge import merge
from beton.dataset.shards import index
from beton.storage.writer import shard_range
from beton.tools.sample_photos import photo_crop

from cli_runs import run_cli
from conftest import MIXED_FIELDS, TESTS, ListDataset, mixed_sample
from ffcv_style_fields import AudioField, OffsetIntField, VectorField

PHOTOS = [photo_crop(i, 72 + 8 * (i % 4), 96) for i in range(23)]


def write_whole(path, fields, samples, **options):
    options = {"num_workers": 0, "progress": False, **options}
    beton.DatasetWriter(path, fields, **options).from_indexed_dataset(ListDataset(samples), chunksize=5)
    return str(path)


def write_shards(directory, fields, samples, bounds, **options):
    """One file per part [bounds[k], bounds[k+1]) of the dataset, each by its own writer (as separate machines
    would), named so that sorting the names gives the shards' order."""
    options = {"num_workers": 0, "progress": False, **options}
    paths = []
    for k, (start, end) in enumerate(zip(bounds, bounds[1:])):
        path = os.path.join(directory, f"part-{k:05d}-of-{len(bounds) - 1:05d}.beton")
        beton.DatasetWriter(path, fields, **options).from_indexed_dataset(ListDataset(samples), chunksize=5,
                                                                          start=start, end=end)
        paths.append(path)
    return paths


def same_bytes(a, b) -> bool:
    with open(a, "rb") as first, open(b, "rb") as second:
        return first.read() == second.read()


def same_value(a, b) -> bool:
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
    if isinstance(a, tuple):
        return isinstance(b, tuple) and len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def assert_same_samples(path, expected_path, **reader_options):
    with beton.Reader(path, **reader_options) as got, beton.Reader(expected_path, **reader_options) as expected:
        assert len(got) == len(expected)
        for i in range(len(expected)):
            assert same_value(got[i], expected[i]), f"sample {i}"


# ---- where shards start -------------------------------------------------------------------------------------

@given(st.integers(0, 10_000), st.integers(1, 300))
def test_shard_ranges_are_contiguous_cover_everything_and_differ_by_at_most_one(num_samples, num_shards):
    ranges = [shard_range(num_samples, k, num_shards) for k in range(num_shards)]
    assert ranges[0][0] == 0 and ranges[-1][1] == num_samples
    assert all(end == start for (_, end), (start, _) in zip(ranges, ranges[1:]))
    sizes = [end - start for start, end in ranges]
    assert max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize("arguments, error", [
    ((10, 3, 3), ValueError), ((10, -1, 3), ValueError), ((10, 0, 0), ValueError), ((-1, 0, 1), ValueError),
    ((10, 1.0, 3), TypeError), ((10, True, 3), TypeError),
])
def test_shard_range_refuses_what_names_no_shard(arguments, error):
    with pytest.raises(error):
        shard_range(*arguments)


@pytest.mark.parametrize("options", [
    {"shard": (0, 2), "start": 1}, {"shard": (2, 2)}, {"shard": [0, 2]}, {"shard": (0,)}, {"start": 5, "end": 4},
    {"end": 11}, {"start": -1}, {"start": 0.5},
])
def test_writer_refuses_parts_outside_the_dataset(tmp_path, options):
    writer = beton.DatasetWriter(tmp_path / "x.beton", {"label": IntField()}, num_workers=0, progress=False)
    with pytest.raises((ValueError, TypeError)):
        writer.from_indexed_dataset(ListDataset([(i,) for i in range(10)]), **options)
    assert not os.listdir(tmp_path)


def test_sample_i_of_shard_k_is_sample_start_plus_i(tmp_path):
    samples = [mixed_sample(i) for i in range(50)]
    for k in range(3):
        path = tmp_path / f"{k}.beton"
        report = beton.DatasetWriter(path, MIXED_FIELDS, num_workers=0, progress=False).from_indexed_dataset(
            ListDataset(samples), shard=(k, 3))
        start, end = shard_range(50, k, 3)
        assert report.num_samples == end - start
        with beton.Reader(path) as reader:
            assert len(reader) == end - start
            assert all(same_value(reader[i], samples[start + i]) for i in range(len(reader)))


# ---- merged shards are the single write ---------------------------------------------------------------------

def ragged(i):
    return (np.arange(i % 7 * 3, dtype=np.int32) + i).reshape(-1, 3), bytes([i % 256]) * (i % 5)


DATASETS = {
    # name: (fields, samples, writer options)
    "mixed": (MIXED_FIELDS, [mixed_sample(i) for i in range(61)], {"page_size": 1024}),
    "mixed with metadata, shuffled": (MIXED_FIELDS, [mixed_sample(i) for i in range(61)],
                                      {"page_size": 512, "metadata": {"name": "mixed", "classes": {"label": ["a"]}},
                                       "seed": 5}),
    "scan-grouped progressive": ({"image": RGBImageField(write_mode="progressive", scan_grouped=True),
                                  "label": IntField()}, [(p, i) for i, p in enumerate(PHOTOS)], {"page_size": 16384}),
    "progressive": ({"image": RGBImageField(write_mode="progressive")}, [(p,) for p in PHOTOS], {"page_size": 4096}),
    "lossless and proportion": ({"lossless": RGBImageField(write_mode="lossless"),
                                 "drawn": RGBImageField(write_mode="proportion", compress_probability=0.5)},
                                [(p[:40, :48], p) for p in PHOTOS], {"page_size": 8192, "seed": 3}),
    "ragged": ({"rows": RaggedArrayField(np.int32, (None, 3)), "bytes": BytesField(), "x": FloatField()},
               [(*ragged(i), i / 7) for i in range(40)], {"page_size": 256}),
    "FFCV contract": ({"audio": AudioField(22050), "vector": VectorField(4), "number": OffsetIntField(-5),
                       "label": IntField()},
                      [((np.arange(5 * (i % 9)) * 31 + i).astype(np.int16), np.arange(4, dtype=np.float32) + i,
                        3 * i, i) for i in range(37)], {"page_size": 256}),
}
CUSTOM = {"audio": AudioField, "vector": VectorField, "number": OffsetIntField}


@pytest.mark.parametrize("name", DATASETS)
def test_shards_merged_are_byte_for_byte_the_single_write(tmp_path, name):
    """n = 3 uneven shards, one of them empty, written by separate writers; merged, then compared with one write."""
    fields, samples, options = DATASETS[name]
    shuffle = "shuffled" in name
    whole = str(tmp_path / "whole.beton")
    beton.DatasetWriter(whole, fields, num_workers=0, progress=False, **options).from_indexed_dataset(
        ListDataset(samples), shuffle_indices=shuffle)
    n = len(samples)
    bounds = [0, 7, 7, n]  # 7 samples, none, the rest
    paths = []
    for k, (start, end) in enumerate(zip(bounds, bounds[1:])):
        paths.append(str(tmp_path / f"shard-{k}.beton"))
        beton.DatasetWriter(paths[-1], fields, num_workers=0, progress=False, **options).from_indexed_dataset(
            ListDataset(samples), shuffle_indices=shuffle, start=start, end=end, chunksize=4)
    with beton.Reader(paths[1], custom_fields=CUSTOM) as empty:
        assert len(empty) == 0
    report = merge(tmp_path / "merged.beton", paths, custom_fields=CUSTOM)
    assert report.num_samples == n and report.shards == tuple(paths)
    assert same_bytes(tmp_path / "merged.beton", whole)
    assert beton.verify(tmp_path / "merged.beton", custom_fields=CUSTOM).num_samples == n


def test_shard_argument_with_workers_gives_the_same_files(tmp_path):
    """shard=(k, n), and the writer's worker processes change nothing in a shard's bytes."""
    samples = [mixed_sample(i) for i in range(100)]
    whole = write_whole(tmp_path / "whole.beton", MIXED_FIELDS, samples, page_size=1024)
    paths = []
    for k in range(3):
        paths.append(str(tmp_path / f"{k}.beton"))
        beton.DatasetWriter(paths[-1], MIXED_FIELDS, num_workers=2 if k == 1 else 0, progress=False,
                            page_size=1024).from_indexed_dataset(ListDataset(samples), shard=(k, 3), chunksize=7)
    merge(tmp_path / "merged.beton", paths)
    assert same_bytes(tmp_path / "merged.beton", whole)


def test_merging_into_another_page_size_groups_scans_as_one_write_with_that_page_size(tmp_path):
    fields, samples, options = DATASETS["scan-grouped progressive"]
    whole = write_whole(tmp_path / "whole.beton", fields, samples, **options)  # 16 KiB pages: ~4 images a record
    with beton.Reader(whole) as reader:  # grouped: a sample's second scan lies after the record's first scans
        assert (reader.data_table["image"]["scan_starts"][:, 1] > reader.data_table["image"]["scan_ends"][:, 0]).any()
    paths = write_shards(tmp_path, fields, samples, [0, 5, 11, len(samples)], **options)
    merge(tmp_path / "merged.beton", paths, page_size=65536)
    # records fill the 64 KiB pages exactly as a write with 64 KiB pages fills them
    assert same_bytes(tmp_path / "merged.beton",
                      write_whole(tmp_path / "whole-64k.beton", fields, samples, page_size=65536))
    assert_same_samples(tmp_path / "merged.beton", whole)
    with beton.Reader(tmp_path / "merged.beton") as merged, beton.Reader(whole) as expected:
        assert merged.num_pages < expected.num_pages
        buffer = lambda size: np.empty(size, np.uint8)  # noqa: E731
        for i in range(len(expected)):
            for fidelity in (1, 3, None):  # each sample read at each fidelity: the same JPEG prefix
                got = progressive_prefix(merged.payload(i, "image"), merged.data_table["image"][i], fidelity, buffer)
                want = progressive_prefix(expected.payload(i, "image"), expected.data_table["image"][i], fidelity,
                                          buffer)
                assert got.tobytes() == want.tobytes()


def test_merge_takes_a_manifest_and_a_glob(tmp_path):
    samples = [mixed_sample(i) for i in range(30)]
    whole = write_whole(tmp_path / "whole.beton", MIXED_FIELDS, samples, page_size=1024)
    directory = tmp_path / "shards"
    directory.mkdir()
    write_shards(directory, MIXED_FIELDS, samples, [0, 10, 20, 30], page_size=1024)
    index(directory / "train.json", str(directory / "part-*.beton"))
    merge(tmp_path / "from-manifest.beton", directory / "train.json")
    merge(tmp_path / "from-glob.beton", str(directory / "part-*.beton"))
    assert same_bytes(tmp_path / "from-manifest.beton", whole) and same_bytes(tmp_path / "from-glob.beton", whole)


def test_merge_streams_payloads_in_bounded_memory(tmp_path, monkeypatch):
    """30 MiB of payloads in 3 shards, merged with 1 MiB chunks: the Python memory held at once stays a few MiB
    (the tables are tiny here), which holding a whole shard would exceed."""
    fields = {"blob": BytesField(), "label": IntField()}
    blob = np.random.default_rng(0).integers(0, 256, 512 * 1024, dtype=np.uint8).tobytes()
    samples = [(blob[i:] + blob[:i], i) for i in range(60)]
    paths = write_shards(tmp_path, fields, samples, [0, 20, 40, 60], page_size=1 << 20)
    monkeypatch.setattr(importlib.import_module("beton.dataset.merge"), "CHUNK_BYTES", 1 << 20)
    tracemalloc.start()
    try:
        merge(tmp_path / "merged.beton", paths)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 6 * 2**20, f"peak {peak / 2**20:.1f} MiB"
    with beton.Reader(tmp_path / "merged.beton") as reader:
        assert len(reader) == 60 and reader[59][0] == samples[59][0]


# ---- what merge refuses --------------------------------------------------------------------------------------

MISMATCHES = {
    "another argument": ({"label": IntField(), "arr": NDArrayField(np.float32, (3, 5))}, "argument shape=[3,5]"),
    "another type": ({"label": FloatField(), "arr": NDArrayField(np.float32, (3, 4))},
                     "field 'label' is a beton.FloatField, expected a beton.IntField"),
    "another name": ({"id": IntField(), "arr": NDArrayField(np.float32, (3, 4))}, "field 0 is 'id', expected 'label'"),
    "another order": ({"arr": NDArrayField(np.float32, (3, 4)), "label": IntField()},
                      "field 0 is 'arr', expected 'label'"),
    "one field more": ({"label": IntField(), "arr": NDArrayField(np.float32, (3, 4)), "x": FloatField()},
                       "a field more than expected: field 2, 'x'"),
    "one field less": ({"label": IntField()}, "lacks field 1, 'arr'"),
}


@pytest.mark.parametrize("name", MISMATCHES)
def test_merge_refuses_shards_whose_fields_differ_naming_the_first_difference(tmp_path, name):
    fields = {"label": IntField(), "arr": NDArrayField(np.float32, (3, 4))}
    other_fields, expected = MISMATCHES[name]
    good = write_whole(tmp_path / "a.beton", fields, [(i, np.zeros((3, 4), np.float32)) for i in range(5)])
    values = {"label": 1, "arr": np.zeros(other_fields.get("arr", fields["arr"]).shape, np.float32), "id": 1, "x": 0.5}
    bad = write_whole(tmp_path / "b.beton", other_fields, [tuple(values[n] for n in other_fields)] * 3)
    target = tmp_path / "merged.beton"
    target.write_bytes(b"an older file")
    with pytest.raises(ShardError) as caught:
        merge(target, [good, bad])
    assert expected in str(caught.value) and caught.value.path == bad
    assert target.read_bytes() == b"an older file"
    assert sorted(os.listdir(tmp_path)) == ["a.beton", "b.beton", "merged.beton"]  # no temporary file left


def test_metadata_is_kept_when_every_shard_has_the_same_else_refused_or_set(tmp_path):
    samples = [mixed_sample(i) for i in range(20)]
    same = write_shards(tmp_path, MIXED_FIELDS, samples, [0, 10, 20], metadata={"name": "d", "classes": [1, 2]})
    merge(tmp_path / "kept.beton", same)
    assert beton.Reader(tmp_path / "kept.beton").metadata == {"name": "d", "classes": [1, 2]}
    other = str(tmp_path / "other.beton")
    write_whole(other, MIXED_FIELDS, samples[:3], metadata={"name": "d", "classes": [1, 3]})
    with pytest.raises(ShardError, match="shard 2's file-level metadata differs from shard 0's at key 'classes'"):
        merge(tmp_path / "refused.beton", [*same, other])
    assert not os.path.exists(tmp_path / "refused.beton")
    merge(tmp_path / "set.beton", [*same, other], metadata={"name": "merged"})
    assert beton.Reader(tmp_path / "set.beton").metadata == {"name": "merged"}
    merge(tmp_path / "none.beton", [*same, other], metadata=None)
    with beton.Reader(tmp_path / "none.beton") as reader:
        assert reader.metadata == {} and reader.format == "beton v3"


def test_a_damaged_page_of_a_shard_fails_the_merge_naming_shard_and_page(tmp_path):
    samples = [mixed_sample(i) for i in range(40)]
    paths = write_shards(tmp_path, MIXED_FIELDS, samples, [0, 20, 40], page_size=1024)
    with beton.Reader(paths[1]) as reader:
        start, _ = reader.page_bounds(3)
    with open(paths[1], "r+b") as file:  # a payload byte: opening the shard does not notice, copying it must
        file.seek(start + 10)
        byte = file.read(1)
        file.seek(start + 10)
        file.write(bytes([byte[0] ^ 1]))
    with pytest.raises(CorruptDataError) as caught:
        merge(tmp_path / "merged.beton", paths)
    assert caught.value.path == paths[1] and caught.value.page == 3
    assert not os.path.exists(tmp_path / "merged.beton")


def test_merge_needs_the_class_of_every_field(tmp_path):
    fields, samples, options = DATASETS["FFCV contract"]
    paths = write_shards(tmp_path, fields, samples, [0, 10, len(samples)], **options)
    with pytest.raises(FieldError) as caught:
        merge(tmp_path / "merged.beton", paths)
    assert caught.value.field == "audio" and "merging needs the field's class" in str(caught.value)
    merge(tmp_path / "merged.beton", paths, custom_fields=CUSTOM)
    with beton.Reader(tmp_path / "merged.beton", custom_fields=CUSTOM) as reader:  # pointers renumbered: it opens
        assert len(reader) == len(samples)


def merge_slowly(directory: str) -> None:
    """Subprocess side of the SIGTERM test: a merge copying one small chunk every 50 ms."""
    module = importlib.import_module("beton.dataset.merge")
    module.CHUNK_BYTES = 1024
    copy = module._shard_chunks

    def slow_chunks(reader, first_position):
        for chunk in copy(reader, first_position):
            time.sleep(0.05)
            yield chunk
            pathlib.Path(directory, "started").touch()  # the first chunk is in the builder: the merge is under way

    module._shard_chunks = slow_chunks
    shards = sorted(str(path) for path in pathlib.Path(directory).glob("part-*.beton"))
    merge(pathlib.Path(directory, "merged.beton"), shards)


def test_sigterm_during_a_merge_leaves_the_target_as_it_was_then_ends_the_process(tmp_path):
    samples = [(bytes(1000), i) for i in range(200)]
    write_shards(tmp_path, {"blob": BytesField(), "label": IntField()}, samples, [0, 100, 200])
    (tmp_path / "merged.beton").write_bytes(b"an older file")
    code = f"import sys, test_shards; test_shards.merge_slowly({str(tmp_path)!r})"
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.dirname(__file__), str(TESTS),
                                                                os.environ.get("PYTHONPATH", "")])}
    process = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, env=environment)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "started").exists() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert process.poll() is None and any(name.startswith("merged.beton.tmp-") for name in os.listdir(tmp_path))
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=60)
        assert process.returncode == -signal.SIGTERM, stderr.decode()
    finally:
        if process.poll() is None:
            process.kill()
    assert sorted(os.listdir(tmp_path)) == ["merged.beton", "part-00000-of-00002.beton", "part-00001-of-00002.beton",
                                            "started"]
    assert (tmp_path / "merged.beton").read_bytes() == b"an older file"


def test_merge_refuses_bad_page_sizes_and_no_shards(tmp_path):
    path = write_whole(tmp_path / "a.beton", MIXED_FIELDS, [mixed_sample(0)])
    with pytest.raises(ValueError, match="page_size"):
        merge(tmp_path / "merged.beton", [path], page_size=1000)
    with pytest.raises(ValueError, match="no shards"):
        merge(tmp_path / "merged.beton", [])


# ---- the commands ---------------------------------------------------------------------------------------------

def test_index_and_merge_commands(tmp_path):
    samples = [mixed_sample(i) for i in range(30)]
    whole = write_whole(tmp_path / "whole.beton", MIXED_FIELDS, samples, page_size=1024,
                        metadata={"name": "thirty"})
    write_shards(tmp_path, MIXED_FIELDS, samples, [0, 9, 9, 30], page_size=1024, metadata={"name": "thirty"})
    result = run_cli("index", "train.json", "part-*.beton", "--verify", cwd=tmp_path)  # the glob, quoted: beton's
    assert result.returncode == 0, result.stderr
    assert "wrote train.json: 3 shards, 30 samples (every page checked)" in result.stdout
    document = json.loads((tmp_path / "train.json").read_text())
    assert [shard["path"] for shard in document["shards"]] == [f"part-0000{k}-of-00003.beton" for k in range(3)]
    result = run_cli("merge", tmp_path / "merged.beton", tmp_path / "train.json")
    assert result.returncode == 0, result.stderr
    assert "30 samples from 3 shards" in result.stdout
    assert same_bytes(tmp_path / "merged.beton", whole)
    assert run_cli("merge", tmp_path / "set.beton", tmp_path / "train.json", "--metadata", '{"name": "set by hand"}',
               "--page-size", "4KiB").returncode == 0
    assert beton.Reader(tmp_path / "set.beton").metadata == {"name": "set by hand"}
    assert run_cli("merge", tmp_path / "bare.beton", tmp_path / "train.json", "--no-metadata").returncode == 0
    assert beton.Reader(tmp_path / "bare.beton").metadata == {}


def test_commands_read_shards_outside_a_manifests_directory_only_with_allow_outside(tmp_path):
    samples = [mixed_sample(i) for i in range(30)]
    whole = write_whole(tmp_path / "whole.beton", MIXED_FIELDS, samples, page_size=1024)
    write_shards(tmp_path, MIXED_FIELDS, samples, [0, 12, 30], page_size=1024)
    assert run_cli("index", "train.json", "part-*.beton", cwd=tmp_path).returncode == 0
    document = json.loads((tmp_path / "train.json").read_text())  # moved into a folder of its own, by hand
    for shard in document["shards"]:
        shard["path"] = "../" + shard["path"]
    (tmp_path / "lists").mkdir()
    (tmp_path / "lists" / "train.json").write_text(json.dumps(document))
    refused = run_cli("merge", tmp_path / "refused.beton", tmp_path / "lists" / "train.json")
    assert refused.returncode == 1 and "lies outside the manifest's directory" in refused.stderr
    assert not (tmp_path / "refused.beton").exists()
    trusted = run_cli("merge", tmp_path / "merged.beton", tmp_path / "lists" / "train.json", "--allow-outside")
    assert trusted.returncode == 0, trusted.stderr
    assert same_bytes(tmp_path / "merged.beton", whole)
    again = run_cli("index", tmp_path / "again.json", tmp_path / "lists" / "train.json", "--allow-outside")
    assert again.returncode == 0, again.stderr


def test_commands_report_errors_in_one_line(tmp_path):
    good = write_whole(tmp_path / "a.beton", MIXED_FIELDS, [mixed_sample(0)])
    bad = write_whole(tmp_path / "b.beton", {"label": IntField()}, [(1,)])
    result = run_cli("merge", tmp_path / "m.beton", good, bad)
    assert result.returncode == 1 and "lacks field 1, 'score'" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not os.path.exists(tmp_path / "m.beton")
    result = run_cli("index", tmp_path / "m.json", good, bad)
    assert result.returncode == 1 and "b.beton" in result.stderr and not os.path.exists(tmp_path / "m.json")
    result = run_cli("index", tmp_path / "m.manifest", good)
    assert result.returncode == 1 and "ends in .json" in result.stderr
    assert run_cli("merge", tmp_path / "m.beton", good, "--page-size", "1000").returncode == 2
    assert run_cli("merge", tmp_path / "m.beton", good, "--metadata", "{}", "--no-metadata").returncode == 2
    assert run_cli("merge", tmp_path / "m.beton", good, "--metadata", "[1]").returncode == 2
    result = run_cli("merge", tmp_path / "m.beton", str(tmp_path / "none-*.beton"))
    assert result.returncode == 1 and "no file matches" in result.stderr


def test_format_error_for_a_file_that_is_no_shard(tmp_path):
    text = tmp_path / "notes.beton"
    text.write_bytes(b"x" * 5000)
    with pytest.raises(FormatError, match="not a beton file"):
        merge(tmp_path / "m.beton", [text])
