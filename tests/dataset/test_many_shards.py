"""Unions of many shards: shards are opened when an epoch reaches them and closed after, so a dataset of more
files than the process may open reads exactly, holds a bounded number of descriptors, and releases them all on
``close()``; a shard that goes away or changes while the epoch runs is a BetonError naming it.

Shards are copies of a few distinct files (writing hundreds of files costs seconds; copying them, milliseconds): a
number of templates that shares no factor with the ring of open shards, so a shard read in the place of another
shows in the batches.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zlib

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import beton
from beton import Loader, OrderOption
from beton.dataset.manifest import Manifest, field_specs, header_digest
from beton.storage.format import ALLOCATION_DTYPE, FIELD_RECORD_DTYPE, HEADER_DTYPE, HEAP_OFFSET
from beton.dataset import index
from beton.dataset.shards import dataset_manifest
from beton.dataset.union import DEFAULT_OPEN_SHARDS, ShardedDataset, open_dataset, open_page_source
from beton.errors import BetonError, ShardError, ShardNotFoundError
from beton.fields import BytesField, IntField, NDArrayField
from beton.memory import OSCache, ProcessCache

from conftest import TESTS, write
from forgery import resign_digests

TEMPLATES = 47
FIELDS = {"values": NDArrayField(np.dtype("<u2"), (4,)), "label": IntField()}

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts descriptors in /proc/self/fd")


def template_samples(template):
    return [(np.arange(4, dtype="<u2") + 10 * template + sample, 2 * template + sample) for sample in range(2)]


def make_shards(directory, count):
    """``count`` shards of 2 samples (shard k a copy of template k % TEMPLATES) and one file of the same samples
    in the same order. Returns (whole, [shards])."""
    directory = os.fspath(directory)
    templates = [write(os.path.join(directory, f"template-{t}.beton"), FIELDS, template_samples(t))
                 for t in range(TEMPLATES)]
    parts = []
    for k in range(count):
        parts.append(os.path.join(directory, f"part-{k:05d}.beton"))
        shutil.copyfile(templates[k % TEMPLATES], parts[-1])
    whole = write(os.path.join(directory, "whole.beton"), FIELDS,
                  [sample for k in range(count) for sample in template_samples(k % TEMPLATES)])
    return whole, parts


def descriptors() -> set[tuple[str, str]]:
    """This process's open descriptors, each with what it refers to."""
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            found.add((fd, os.readlink(f"/proc/self/fd/{fd}")))
        except FileNotFoundError:  # the listing's own descriptor, closed already
            pass
    return found


def opened_since(before: set[tuple[str, str]]) -> set[tuple[str, str]]:
    """The descriptors open now that were not before. Not a difference of counts: the garbage of an earlier test
    (a file left in a reference cycle) may be collected, and its descriptor closed, while this one runs."""
    return descriptors() - before


def batches(loader):
    return [(values.numpy().tobytes(), labels.numpy().tobytes()) for values, labels in loader]


LIMITED_EPOCH = """
import json, os, resource, sys
from beton import Loader, OrderOption
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[1]), hard))
before = len(os.listdir("/proc/self/fd"))
loader = Loader(sys.argv[2], batch_size=32, num_workers=2, order=OrderOption.RANDOM, seed=11)
peak, batches = len(os.listdir("/proc/self/fd")), []
for values, labels in loader:
    batches.append([values.numpy().tobytes().hex(), labels.numpy().tobytes().hex()])
    peak = max(peak, len(os.listdir("/proc/self/fd")))
loader.close()
print(json.dumps({"before": before, "peak": peak, "after": len(os.listdir("/proc/self/fd")), "batches": batches}))
"""


def test_an_epoch_over_more_shards_than_the_descriptor_limit_is_exact_with_descriptors_bounded(tmp_path):
    limit = 112  # the default ring of open shards (64), the interpreter's and the threads' few, some to spare
    whole, parts = make_shards(tmp_path, 336)  # 3 times the limit: opening every shard at once cannot work
    manifest = os.fspath(tmp_path / "dataset.json")  # from the copies' known headers: `index` opens every shard
    with beton.Reader(parts[0]) as reader:
        fields = field_specs(reader.descriptors)
    heads = {}
    for part in parts[:TEMPLATES]:
        with open(part, "rb") as file:
            heads[len(heads)] = header_digest(file.read(256))
    Manifest.of([(part, 2, heads[k % TEMPLATES]) for k, part in enumerate(parts)], fields).write(manifest)
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.dirname(TESTS), str(TESTS)])}
    result = subprocess.run([sys.executable, "-c", LIMITED_EPOCH, str(limit), manifest], text=True,
                            capture_output=True, env=environment, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads(result.stdout)
    with Loader(whole, batch_size=32, num_workers=2, order=OrderOption.RANDOM, seed=11) as loader:
        expected = [[values.hex(), labels.hex()] for values, labels in batches(loader)]
    assert seen["batches"] == expected
    assert seen["peak"] - seen["before"] <= DEFAULT_OPEN_SHARDS + 8  # the open shards, the threads' few
    assert seen["after"] == seen["before"]


@pytest.fixture(scope="module")
def hundred(tmp_path_factory):
    return make_shards(tmp_path_factory.mktemp("hundred"), 100)


def test_opening_holds_no_shard_open_and_close_releases_every_descriptor(hundred):
    whole, parts = hundred
    before = descriptors()
    dataset = open_dataset(parts)
    assert not opened_since(before)
    dataset.close()
    loader = Loader(parts, batch_size=8, num_workers=2, order=OrderOption.RANDOM, seed=3)
    iterator = iter(loader)
    for _ in range(5):  # mid-epoch: shards, threads and the page reader running
        next(iterator)
    assert opened_since(before)
    loader.close()
    assert not opened_since(before)  # at once, not when the Loader is collected


@pytest.mark.parametrize("memory", [ProcessCache(), ProcessCache(pages=4), OSCache(), OSCache(readahead=False)],
                         ids=repr)
def test_both_memory_strategies_read_one_files_batches_through_a_ring_of_open_shards(hundred, memory):
    whole, parts = hundred  # 100 shards, at most 64 open: a RANDOM epoch opens and closes them again and again
    before = descriptors()
    for order in (OrderOption.RANDOM, OrderOption.SEQUENTIAL):
        options = dict(batch_size=8, num_workers=3, order=order, seed=5)
        with Loader(whole, **options) as loader:
            expected = batches(loader) + batches(loader)
        with Loader(parts, memory=memory, **options) as loader:
            assert batches(loader) + batches(loader) == expected
            assert loader.memory_counters["bytes_read"] > 0
    assert not opened_since(before)


@pytest.mark.parametrize("max_open_shards", [1, 3])
def test_a_ring_of_few_open_shards_reads_exactly_what_one_file_reads(hundred, max_open_shards):
    whole, parts = hundred
    dataset = ShardedDataset(beton.dataset.dataset_manifest(parts), max_open_shards=max_open_shards)
    layer = ProcessCache().build(dataset, 4)
    try:
        pages = layer.file
        out = np.empty(dataset.heap_size, np.uint8)
        with beton.Reader(whole) as reader:
            for shard in np.random.default_rng(5).permutation(len(parts))[:40].tolist():
                start, end = int(dataset.first_page[shard]), int(dataset.first_page[shard + 1])
                low, high = dataset.heap_offset + start * dataset.page_size, int(dataset.page_ends[end - 1])
                pages.read_into(low, out[: high - low], "test")
                pages.check()
                assert len(pages._open) <= max_open_shards
                samples = range(2 * shard, 2 * shard + 2)
                for sample in samples:  # every payload of the shard, where the union says it lies
                    offset, size = dataset.allocation_table[sample, 0]
                    got = out[int(offset) - low : int(offset) - low + int(size)]
                    assert got.tobytes() == reader.payload(sample, "values").tobytes()
    finally:
        layer.close()
        dataset.close()


@pytest.mark.parametrize("change", ["deleted", "replaced", "rewritten in place"])
def test_a_shard_deleted_or_replaced_mid_epoch_is_a_beton_error_naming_it(tmp_path, change):
    whole, parts = make_shards(tmp_path, 100)
    loader = Loader(parts, batch_size=8, num_workers=1, order=OrderOption.SEQUENTIAL)
    with loader:
        iterator = iter(loader)
        next(iterator)  # the first shards are open; shard 90 is not yet
        if change == "deleted":
            os.remove(parts[90])
        elif change == "replaced":
            shutil.copyfile(parts[91], parts[90])  # another file of the same size, another header
        else:  # a payload byte changed, as rsync --inplace or a damaged disk would: the same size and header
            with open(parts[90], "r+b") as file:
                first = file.read(HEAP_OFFSET + 1)[-1]
                file.seek(HEAP_OFFSET)
                file.write(bytes([first ^ 1]))
            status = os.stat(parts[90])  # a later time, whatever the clock's granularity
            os.utime(parts[90], ns=(status.st_atime_ns, status.st_mtime_ns + 1_000_000_000))
        expected = ShardNotFoundError if change == "deleted" else ShardError
        with pytest.raises(expected) as raised:
            for _ in iterator:
                pass
    assert isinstance(raised.value, BetonError)
    assert raised.value.path == parts[90]
    assert "shard 90" in str(raised.value)


@pytest.fixture(scope="module")
def three(tmp_path_factory):
    """Three shards with file-level metadata (every table kind, the digest table included)."""
    directory = tmp_path_factory.mktemp("three")
    return [write(os.fspath(directory / f"part-{k}.beton"), FIELDS, template_samples(k), metadata={"split": "train"})
            for k in range(3)]


def corrupted_union(parts, directory, position, value, header_crc):
    """Shard 1 with byte ``position`` set to ``value`` (and with ``header_crc``, the header's CRC32 made to match
    again, so that the header's other checks are what refuses it), listed by a manifest that agrees with its
    header (so only the shard's own checks can refuse it); the other two as written."""
    copies = []
    for k, part in enumerate(parts):
        copies.append(os.path.join(directory, f"copy-{k}.beton"))
        shutil.copyfile(part, copies[-1])
    with open(copies[1], "r+b") as file:
        file.seek(position)
        file.write(bytes([value]))
        if header_crc:
            file.seek(0)
            head = file.read(252)
            file.write(zlib.crc32(head).to_bytes(4, "little"))
    heads = []
    for path in copies:
        with open(path, "rb") as file:
            heads.append(file.read(256))
    counts = [int(np.frombuffer(head, HEADER_DTYPE)["num_samples"][0]) for head in heads]  # what the header says
    # a count no manifest can list (past int64): the manifest itself is refused (ShardError), so no manifest can
    # agree with this header and leave the refusal to the shard's own checks, which is what this compares
    assume(counts[1] < 1 << 63)
    entries = [(path, count, header_digest(head)) for path, count, head in zip(copies, counts, heads)]
    return copies, Manifest.of(entries, field_specs(beton.Reader(parts[0]).descriptors))


def test_a_manifest_count_past_int64_is_refused_naming_the_shard(three):
    entries = [(path, 1 << 63 if k == 1 else 2, "0" * 64) for k, path in enumerate(three)]
    with pytest.raises(ShardError, match=r"shard 1 .*part-1.beton.*\[0, 2\*\*63\), got 9223372036854775808"):
        Manifest.of(entries, field_specs(beton.Reader(three[0]).descriptors))
    with pytest.raises(ShardError, match="got -1"):
        Manifest.of([(three[0], -1, "0" * 64)], field_specs(beton.Reader(three[0]).descriptors))


def outcome(action):
    try:
        with action():
            return None
    except BetonError as error:
        return type(error), error.path


@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_the_checks_of_many_shards_at_once_refuse_exactly_what_a_reader_refuses(three, tmp_path_factory, data):
    size = os.path.getsize(three[1])
    with beton.Reader(three[1]) as reader:
        heap_end = reader.heap_offset + reader.heap_size
    # every byte outside the heap (header, padding, tables: what opening checks), and a few of the heap
    position = data.draw(st.one_of(st.integers(0, 4095), st.integers(heap_end, size - 1), st.integers(0, size - 1)))
    value = data.draw(st.integers(0, 255))
    header_crc = position < 252 and data.draw(st.booleans())
    verify_content = data.draw(st.booleans())  # tables checked against their digests too
    directory = tmp_path_factory.mktemp("corrupted")
    copies, manifest = corrupted_union(three, directory, position, value, header_crc)
    alone = outcome(lambda: beton.Reader(copies[1], verify_content=verify_content))
    together = outcome(lambda: ShardedDataset(manifest, verify_content=verify_content))
    assert together == alone


def test_a_failed_check_names_every_shard_that_failed_and_keeps_them_to_check_again(tmp_path):
    whole, parts = make_shards(tmp_path, 4)
    with ShardedDataset(dataset_manifest(parts)) as dataset:
        pages = open_page_source(dataset)
        for shard in (1, 2):  # read, then modified (their modification time): the next check must see both
            pages.read_into(dataset.heap_offset + int(dataset.first_page[shard]) * dataset.page_size,
                            np.empty(8, np.uint8), f"shard {shard}")
            os.utime(parts[shard], ns=(1, 1))
        for _ in range(2):
            with pytest.raises(BetonError, match="modified") as raised:
                pages.check()
            assert raised.value.path == parts[1] and "shards 2 of" in " ".join(raised.value.__notes__)


@pytest.mark.parametrize("tables_file", [False, True])
def test_a_shard_that_cannot_be_read_is_a_shard_error_naming_it(tmp_path, tables_file):
    whole, parts = make_shards(tmp_path, 3)
    manifest = index(tmp_path / "dataset.json", parts) if tables_file else dataset_manifest(parts)
    os.unlink(parts[1])
    os.mkdir(parts[1])  # a directory where the shard was: it opens, but reading it fails
    with pytest.raises(ShardError, match="shard 1") as raised:
        with Loader(manifest, batch_size=2) as loader:
            for _ in loader:
                pass
    assert raised.value.path == parts[1]


def test_a_shard_keeping_payloads_in_other_columns_than_the_first_is_refused(tmp_path):
    # the same fields (names, types, arguments), written consistently in itself, but with the two payload columns
    # swapped: joined column by column, one field's payloads would go to the other's decoder
    fields = {"a": BytesField(), "b": BytesField()}
    rows = [(b"a%d" % k, b"bb%d" % k) for k in range(3)]
    first, second = (write(os.fspath(tmp_path / f"part-{k}.beton"), fields, rows) for k in range(2))
    content = bytearray(open(second, "rb").read())
    header = np.frombuffer(bytes(content[:HEAP_OFFSET]), HEADER_DTYPE, count=1)[0].copy()
    records_at, table_at = int(header["field_table"]["offset"]), int(header["allocation_table"]["offset"])
    records = np.frombuffer(bytes(content[records_at:]), FIELD_RECORD_DTYPE, count=2).copy()
    records["payload_column"] = records["payload_column"][::-1]
    content[records_at : records_at + records.nbytes] = records.tobytes()
    table = np.frombuffer(bytes(content[table_at:]), ALLOCATION_DTYPE, count=2 * len(rows)).reshape(-1, 2)
    content[table_at : table_at + table.nbytes] = table[:, ::-1].copy().tobytes()
    for name in ("field_table", "allocation_table"):
        start, size = int(header[name]["offset"]), int(header[name]["size"])
        header[name]["crc32"] = zlib.crc32(bytes(content[start : start + size]))
    del content[int(header["digest_table"]["offset"]) :]  # the last region: laid out again after the others
    resign_digests(content, header)
    header["header_crc32"] = zlib.crc32(header.tobytes()[:-4])
    content[: header.nbytes] = header.tobytes()
    with open(second, "wb") as file:
        file.write(content)
    with beton.Reader(second) as reader:  # a valid file on its own
        assert reader[1] == (b"a1", b"bb1")
    with pytest.raises(ShardError, match="other allocation-table columns") as raised:
        Loader([first, second], batch_size=2)
    assert raised.value.path == second


@pytest.mark.parametrize("tables_file", [False, True])
def test_a_shard_rewritten_in_place_while_closed_is_refused_when_reopened(tmp_path, tables_file):
    # its pages checked against their digests before it was closed are not checked again when it is reopened
    # (verify_content checks a page once): what makes that safe is that a reopened shard must be the very file,
    # unmodified, that was read before (device, inode, modification time), or it is refused
    whole, parts = make_shards(tmp_path, 3)
    manifest = index(tmp_path / "dataset.json", parts) if tables_file else dataset_manifest(parts)
    with ShardedDataset(manifest, max_open_shards=1, verify_content=True) as dataset:
        pages = open_page_source(dataset)

        def read(shard):
            out = np.empty(8, np.uint8)
            pages.read_into(dataset.heap_offset + int(dataset.first_page[shard]) * dataset.page_size, out, "a page")
            return out

        before = read(1)
        read(2)  # shard 1 closed to make room
        with open(parts[1], "r+b") as file:  # the same size and header, a payload byte changed
            file.seek(HEAP_OFFSET)
            file.write(bytes([before[0] ^ 1]))
        status = os.stat(parts[1])
        os.utime(parts[1], ns=(status.st_atime_ns, status.st_mtime_ns + 1_000_000_000))
        with pytest.raises(ShardError, match="shard 1") as raised:
            read(1)
        assert raised.value.path == parts[1]
