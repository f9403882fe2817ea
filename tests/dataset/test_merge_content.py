"""``beton merge`` of format-version-3 shards checks their content digests, on the very bytes it copies: a shard
forged so that every CRC32 still matches is refused (naming the shard and page, leaving no output), and a shard
changed after its pages were checked cannot slip its new bytes into the merged file."""

from __future__ import annotations

import importlib
import types
import zlib

import numpy as np
import pytest

import beton
from beton.dataset.merge import merge
from beton.errors import BetonError, CorruptDataError
from beton.fields import IntField, NDArrayField

from conftest import write
from forgery import forge_keeping_crc32

merge_module = importlib.import_module("beton.dataset.merge")  # beton.dataset.merge is also the function
PAYLOAD = 50  # five samples fill a 256-byte page but for its last 6 bytes, which are padding
FIELDS = {"label": IntField(), "blob": NDArrayField(np.uint8, (PAYLOAD,))}


@pytest.fixture
def shards(tmp_path):
    return [write(tmp_path / f"part-{k}.beton", FIELDS, [(i, np.full(PAYLOAD, i, np.uint8))
                                                        for i in range(10 * k, 10 * k + 10)], page_size=256)
            for k in range(2)]


def forged_bytes(path):
    """The file's bytes with sample 1's payload (heap page 0) overwritten and the page's CRC32 kept."""
    with beton.Reader(path) as reader:
        offset = int(reader.allocation_table[1, 0]["offset"])
        start, end = reader.page_bounds(0)
    data = bytearray(path.read_bytes())
    forge_keeping_crc32(data, start, end, {offset: b"\xee" * PAYLOAD}, end - 4)
    return bytes(data)


def blobs(path):
    with beton.Reader(path) as reader:
        return [bytes(reader.payload(i, "blob")) for i in range(reader.num_samples)]


def test_merge_refuses_a_shard_forged_to_keep_its_crc32(shards, tmp_path):
    shards[1].write_bytes(forged_bytes(shards[1]))
    output = tmp_path / "merged.beton"
    with pytest.raises(CorruptDataError, match="content digest of heap page 0") as caught:
        merge(output, shards)
    assert caught.value.path == str(shards[1]) and caught.value.page == 0
    assert not output.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["part-0.beton", "part-1.beton"]


def test_merge_refuses_a_shard_whose_table_was_forged_to_keep_its_crc32(shards, tmp_path):
    with beton.Reader(shards[1]) as reader:
        ref = reader.header["data_table"]
        start, size = int(ref["offset"]), int(ref["size"])
        record = reader.data_table.dtype.itemsize
    data = bytearray(shards[1].read_bytes())
    # sample 0's label (the row's first 8 bytes), with 4 bytes of sample 1's row chosen to keep the CRC32
    forge_keeping_crc32(data, start, start + size, {start: (7).to_bytes(8, "little")}, start + record)
    shards[1].write_bytes(bytes(data))
    with pytest.raises(BetonError, match="digest") as caught:
        merge(tmp_path / "merged.beton", shards)
    assert caught.value.path == str(shards[1])
    assert not (tmp_path / "merged.beton").exists()


def test_merge_copies_the_bytes_it_checked(shards, tmp_path, monkeypatch):
    """The shard is forged on disk (in place, CRC32 kept) just after merge checks a page's CRC32: the merged file
    holds the bytes that were checked, not the forged ones a second read of the shard would find."""
    honest = blobs(shards[0]) + blobs(shards[1])
    forged = forged_bytes(shards[1])
    with beton.Reader(shards[1]) as reader:
        page_zero = reader.page_bounds(0)
    calls = []

    def crc32_then_forge(data, *rest):
        value = zlib.crc32(data, *rest)
        if bytes(data) == shards[1].read_bytes()[page_zero[0] : page_zero[1]] and not calls:
            calls.append(1)
            with open(shards[1], "r+b") as file:  # in place: a memory map of the shard sees it
                file.write(forged)
        return value

    monkeypatch.setattr(merge_module, "zlib", types.SimpleNamespace(crc32=crc32_then_forge))
    merge(tmp_path / "merged.beton", shards)
    assert calls and shards[1].read_bytes() == forged
    assert blobs(tmp_path / "merged.beton") == honest
    beton.verify(tmp_path / "merged.beton")
