"""Content digests (format version 3): a sample forged so that every CRC32 still matches is caught by `verify`, by
reads with ``verify_content=True`` and by a manifest file's reads, of one file or of a dataset of several (whose
shards are read without Readers); files without digests say so."""

from __future__ import annotations

import hashlib
import json
import shutil
import zlib

import numpy as np
import pytest

import beton
from beton import Loader
from beton.memory import OSCache, ProcessCache
from beton.dataset import ShardedDataset, dataset_manifest, index, shard_tables
from beton.errors import CorruptDataError, FormatError, ShardError
from beton.fields import IntField, NDArrayField
from beton.storage import format as fmt
from beton.storage.file_builder import header_bytes

from conftest import write
from forgery import forge_keeping_crc32

PAYLOAD = 50  # bytes per sample: five fit a 256-byte page, and the page's last 6 bytes are padding
FIELDS = {"label": IntField(), "blob": NDArrayField(np.uint8, (PAYLOAD,))}


def sample(i):
    return i, np.full(PAYLOAD, i, np.uint8)


@pytest.fixture
def written(tmp_path):
    return write(tmp_path / "honest.beton", FIELDS, [sample(i) for i in range(20)], page_size=256)


def forged_copy(path, directory):
    """Sample 1's payload (on heap page 0) replaced by 50 bytes of 0xEE, and the page's last 4 padding bytes chosen
    to keep the page's CRC32: the header, every table and every CRC32 stay as they were."""
    with beton.Reader(path) as reader:
        offset = int(reader.allocation_table[1, 0]["offset"])
        start, end = reader.page_bounds(0)
        assert end - start == reader.page_size and offset + PAYLOAD <= end - 4
    data = bytearray(path.read_bytes())
    assert not any(data[end - 4 : end])  # padding
    forge_keeping_crc32(data, start, end, {offset: b"\xee" * PAYLOAD}, end - 4)
    forged = directory / "forged.beton"
    forged.write_bytes(bytes(data))
    return forged


def test_a_forged_sample_keeps_every_crc32_and_is_read_without_content_checks(written, tmp_path):
    forged = forged_copy(written, tmp_path)
    with beton.Reader(forged) as reader, beton.Reader(written) as honest:
        assert reader.header.tobytes() == honest.header.tobytes()  # so a manifest's header hash matches too
        assert bytes(reader[1][1]) == b"\xee" * PAYLOAD
        for page in range(reader.num_pages):
            start, end = reader.page_bounds(page)
            assert zlib.crc32(reader.file_map[start:end]) == int(reader.page_checksums[page])


def test_verify_finds_the_forged_page_by_its_digest(written, tmp_path):
    assert beton.verify(written).checksummed
    with pytest.raises(CorruptDataError, match=r"content digest of heap page 0 .*does not match.*sample") as caught:
        beton.verify(forged_copy(written, tmp_path))
    assert caught.value.page == 0


@pytest.mark.parametrize("memory", [OSCache(), ProcessCache()], ids=["os-cache", "process-cache"])
def test_verify_content_reads_refuse_the_forged_page(written, tmp_path, memory):
    forged = forged_copy(written, tmp_path)
    with Loader(written, batch_size=4, num_workers=1, memory=memory, verify_content=True) as loader:
        labels = [int(label) for labels, _ in loader for label in labels]
    assert labels == list(range(20))
    with Loader(forged, batch_size=4, num_workers=1, memory=memory, verify_content=True) as loader:
        with pytest.raises(CorruptDataError, match="content digest of heap page 0") as caught:
            list(loader)
    assert caught.value.path == str(forged) and caught.value.page == 0


def test_a_manifest_file_checks_its_shards_content(written, tmp_path):
    manifest = tmp_path / "train.json"
    index(manifest, [written])
    with Loader(manifest, batch_size=4, num_workers=1) as loader:
        assert len(list(loader)) == 5
    shutil.copyfile(forged_copy(written, tmp_path), written)  # same header: the manifest's hash still matches
    with Loader(manifest, batch_size=4, num_workers=1) as loader:
        with pytest.raises(CorruptDataError, match="content digest of heap page 0"):
            list(loader)


def test_a_forger_who_rewrites_the_digests_changes_the_header_a_manifest_pins(written, tmp_path):
    manifest = tmp_path / "train.json"
    index(manifest, [written])
    forged = bytearray(forged_copy(written, tmp_path).read_bytes())
    with beton.Reader(written) as reader:
        ref = reader.header["digest_table"]
        table_start = int(ref["offset"])
        header = reader.header.copy()
    page = forged[fmt.HEAP_OFFSET : fmt.HEAP_OFFSET + 256]
    forged[table_start : table_start + 32] = hashlib.sha256(page).digest()
    table = bytes(forged[table_start : table_start + int(ref["size"])])
    header["digest_table"]["crc32"] = zlib.crc32(table)
    header["content_digest"] = hashlib.sha256(table).digest()
    forged[: fmt.HEADER_SIZE] = header_bytes(header)
    written.write_bytes(bytes(forged))
    assert beton.verify(written).checksummed  # a consistent file on its own: only a pin tells it apart
    with pytest.raises(ShardError, match="not the file the manifest lists"):
        with Loader(manifest, batch_size=4, num_workers=1) as loader:  # refused when first opened at the latest
            for _ in loader:
                pass


def test_a_forged_table_is_refused_by_verify_content_on_open(written, tmp_path):
    """Labels live in the data table: sample 0's changed, sample 5's chosen to keep the table's CRC32."""
    with beton.Reader(written) as reader:
        ref = reader.header["data_table"]
        start, size = int(ref["offset"]), int(ref["size"])
        record = reader.data_table.dtype.itemsize
    data = bytearray(written.read_bytes())
    forge_keeping_crc32(data, start, start + size, {start: (7).to_bytes(8, "little")}, start + 5 * record)
    written.write_bytes(bytes(data))
    with beton.Reader(written) as reader:
        assert reader[0][0] == 7  # every CRC32 matches
    with pytest.raises(CorruptDataError, match="content digest of the data table does not match"):
        beton.Reader(written, verify_content=True)
    with pytest.raises(CorruptDataError, match="content digest of the data table"):
        beton.verify(written)


def test_the_digest_table_must_match_the_header(written):
    data = bytearray(written.read_bytes())
    with beton.Reader(written) as reader:
        ref = reader.header["digest_table"]
    offset = int(ref["offset"])
    forge_keeping_crc32(data, offset, offset + int(ref["size"]), {offset: bytes([data[offset] ^ 1])}, offset + 4)
    written.write_bytes(bytes(data))
    with pytest.raises(CorruptDataError, match="digest table does not match the header's content digest"):
        beton.Reader(written)


def test_every_file_written_now_has_digests(written, tmp_path):
    with beton.Reader(written, verify_content=True) as reader:
        assert reader.format == "beton v3" and reader.page_digests.shape == (reader.num_pages, 32)
        assert reader.metadata == {}
    manifest = tmp_path / "train.json"
    index(manifest, [written])
    assert json.loads(manifest.read_text())["shards"][0]["num_samples"] == 20


# ---- several files as one: each shard's digests are read with its tables, without a Reader ----------------------

@pytest.fixture(params=["read-whole", "one-by-one"])
def shard_reading(request, monkeypatch):
    """Small shards are read whole and checked together; larger ones one by one: both must keep the digests."""
    if request.param == "one-by-one":
        monkeypatch.setattr(shard_tables, "SMALL_SHARD_BYTES", 0)


def three_shards(directory):
    return [write(directory / f"part-{k}.beton", FIELDS, [sample(20 * k + i) for i in range(20)], page_size=256)
            for k in range(3)]


@pytest.mark.parametrize("memory", [OSCache(), ProcessCache()], ids=["os-cache", "process-cache"])
def test_verify_content_over_several_files_refuses_a_forged_shard(tmp_path, shard_reading, memory):
    shards = three_shards(tmp_path)
    with Loader(shards, batch_size=4, num_workers=1, memory=memory, verify_content=True) as loader:
        assert loader.reader.verify_content and loader.reader.page_digests.shape == (loader.reader.num_pages, 32)
        labels = sorted(int(label) for labels, _ in loader for label in labels)
    assert labels == list(range(60))
    forged = forged_copy(shards[1], tmp_path)
    with Loader([shards[0], forged, shards[2]], batch_size=4, num_workers=1, memory=memory) as loader:
        assert len(list(loader)) == 15  # no content checks asked for: the forgery keeps every CRC32
    with Loader([shards[0], forged, shards[2]], batch_size=4, num_workers=1, memory=memory,
                verify_content=True) as loader:
        with pytest.raises(CorruptDataError, match="content digest of heap page 0") as caught:
            list(loader)
    assert caught.value.path == str(forged) and caught.value.page == 0


def test_a_manifest_file_of_several_shards_checks_each_shards_content(tmp_path, shard_reading):
    shards = three_shards(tmp_path)
    manifest = tmp_path / "train.json"
    index(manifest, shards)
    with Loader(manifest, batch_size=4, num_workers=1) as loader:  # checked though not asked for: the manifest pins it
        assert loader.reader.verify_content
        assert len(list(loader)) == 15
    shutil.copyfile(forged_copy(shards[2], tmp_path), shards[2])  # same header: the manifest's hash still matches
    with Loader(manifest, batch_size=4, num_workers=1) as loader:
        with pytest.raises(CorruptDataError, match="content digest of heap page 0") as caught:
            list(loader)
    assert caught.value.path == str(shards[2])


def test_verify_content_over_several_files_checks_every_shards_tables_on_open(tmp_path, shard_reading):
    shards = three_shards(tmp_path)
    with beton.Reader(shards[1]) as reader:
        ref = reader.header["data_table"]
        start, size = int(ref["offset"]), int(ref["size"])
        record = reader.data_table.dtype.itemsize
    data = bytearray(shards[1].read_bytes())
    forge_keeping_crc32(data, start, start + size, {start: (7).to_bytes(8, "little")}, start + 5 * record)
    shards[1].write_bytes(bytes(data))
    with ShardedDataset(dataset_manifest(shards)) as dataset:
        assert dataset[20][0] == 7 and not dataset.verify_content
    with pytest.raises(CorruptDataError, match="content digest of the data table does not match") as caught:
        ShardedDataset(dataset_manifest(shards), verify_content=True)
    assert caught.value.path == str(shards[1])


@pytest.mark.parametrize("version", [1, 2])
def test_a_shard_of_the_unreleased_versions_1_and_2_is_refused_by_name(tmp_path, shard_reading, version):
    """A shard relabelled as version 1 or 2 (which carried no digests, so that the content was pinned by nothing
    but CRC32s) is refused by `beton index`, and by the union's own checks of a manifest that lists its header (a
    manifest written by hand, or edited with the shard), as a Reader refuses the file."""
    shards = three_shards(tmp_path)
    manifest = tmp_path / "train.json"
    index(manifest, shards)
    data = bytearray(shards[2].read_bytes())
    header = np.frombuffer(bytes(data[: fmt.HEADER_SIZE]), fmt.HEADER_DTYPE).copy()
    header["version"] = version
    data[: fmt.HEADER_SIZE] = header_bytes(header[0])
    shards[2].write_bytes(bytes(data))
    with pytest.raises(FormatError, match=f"format version {version} is not 3"):
        index(tmp_path / "again.json", shards)
    listed = json.loads(manifest.read_text())
    del listed["tables"]  # the shards' own tables are read
    listed["shards"][2]["header_sha256"] = hashlib.sha256(bytes(data[: fmt.HEADER_SIZE])).hexdigest()
    manifest.write_text(json.dumps(listed))
    for verify_content in (False, True):
        with pytest.raises(FormatError, match=f"format version {version} is not 3") as caught:
            Loader(manifest, batch_size=4, num_workers=0, verify_content=verify_content)
        assert caught.value.path == str(shards[2])
