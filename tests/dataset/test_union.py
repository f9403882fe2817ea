"""Many files as one dataset: ``Loader([a, b, c])``, ``Loader("dir/part-*.beton")`` and ``Loader("dataset.json")``.

Every check compares with one file written from the same samples in the same order: the union must give exactly
its batches (every order, augmentations, ``indices=``, ranks, resume), and refuse clearly what does not fit.

Page-aware orders (QUASI_RANDOM, BALANCED) shuffle pages, so they give one file's batches only where the shards'
pages are that file's pages: where every shard boundary falls on a page boundary of the single file (``aligned``
below: 192-byte samples, 5 to a 1 KiB page, shards of multiples of 5). Elsewhere they keep their own guarantees
(a permutation, each page read once per epoch), checked on ``unaligned``.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import beton
from beton import Loader, OrderOption
from beton.decoders import IntDecoder, NDArrayDecoder, RaggedDecoder, SimpleRGBImageDecoder
from beton.errors import BetonError, FormatError, ShardError, ShardNotFoundError
from beton.fields import FloatField, IntField, NDArrayField, RaggedArrayField, RGBImageField
from beton.memory.os_cache import OSCacheLayer, ShardMapsLayer
from beton.memory.process_cache import ProcessCacheLayer
from beton.dataset import Manifest, dataset_manifest, index
from beton.dataset.union import ShardedDataset, open_dataset
from beton.transforms import ImageMixup, LabelMixup, ToTensor
from beton.transforms.flip import RandomHorizontalFlip

from conftest import ANY_FILE_ORDERS, IMAGE_FIELDS, ListDataset, small_image
from resume_conformance import check_resume

PAGE_SIZE = 1024
AUGMENTED = {"image": [NDArrayDecoder(), RandomHorizontalFlip(), ImageMixup(0.5)],  # per-sample and per-batch draws
             "label": [IntDecoder(), LabelMixup(0.5), ToTensor()]}


def write_split(directory, fields, samples, bounds, page_size=PAGE_SIZE, **options):
    """One file of every sample (``whole.beton``) and the shards ``part-0000k.beton`` holding ``samples[bounds[k]:
    bounds[k + 1]]``, written as shards of the same dataset (randomness keyed by the sample's place in it); a
    manifest ``dataset.json`` of the shards. Returns (whole, [shards], manifest)."""
    directory = os.fspath(directory)
    options = {"num_workers": 0, "progress": False, "page_size": page_size, **options}
    whole = os.path.join(directory, "whole.beton")
    beton.DatasetWriter(whole, fields, **options).from_indexed_dataset(ListDataset(samples))
    parts = []
    for k, (start, end) in enumerate(zip(bounds[:-1], bounds[1:])):
        parts.append(os.path.join(directory, f"part-{k:05d}.beton"))
        beton.DatasetWriter(parts[-1], fields, **options).from_indexed_dataset(ListDataset(samples), start=start,
                                                                               end=end)
    manifest = os.path.join(directory, "dataset.json")
    index(manifest, parts)
    return whole, parts, manifest


def flat(value):
    """A batch's outputs as bytes, nested tuples (padded batches) included; copied at once."""
    if isinstance(value, torch.Tensor):
        return (tuple(value.shape), str(value.dtype), value.numpy().tobytes())
    if isinstance(value, np.ndarray):
        return (value.shape, str(value.dtype), value.tobytes())
    if isinstance(value, (tuple, list)):
        return tuple(flat(item) for item in value)
    return repr(value)


def epochs(source, count=2, **options):
    options = {"batch_size": 16, "num_workers": 2, "seed": 7, **options}
    with Loader(source, **options) as loader:
        return [[flat(batch) for batch in loader] for _ in range(count)]


def labels(source, **options):
    options = {"batch_size": 16, "num_workers": 2, "seed": 7, "pipelines": {"image": None}, **options}
    with Loader(source, **options) as loader:
        return [np.concatenate([batch[0].numpy() for batch in loader]) for _ in range(2)]


@pytest.fixture(scope="module")
def aligned(tmp_path_factory):
    """200 samples in 4 shards of 50: 5 samples to a page, so every shard boundary is a page boundary."""
    return write_split(tmp_path_factory.mktemp("aligned"), IMAGE_FIELDS, [(small_image(i), i) for i in range(200)],
                       [0, 50, 100, 150, 200])


@pytest.fixture(scope="module")
def unaligned(tmp_path_factory):
    """203 samples in shards of 61, 1, 0 (an empty shard), 78 and 63 samples: boundaries inside pages."""
    return write_split(tmp_path_factory.mktemp("unaligned"), IMAGE_FIELDS, [(small_image(i), i) for i in range(203)],
                       [0, 61, 62, 62, 140, 203])


def forms(whole, parts, manifest):
    """The three ways to name the shards: a list, a glob, a manifest file."""
    return {"list": parts, "glob": os.path.join(os.path.dirname(whole), "part-*.beton"), "manifest": manifest}


# ---- the batches of one file -------------------------------------------------------------------------------

@pytest.mark.parametrize("order", ANY_FILE_ORDERS)
@pytest.mark.parametrize("form", ["list", "glob", "manifest"])
def test_shards_give_exactly_the_batches_of_one_file(aligned, order, form):
    whole, parts, manifest = aligned
    expected = epochs(whole, order=order, pipelines=AUGMENTED)
    assert epochs(forms(*aligned)[form], order=order, pipelines=AUGMENTED) == expected


@pytest.mark.parametrize("order", [OrderOption.SEQUENTIAL, OrderOption.RANDOM])
def test_page_blind_orders_give_one_files_batches_whatever_the_boundaries(unaligned, order):
    whole, parts, _ = unaligned
    assert epochs(parts, order=order, pipelines=AUGMENTED, drop_last=True) == \
        epochs(whole, order=order, pipelines=AUGMENTED, drop_last=True)


def test_quasi_random_over_unaligned_shards_is_a_deterministic_permutation_reading_each_page_once(unaligned):
    whole, parts, _ = unaligned
    first, second = labels(parts, order=OrderOption.QUASI_RANDOM), labels(parts, order=OrderOption.QUASI_RANDOM)
    for epoch in range(2):
        assert sorted(first[epoch].tolist()) == list(range(203))
        np.testing.assert_array_equal(first[epoch], second[epoch])
    assert not np.array_equal(first[0], first[1])
    with Loader(parts, batch_size=16, num_workers=2, seed=7, order=OrderOption.QUASI_RANDOM) as loader:
        for _ in loader:
            pass
        heap_bytes = int(np.sum(loader.reader.heap_ends - loader.reader.shifts - loader.reader.heap_offset))
        assert loader.memory_counters == {"pages_read": loader.reader.num_pages, "bytes_read": heap_bytes}


def test_bucketed_order_over_ragged_shards(tmp_path):
    rng = np.random.default_rng(0)
    samples = [(rng.integers(0, 1000, rng.integers(1, 60)).astype(np.int32),) for _ in range(150)]
    whole, parts, manifest = write_split(tmp_path, {"tokens": RaggedArrayField(np.int32, (None,))}, samples,
                                         [0, 37, 90, 150])
    pipelines = {"tokens": [RaggedDecoder(max_length=24, window="random"), ToTensor()]}
    options = dict(order=OrderOption.BUCKETED, pipelines=pipelines, batch_size=8)
    assert epochs(manifest, **options) == epochs(whole, **options)


def test_balanced_order_over_shards_of_raw_and_jpeg_images(tmp_path):
    # noise images of 24x24: raw 1728 bytes, JPEG about 1.2-1.7 KB, so every payload fills more than half of a
    # 2 KiB page and each sample has a page of its own, in the single file as in the shards
    rng = np.random.default_rng(1)
    samples = [(rng.integers(0, 256, (24, 24, 3), dtype=np.uint8), i) for i in range(60)]
    fields = {"image": RGBImageField(write_mode="proportion", compress_probability=0.5, jpeg_quality=95),
              "label": IntField()}
    whole, parts, manifest = write_split(tmp_path, fields, samples, [0, 17, 41, 60], page_size=2048)
    with beton.Reader(whole) as one, open_dataset(parts) as union:
        sizes = one.allocation_table[:, 0]["size"]
        assert (sizes > 1024).all() and (sizes <= 2048).all(), "the premise: one page per sample"
        modes = one.data_table["image"]["mode"]
        assert 0 < (modes == 0).sum() < 60, "the premise: raw and JPEG images mixed"
        np.testing.assert_array_equal(one.allocation_table[:, 0]["offset"], union.allocation_table[:, 0]["offset"])
    options = dict(order=OrderOption.BALANCED, batch_size=8,
                   pipelines={"image": [SimpleRGBImageDecoder(), ToTensor()], "label": [IntDecoder(), ToTensor()]})
    assert epochs(manifest, **options) == epochs(whole, **options)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cuts=st.lists(st.integers(0, 40), max_size=4), order=st.sampled_from([OrderOption.SEQUENTIAL,
                                                                              OrderOption.RANDOM]),
       subset=st.one_of(st.none(), st.lists(st.integers(0, 39), max_size=30)), seed=st.integers(0, 2**32))
def test_any_split_gives_the_batches_of_one_file(cuts, order, subset, seed):
    samples = [(small_image(i), i) for i in range(40)]
    with tempfile.TemporaryDirectory() as directory:
        whole, parts, manifest = write_split(directory, IMAGE_FIELDS, samples, [0, *sorted(cuts), 40], page_size=256)
        options = dict(order=order, indices=subset, seed=seed, batch_size=6, num_workers=1, pipelines=AUGMENTED)
        assert epochs(manifest, **options) == epochs(whole, **options)


# ---- indices, ranks, resume ------------------------------------------------------------------------------------

@pytest.mark.parametrize("order", ANY_FILE_ORDERS)
def test_indices_select_global_samples(aligned, order):
    whole, parts, _ = aligned
    indices = np.random.default_rng(3).choice(200, 77, replace=False)  # from every shard, in any order
    assert epochs(parts, order=order, indices=indices) == epochs(whole, order=order, indices=indices)
    got = labels(parts, order=order, indices=indices)
    assert sorted(got[0].tolist()) == sorted(indices.tolist())


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("order", ANY_FILE_ORDERS)
def test_ranks_partition_the_union_as_they_partition_one_file(aligned, order, world_size):
    whole, parts, _ = aligned
    indices = np.arange(198)  # divisible by 2 and 3: no padding, so the ranks' shares are a partition
    shares = []
    for rank in range(world_size):
        options = dict(order=order, indices=indices, rank=rank, world_size=world_size)
        assert epochs(parts, **options) == epochs(whole, **options)
        shares.append(labels(parts, **options))
    for epoch in range(2):
        everything = np.concatenate([share[epoch] for share in shares])
        assert sorted(everything.tolist()) == list(range(198))


@pytest.mark.parametrize("order", ANY_FILE_ORDERS)
@pytest.mark.parametrize("midpoint", [0, 4])
def test_resume_over_the_union_is_exact(aligned, order, midpoint):
    _, _, manifest = aligned
    check_resume(lambda: Loader(manifest, batch_size=16, num_workers=2, order=order, seed=11, pipelines=AUGMENTED,
                                rank=1, world_size=2), midpoint)


def test_a_resumed_union_continues_where_one_file_would(aligned):
    whole, parts, _ = aligned
    with Loader(whole, batch_size=16, seed=5, order=OrderOption.RANDOM, pipelines=AUGMENTED) as one:
        reference = [[flat(batch) for batch in one] for _ in range(2)]
    with Loader(parts, batch_size=16, seed=5, order=OrderOption.RANDOM, pipelines=AUGMENTED) as union:
        iterator = iter(union)
        for _ in range(3):
            next(iterator)
        state = union.state_dict()
    with Loader(parts, batch_size=16, seed=None, order=OrderOption.RANDOM, pipelines=AUGMENTED) as resumed:
        resumed.load_state_dict(state)  # takes the state's seed
        assert [flat(batch) for batch in resumed] == reference[0][3:]
        assert [flat(batch) for batch in resumed] == reference[1]


# ---- the dataset as a whole ------------------------------------------------------------------------------------

def test_one_path_is_one_file_and_several_go_through_the_process_cache_unless_asked_otherwise(aligned):
    whole, parts, manifest = aligned
    with Loader(whole, batch_size=16) as loader:
        assert type(loader.reader) is beton.Reader and isinstance(loader.memory, OSCacheLayer)
    for source in ([whole], parts, manifest):
        with Loader(source, batch_size=16) as loader:
            assert isinstance(loader.reader, ShardedDataset) and isinstance(loader.memory, ProcessCacheLayer)
    for source in (parts, manifest):  # asked for, the OS cache maps each shard and copies a batch's payloads out
        with Loader(source, batch_size=16, os_cache=True) as loader:
            assert isinstance(loader.memory, ShardMapsLayer)


def test_samples_payloads_filter_and_metadata_use_global_indices(tmp_path):
    samples = [(small_image(i), i) for i in range(30)]
    whole, parts, manifest = write_split(tmp_path, IMAGE_FIELDS, samples, [0, 11, 30], metadata={"name": "squares"})
    with beton.Reader(whole) as one, Loader(manifest, batch_size=4) as union:
        dataset = union.reader
        assert len(dataset) == 30 and dataset.field_names == one.field_names
        for sample in (0, 10, 11, 29, -1):
            np.testing.assert_array_equal(dataset[sample][0], one[sample][0])
            assert dataset[sample][1] == one[sample][1]
            np.testing.assert_array_equal(dataset.payload(sample, "image"), one.payload(sample, "image"))
        with pytest.raises(IndexError):
            dataset[30]
        assert union.metadata == {"name": "squares"}
        kept = union.filter("label", lambda label: label % 4 == 1)
        assert [int(label) for batch in kept for label in batch[1]] == [i for i in range(30) if i % 4 == 1]
        kept.close()
        assert manifest in repr(union)


@pytest.mark.parametrize("os_cache", [False, True])
def test_files_changed_under_a_running_union_raise_naming_the_shard(tmp_path, os_cache):
    whole, parts, _ = write_split(tmp_path, IMAGE_FIELDS, [(small_image(i), i) for i in range(100)], [0, 50, 100])
    with Loader(parts, batch_size=10, num_workers=1, batches_ahead=1, os_cache=os_cache) as loader:
        iterator = iter(loader)
        next(iterator)
        with open(parts[1], "r+b") as file:
            file.truncate(os.path.getsize(parts[1]) - 100)
        with pytest.raises(FormatError) as raised:
            for _ in iterator:
                pass
        assert raised.value.path == parts[1]


# ---- URLs ------------------------------------------------------------------------------------------------------

def test_shards_and_manifests_at_urls(aligned, tmp_path):
    pytest.importorskip("fsspec", reason="remote reads need fsspec (the 'remote' extra)")
    pytest.importorskip("aiohttp", reason="fsspec reads http:// through aiohttp (the 'remote' extra)")
    from beton import RemoteOptions

    from range_server import RangeServer

    whole, parts, _ = aligned
    remote = RemoteOptions(retries=2, backoff=0.001, timeout=5.0, cache_dir=tmp_path / "cache")
    expected = epochs(whole, order=OrderOption.QUASI_RANDOM, pipelines=AUGMENTED)
    with RangeServer(os.path.dirname(whole)) as server:
        urls = [server.url(os.path.basename(part)) for part in parts]
        mixed = [urls[0], parts[1], *urls[2:]]  # URLs and paths in one list
        beside = server.url("dataset.json")  # the manifest beside its shards: relative paths resolve against it
        listing = tmp_path / "remote.json"  # a local manifest listing the shards by URL
        dataset_manifest(urls).write(listing)
        assert all(entry["path"].startswith("http://127.0.0.1")
                   for entry in json.loads(listing.read_text())["shards"])
        with pytest.raises(FormatError, match="outside the manifest's directory"):  # URLs are not in its folder
            dataset_manifest(str(listing))
        trusted = dataset_manifest(str(listing), allow_outside=True, remote=remote)  # the opt-in
        for source in (urls, mixed, beside, trusted):
            got = epochs(source, order=OrderOption.QUASI_RANDOM, pipelines=AUGMENTED, remote=remote)
            assert got == expected, source
        assert server.requests > 0


# ---- errors ----------------------------------------------------------------------------------------------------

def test_shards_whose_fields_differ_are_refused_naming_the_shard_and_the_first_difference(aligned, tmp_path):
    whole, parts, _ = aligned
    other = str(tmp_path / "other.beton")
    beton.DatasetWriter(other, {"image": NDArrayField(np.uint8, (8, 8, 3)), "label": FloatField()}, num_workers=0,
                        progress=False, page_size=PAGE_SIZE).from_indexed_dataset(
        ListDataset([(small_image(i), float(i)) for i in range(5)]))
    with pytest.raises(ShardError, match="field 'label' is a beton.FloatField, expected a beton.IntField") as raised:
        Loader([parts[0], other], batch_size=4)
    assert raised.value.path == other


def test_shards_with_other_page_sizes_are_refused_naming_the_shard(aligned, tmp_path):
    whole, parts, _ = aligned
    other = str(tmp_path / "pages.beton")
    beton.DatasetWriter(other, IMAGE_FIELDS, num_workers=0, progress=False, page_size=2048).from_indexed_dataset(
        ListDataset([(small_image(i), i) for i in range(5)]))
    with pytest.raises(ShardError, match="shard 2 has pages of 2048 bytes, .* of 1024") as raised:
        Loader([parts[0], parts[1], other], batch_size=4)
    assert raised.value.path == other


@pytest.fixture
def copied(aligned, tmp_path):
    """The aligned shards and their manifest in a directory of the test's own (to change them), the manifest
    without its tables file: every shard's tables are read on opening, where these checks run (with a tables file
    they run as each shard is first opened: tests/dataset/test_tables_file.py)."""
    whole, parts, manifest = aligned
    for path in parts:
        shutil.copy(path, tmp_path)
    document = json.loads(open(manifest).read())
    del document["tables"]
    with open(tmp_path / "dataset.json", "w") as file:
        json.dump(document, file)
    return [str(tmp_path / os.path.basename(part)) for part in parts], str(tmp_path / "dataset.json")


def test_a_shard_that_is_not_the_file_its_manifest_lists_is_refused(copied):
    parts, manifest = copied
    beton.DatasetWriter(parts[2], IMAGE_FIELDS, num_workers=0, progress=False, page_size=PAGE_SIZE) \
        .from_indexed_dataset(ListDataset([(small_image(i + 1), i) for i in range(50)]))  # same count, other data
    with pytest.raises(ShardError, match="shard 2 is not the file the manifest lists") as raised:
        Loader(manifest, batch_size=4)
    assert raised.value.path == parts[2]


def test_a_shard_whose_count_is_not_the_manifests_is_refused(copied):
    parts, manifest = copied
    document = json.loads(open(manifest).read())
    document["shards"][1]["num_samples"] -= 1
    document["num_samples"] -= 1
    with open(manifest, "w") as file:
        json.dump(document, file)
    with pytest.raises(ShardError, match="shard 1 holds 50 samples, the manifest says 49") as raised:
        Loader(manifest, batch_size=4)
    assert raised.value.path == parts[1]


def test_missing_shards_empty_lists_and_empty_globs_are_clear_errors(copied, tmp_path):
    parts, manifest = copied
    with pytest.raises(ShardError, match="no shards given"):
        Loader([], batch_size=4)
    with pytest.raises(TypeError, match="got bytes b'a.beton': decode it first"):  # was "got int", of its bytes
        Loader(b"a.beton", batch_size=4)
    with pytest.raises(TypeError, match="a dataset is named by paths, URLs, globs or manifest files, got int"):
        Loader([parts[0], 3], batch_size=4)
    with pytest.raises(ShardNotFoundError, match="no file matches") as raised:
        Loader(str(tmp_path / "nothing-*.beton"), batch_size=4)
    assert raised.value.path == str(tmp_path / "nothing-*.beton")
    os.unlink(parts[3])
    for source in (manifest, parts):
        with pytest.raises(ShardNotFoundError) as raised:
            Loader(source, batch_size=4)
        assert raised.value.path == parts[3] and isinstance(raised.value, (BetonError, FileNotFoundError))


def test_metadata_that_differs_between_shards_is_named_when_asked_for(tmp_path):
    samples = [(small_image(i), i) for i in range(10)]
    parts = []
    for k, name in enumerate(["a", "b"]):
        parts.append(str(tmp_path / f"part-{k}.beton"))
        beton.DatasetWriter(parts[-1], IMAGE_FIELDS, num_workers=0, progress=False, page_size=PAGE_SIZE,
                            metadata={"name": name}).from_indexed_dataset(ListDataset(samples), start=5 * k,
                                                                          end=5 * k + 5)
    with Loader(parts, batch_size=4) as loader:
        assert len(list(loader)) == 3  # the batches do not need the metadata
        with pytest.raises(ShardError, match="shard 1's file-level metadata differs from shard 0's at key 'name'"):
            loader.metadata


def test_a_manifest_object_is_a_dataset_too(aligned):
    whole, parts, manifest = aligned
    assert isinstance(dataset_manifest(manifest), Manifest)
    assert epochs(dataset_manifest(parts), order=OrderOption.RANDOM) == epochs(whole, order=OrderOption.RANDOM)


def test_remote_shards_are_fetched_ahead_in_runs_of_pages(aligned):
    pytest.importorskip("fsspec", reason="remote reads need fsspec (the 'remote' extra)")
    pytest.importorskip("aiohttp", reason="fsspec reads http:// through aiohttp (the 'remote' extra)")
    from beton import RemoteOptions

    from range_server import RangeServer

    whole, parts, _ = aligned
    remote = RemoteOptions(retries=2, backoff=0.001, timeout=5.0)
    with RangeServer(os.path.dirname(whole)) as server:
        urls = [server.url(os.path.basename(part)) for part in parts]
        with Loader(urls, batch_size=16, num_workers=2, seed=7, remote=remote) as loader:
            opened = server.requests  # headers and tables
            for _ in loader:
                pass
            pages = loader.reader.num_pages
            assert loader.memory_counters["pages_read"] == pages == 40
            # Each shard is opened again when the epoch reaches it (its headers and tables fetched again: what
            # opening cost). SEQUENTIAL: each shard's 10 pages are planned ahead; the first 8 of each plan come one
            # per request (RemotePages grows its requests), the last two in one run. Unplanned, every page is one
            # request.
            assert server.requests - 2 * opened <= 9 * len(urls) < pages


def test_a_remote_shard_replaced_between_epochs_raises_naming_it_before_its_bytes_are_used(tmp_path):
    pytest.importorskip("fsspec", reason="remote reads need fsspec (the 'remote' extra)")
    pytest.importorskip("aiohttp", reason="fsspec reads http:// through aiohttp (the 'remote' extra)")
    from beton import RemoteOptions

    from range_server import RangeServer

    samples = [(small_image(i), i) for i in range(100)]
    whole, parts, _ = write_split(tmp_path, IMAGE_FIELDS, samples, [0, 50, 100])
    remote = RemoteOptions(retries=1, backoff=0.001, timeout=5.0)
    with RangeServer(tmp_path) as server:
        urls = [server.url(os.path.basename(part)) for part in parts]
        with Loader(urls, batch_size=10, num_workers=1, remote=remote) as loader:
            assert [int(label) for _, labels in loader for label in labels] == list(range(100))
            # the second shard rewritten with other labels (same size: only its version markers tell)
            os.makedirs(tmp_path / "new")
            _, replaced, _ = write_split(tmp_path / "new", IMAGE_FIELDS, [(small_image(i), i + 1) for i in range(100)],
                                         [0, 50, 100])
            os.replace(replaced[1], parts[1])
            labels_seen = []
            with pytest.raises(FormatError, match="changed since it was opened") as raised:
                for _, labels in loader:
                    labels_seen += [int(label) for label in labels]
            assert raised.value.path == urls[1]
            assert labels_seen == []  # the epoch's first batch already raises, though it reads only the first shard
