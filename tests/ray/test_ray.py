"""beton on Ray Data, on a local Ray started here (once for the module): shards plus a manifest written by Ray
tasks, read back by a datasource. Skipped without the extra (pip install "beton[ray]")."""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import signal
import sys

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

ray = pytest.importorskip("ray", reason="the Ray extra is not installed (pip install 'beton[ray]')")
pytest.importorskip("ray.data", reason="the Ray extra is not installed (pip install 'beton[ray]')")

import ray.cloudpickle  # noqa: E402
import simplejpeg  # noqa: E402

from beton import DatasetWriter, Reader  # noqa: E402
from beton.dataset import dataset_manifest, read_manifest  # noqa: E402
from beton.dataset.union import open_dataset  # noqa: E402
from beton.errors import FieldError  # noqa: E402
from beton.fields import (BytesField, FloatField, IntField, JSONField, NDArrayField, RaggedArrayField,  # noqa: E402
                          RGBImageField, TorchTensorField)
from beton.ray import BetonDatasink, read_beton, write_dataset  # noqa: E402
from beton.ray.read import sample_ranges  # noqa: E402
from beton.storage.remote import RemoteOptions  # noqa: E402
from processes import moto_s3  # noqa: E402

# Ray's workers cannot import this file: the classes and functions they run are sent by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

#: One field of every kind beton ships, with the value of row k. Images are stored as JPEG or raw at random
#: (keyed by the writer's seed and the sample), so the byte-for-byte check covers encoding randomness too.
FIELDS = {
    "label": (IntField(), lambda k: k - 20),
    "weight": (FloatField(), lambda k: k / 7),
    "box": (NDArrayField(np.float32, (2, 3)), lambda k: np.full((2, 3), k / 2, np.float32)),
    "tensor": (TorchTensorField(torch.int16, (4,)), lambda k: np.arange(4, dtype=np.int16) * k),
    "tokens": (RaggedArrayField(np.int32), lambda k: np.arange(k % 5, dtype=np.int32)),
    "blob": (BytesField(), lambda k: bytes([k % 256, 0, 0])),
    "meta": (JSONField(), lambda k: {"id": k, "tags": ["a"] * (k % 3)}),
    "image": (RGBImageField(write_mode="proportion", compress_probability=0.5, jpeg_quality=90),
              lambda k: _photo(k)),
}
ROWS = 90


def _photo(k):
    y, x = np.mgrid[0 : 16 + k % 3, 0:24]
    return np.stack([(x * 9 + k) % 256, (y * 13) % 256, np.full_like(x, k * 5 % 256)], -1).astype(np.uint8)


def _items(count=ROWS):
    return [{name: make(k) for name, (_, make) in FIELDS.items()} for k in range(count)]


def _fields():
    return {name: field for name, (field, _) in FIELDS.items()}


@pytest.fixture(scope="module")
def local_ray():
    # ray.init installs handlers of its own (SIGTERM's, for one) that shutdown leaves behind: put the process's back,
    # so that later tests see the handlers a program has (beton's writer acts on SIGTERM only at its default)
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()
    for signum, handler in handlers.items():
        signal.signal(signum, handler)


def _dataset(blocks=3, count=ROWS):
    return ray.data.from_items(_items(count), override_num_blocks=blocks)


def _tuple(row):
    """A row as the writer takes it (a TorchTensorField's value as a tensor)."""
    return tuple(torch.from_numpy(row[name]) if name == "tensor" else row[name] for name in FIELDS)


def _same(read, written):
    if isinstance(written, np.ndarray):
        read = read.numpy() if isinstance(read, torch.Tensor) else read
        return np.array_equal(read, written) and np.asarray(read).dtype == written.dtype
    return read == written


def _files(directory):
    return {name: (directory / name).read_bytes() for name in sorted(os.listdir(directory))}


@pytest.fixture(scope="module")
def written(local_ray, tmp_path_factory):
    """The reference write: 90 rows of every field kind in 3 blocks, with a small page size (many pages)."""
    output = tmp_path_factory.mktemp("written")
    manifest = write_dataset(_dataset(), output, _fields(), page_size=1024, seed=7, metadata={"name": "kinds"})
    return output, manifest


def test_every_field_kind_round_trips_through_shards_and_the_datasource(written):
    output, manifest = written
    items = _items()
    assert read_manifest(output / "manifest.json") == manifest
    assert [shard.num_samples for shard in manifest.shards] == [30, 30, 30]
    stored_as_jpeg = 0
    for shard in manifest.shards:
        with Reader(shard.location) as reader:
            assert reader.metadata == {"name": "kinds"}
            stored_as_jpeg += int(np.count_nonzero(reader.data_table["image"]["mode"] == 1))
            for index in range(reader.num_samples):
                item = items[shard.start + index]
                for name, value in zip(FIELDS, reader[index]):
                    if name != "image":  # JPEG is lossy: compared below through the datasource
                        assert _same(value, item[name]), (name, shard.start + index)
    assert 0 < stored_as_jpeg < ROWS  # the random choice happened both ways
    rows = read_beton(output / "manifest.json", override_num_blocks=5).take_all()
    assert len(rows) == ROWS
    for k, (row, item) in enumerate(zip(rows, items)):
        assert list(row) == list(FIELDS)
        for name in FIELDS:
            if name == "meta":
                assert json.loads(row[name]) == item[name]
            elif name == "image":
                assert row[name].shape == item[name].shape
                assert np.abs(row[name].astype(int) - item[name]).mean() < 8, k
            else:
                assert _same(row[name], item[name]), (name, k)


def test_each_shard_is_byte_for_byte_datasetwriter_over_its_rows(written, tmp_path):
    output, manifest = written
    items = _items()
    for number, shard in enumerate(manifest.shards):
        assert os.path.basename(shard.location) == f"part-{number:06d}.beton"
        path = tmp_path / f"{number}.beton"
        DatasetWriter(path, _fields(), num_workers=0, progress=False, page_size=1024, seed=7,
                      metadata={"name": "kinds"}).from_iterable(_tuple(item) for item in items[shard.start:shard.end])
        assert path.read_bytes() == open(shard.location, "rb").read(), shard.location


def test_the_same_dataset_writes_the_same_shards_and_manifest(written, tmp_path):
    output, _ = written
    dataset = _dataset()
    write_dataset(dataset, tmp_path, _fields(), page_size=1024, seed=7, metadata={"name": "kinds"})
    assert _files(tmp_path) == _files(output)
    assert dataset.context.execution_options.preserve_order is False  # the caller's dataset is left as it was


class KillOnceIntField(IntField):
    """An IntField (stored as one) whose encoding kills its own process at sample ``at`` of the shard, the first
    time only: ``marker`` records that it happened and which files the output held then."""

    def __init__(self, marker, at):
        object.__setattr__(self, "marker", marker)
        object.__setattr__(self, "at", at)

    def encode(self, value, context):
        if context.sample == self.at and not os.path.exists(self.marker):
            with open(self.marker, "w") as file:
                json.dump(sorted(os.listdir(os.path.dirname(self.marker) + "/out")), file)
            os.kill(os.getpid(), signal.SIGKILL)
        return super().encode(value, context)


def test_a_task_killed_mid_write_is_retried_without_partial_or_duplicate_shards(local_ray, tmp_path):
    def labels(count):
        return ray.data.from_items([{"label": k} for k in range(count)], override_num_blocks=2)

    expected = write_dataset(labels(600), tmp_path / "expected", {"label": IntField()}, page_size=256)
    marker = tmp_path / "marker.json"
    (tmp_path / "out").mkdir()
    manifest = write_dataset(labels(600), tmp_path / "out", {"label": KillOnceIntField(str(marker), at=250)},
                             page_size=256, ray_remote_args={"max_retries": 2})
    at_the_kill = json.loads(marker.read_text())
    assert any(".tmp-" in name for name in at_the_kill)  # the killed task had a temporary shard written
    assert _files(tmp_path / "out") == _files(tmp_path / "expected")  # no temporary left, no shard twice
    assert manifest.to_json(tmp_path / "out" / "manifest.json") == expected.to_json(
        tmp_path / "expected" / "manifest.json")


def test_blocks_a_filter_emptied_are_skipped(local_ray, tmp_path):
    """A filter leaves empty blocks, which Ray may hold without columns: the write failed on them, blaming
    columns no block lacked."""
    kept = [k for k in range(600) if k // 50 % 3 != 1]  # every third block of 50 emptied
    dataset = ray.data.from_items([{"label": k} for k in range(600)], override_num_blocks=12).filter(
        lambda row: row["label"] // 50 % 3 != 1)
    manifest = write_dataset(dataset, tmp_path / "out", {"label": IntField()}, page_size=256)
    with open_dataset(str(tmp_path / "out" / "manifest.json")) as union:
        assert [union[i][0] for i in range(len(union))] == kept
    assert sum(shard.num_samples for shard in manifest.shards) == len(kept)


def test_fields_and_columns_are_checked_before_any_task_writes(local_ray, tmp_path):
    with pytest.raises(FieldError, match="page_size"):
        BetonDatasink(tmp_path, _fields(), page_size=1000)
    renamed = _dataset().rename_columns({"label": "class"})
    with pytest.raises(FieldError, match=r"no column for field\(s\) \['label'\].*'class'.* have no field"):
        write_dataset(renamed, tmp_path / "out", _fields())
    assert not (tmp_path / "out").exists()


def test_an_output_holding_another_write_is_refused_unless_overwrite(written, tmp_path):
    output, _ = written
    small = ray.data.from_items([{"label": 1}], override_num_blocks=1)
    with pytest.raises(Exception, match="already holds manifest.json, manifest.tables, part-000000.beton"):
        write_dataset(small, output, {"label": IntField()})
    target = tmp_path / "again"
    write_dataset(_dataset(), target, _fields(), page_size=1024)
    sink = BetonDatasink(target, {"label": IntField()}, overwrite=True)
    small.write_datasink(sink)  # the datasink as Ray users write it
    assert sorted(os.listdir(target)) == ["manifest.json", "manifest.tables", "part-000000.beton"]
    assert sink.manifest == read_manifest(target / "manifest.json")
    assert sink.manifest.num_samples == 1


#: JSON values Arrow cannot hold exactly when Ray merges them into one type: dicts with other keys (a key a row
#: lacks comes back as None), an integer beside a missing one (1 comes back as 1.0, None as NaN), an integer
#: beside a float (1 comes back as 1.0), at the top, in a dict or in a list.
MERGED_JSON = {
    "uneven_dicts": [{"meta": {"a": 1}}, {"meta": {"b": [1, 2]}}, {"meta": {"a": None, "c": "x"}}],
    "missing_number": [{"meta": 1}, {"meta": None}],
    "int_beside_float": [{"meta": 1}, {"meta": 2.5}],
    "int_beside_float_in_a_dict": [{"meta": {"a": 1}}, {"meta": {"a": 1.5}}],
    "int_beside_float_in_a_list": [{"meta": [1, 2.5]}],
}


def _stored(output):
    """Every sample of the shards a write put in ``output``, as tuples, in the manifest's order."""
    rows = []
    for shard in read_manifest(output / "manifest.json").shards:
        with Reader(shard.location) as reader:
            rows += [reader[i] for i in range(reader.num_samples)]
    return rows


@pytest.mark.parametrize("items", list(MERGED_JSON.values()), ids=list(MERGED_JSON))
def test_json_values_arrow_would_change_are_refused_and_stored_exactly_as_text(local_ray, tmp_path, items):
    fields = {"meta": JSONField()}
    with pytest.raises(Exception, match=r"(?s)field 'meta'.*with a (null|whole-number float).*json_text=True"):
        write_dataset(ray.data.from_items(items, override_num_blocks=1), tmp_path / "values", fields)
    as_text = ray.data.from_items([{"meta": json.dumps(item["meta"])} for item in items], override_num_blocks=1)
    write_dataset(as_text, tmp_path / "text", fields, json_text=True)
    assert _stored(tmp_path / "text") == [(item["meta"],) for item in items]
    write_dataset(as_text, tmp_path / "strings", fields)  # without json_text, strings are JSON strings
    assert _stored(tmp_path / "strings") == [(json.dumps(item["meta"]),) for item in items]


def test_json_values_ray_keeps_as_python_objects_or_arrow_holds_unmerged_are_stored_exactly(local_ray, tmp_path):
    for name, items in {
        "objects": [{"meta": {"a": 1}}, {"meta": [1, "two", None]}, {"meta": 7}],  # no one Arrow type
        "same_keys": [{"meta": {"a": 1, "b": [0.5, 2.25]}}, {"meta": {"a": 2, "b": []}}],  # one type, nothing merged
    }.items():
        write_dataset(ray.data.from_items(items, override_num_blocks=1), tmp_path / name, {"meta": JSONField()})
        assert json.dumps(_stored(tmp_path / name)) == json.dumps([(item["meta"],) for item in items])


def test_what_the_datasource_reads_writes_back_the_same_with_json_text(written, tmp_path):
    output, _ = written
    fields = {"label": IntField(), "meta": JSONField()}
    read = read_beton(output / "manifest.json", columns=list(fields))
    write_dataset(read, tmp_path / "copy", fields, json_text=True)
    assert _stored(tmp_path / "copy") == [(k - 20, {"id": k, "tags": ["a"] * (k % 3)}) for k in range(ROWS)]
    with pytest.raises(Exception, match=r"(?s)field 'meta'.*sample 0.*not JSON text"):
        write_dataset(ray.data.from_items([{"meta": "hello"}]), tmp_path / "bad", {"meta": JSONField()},
                      json_text=True)
    with pytest.raises(Exception, match=r"(?s)field 'meta'.*missing \(a null\): give the text 'null'"):
        write_dataset(ray.data.from_items([{"meta": "1"}, {"meta": None}]), tmp_path / "null", {"meta": JSONField()},
                      json_text=True)


def test_the_datasource_reads_files_and_globs_in_parallel_ranges_in_order(written):
    output, _ = written
    rows = read_beton(str(output / "part-*.beton"), columns=["label", "blob"], override_num_blocks=7).take_all()
    assert [row["label"] for row in rows] == [k - 20 for k in range(ROWS)]
    assert all(list(row) == ["label", "blob"] for row in rows)
    one = read_beton(str(output / "part-000001.beton"), columns=["tokens"]).take_all()
    assert [len(row["tokens"]) for row in one] == [k % 5 for k in range(30, 60)]


def test_images_as_jpeg_bytes_or_a_clear_error_for_images_stored_raw(local_ray, tmp_path):
    photos = ray.data.from_items([{"image": _photo(k)} for k in range(6)], override_num_blocks=1)
    write_dataset(photos, tmp_path / "jpeg", {"image": RGBImageField(write_mode="jpg")})
    rows = read_beton(tmp_path / "jpeg" / "manifest.json", images="jpeg").take_all()
    decoded = read_beton(tmp_path / "jpeg" / "manifest.json").take_all()
    for row, pixels in zip(rows, decoded):
        assert np.array_equal(simplejpeg.decode_jpeg(row["image"]), pixels["image"])
    write_dataset(photos, tmp_path / "raw", {"image": RGBImageField(write_mode="raw")})
    with pytest.raises(Exception, match="sample 0.*stored as raw, not as a JPEG"):
        read_beton(tmp_path / "raw" / "manifest.json", images="jpeg").take_all()


@given(st.lists(st.integers(0, 50), min_size=1, max_size=8), st.integers(1, 40))
def test_sample_ranges_cover_every_sample_in_order_within_shards(counts, parallelism):
    ranges = sample_ranges(counts, parallelism)
    assert [(number, index) for number, start, end in ranges for index in range(start, end)] == [
        (number, index) for number, count in enumerate(counts) for index in range(count)]
    assert all(start < end for _, start, end in ranges)
    assert len(ranges) <= parallelism + len(counts)


def test_the_manifest_pins_a_tables_file_so_the_dataset_opens_without_its_shards(written):
    output, manifest = written
    tables = output / "manifest.tables"
    assert manifest.tables is not None and manifest.tables.location == str(tables)
    assert hashlib.sha256(tables.read_bytes()).hexdigest() == manifest.tables.sha256
    last = manifest.shards[2].location
    os.rename(last, last + ".away")
    try:
        with open_dataset(str(output / "manifest.json")) as opened:  # the manifest and its tables file only
            assert opened.num_samples == 90 and opened.page_size == 1024
    finally:
        os.rename(last + ".away", last)


def test_the_manifest_opens_in_a_loader(written):
    from beton import Loader

    output, manifest = written
    with Loader(str(output / "manifest.json"), batch_size=32, num_workers=0, pipelines={
            name: None for name in FIELDS if name != "label"}) as loader:
        labels = torch.cat([batch[0] for batch in loader]).tolist()
    assert labels == [k - 20 for k in range(ROWS)]
    assert dataset_manifest(str(output / "manifest.json")).num_samples == manifest.num_samples


def test_shards_and_manifest_go_to_object_storage_and_read_back_from_it(written):
    if "remote" not in inspect.signature(DatasetWriter).parameters:
        pytest.skip("DatasetWriter does not write to URLs on this branch (issue 29, item 0)")
    output, _ = written
    with moto_s3() as options:
        import fsspec

        fsspec.filesystem("s3", skip_instance_cache=True, **options).mkdir("bucket")
        remote = RemoteOptions(storage_options=options)
        manifest = write_dataset(_dataset(), "s3://bucket/train", _fields(), page_size=1024, seed=7,
                                 metadata={"name": "kinds"}, remote=remote)
        store = fsspec.filesystem("s3", skip_instance_cache=True, **options)
        assert {path.rpartition("/")[2]: store.cat(path) for path in store.ls("bucket/train")} == _files(output)
        assert manifest.source == "s3://bucket/train/manifest.json"
        rows = read_beton(manifest.source, remote=remote, columns=["label"]).take_all()
        assert [row["label"] for row in rows] == [k - 20 for k in range(ROWS)]
        # a second write to the prefix: refused, as for a directory (a smaller one left the larger one's last
        # shards, which a glob of the prefix read with the new ones); with overwrite, only the new write is left
        small = ray.data.from_items([{"label": 1}], override_num_blocks=1)
        with pytest.raises(Exception, match="already holds manifest.json, manifest.tables, part-000000.beton"):
            write_dataset(small, "s3://bucket/train", {"label": IntField()}, remote=remote)
        write_dataset(small, "s3://bucket/train", {"label": IntField()}, remote=remote, overwrite=True)
        store = fsspec.filesystem("s3", skip_instance_cache=True, **options)
        assert sorted(path.rpartition("/")[2] for path in store.ls("bucket/train")) == [
            "manifest.json", "manifest.tables", "part-000000.beton"]
