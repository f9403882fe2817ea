"""What a union of many shards reads of each shard when it opens: the tables, not an open file.

A :class:`~beton.dataset.union.ShardedDataset` needs every shard's data and allocation tables (the orders and the
memory layers read them for every sample) and its page geometry, but no shard needs to stay open for that: pages
are read later, through shards opened when the epoch reaches them. :func:`read_local_tables` reads one local
shard's tables in one visit (open, map, check, copy, unmap, close: no descriptor or map outlives the call) and
checks them as :class:`~beton.storage.reader.Reader` checks a file (header, layout, zero padding, every table's
CRC32, allocations inside the heap), against what the manifest lists for the shard (its header's SHA-256, its
sample count) and against the first shard's field table. What it leaves to its caller, because it is cheaper once
over the union than once per shard: each field's record checks (``Field.check_records``) and, where a field table's
bytes differ from the first shard's, the field comparison (:func:`field_table_bytes` tells them apart). A full
Reader costs milliseconds a file (it resolves field classes and builds Field objects): fine for one file, minutes
for 100,000 shards; this path costs tens of microseconds.
"""

from __future__ import annotations

import dataclasses
import mmap
import os
import zlib

import numpy as np

from beton.errors import CorruptDataError, FormatError, ShardNotFoundError, error_context
from beton.dataset.manifest import Manifest, field_specs
from beton.storage import format as fmt
from beton.storage.reader import (Reader, _check_allocations, _check_gaps_are_zero, _check_layout,
                                  _check_sample_count, _parse_field_table, _read_header, _table_names, _typed_table)

__all__ = ["ShardTables", "FirstShard", "read_local_tables", "tables_of_reader"]


@dataclasses.dataclass(frozen=True, eq=False)
class ShardTables:
    """One shard's tables (copies, owned by nobody else) and geometry: what the union keeps of it while it is
    closed. ``size``: the file's size when read, checked again when the shard is opened to read pages."""

    size: int
    num_pages: int
    page_size: int
    heap_offset: int
    heap_size: int
    data_table: np.ndarray
    allocation_table: np.ndarray
    metadata_json: bytes


@dataclasses.dataclass(frozen=True, eq=False)
class FirstShard:
    """What every shard is compared with: the first shard's field table (bytes) and data-table record."""

    field_table: bytes
    data_dtype: np.dtype


def tables_of_reader(reader: Reader) -> tuple[ShardTables, FirstShard]:
    """The tables of an opened, validated Reader (a remote shard, or the first shard), copied out of its map, and
    its field table as the others are compared with it."""
    blobs = {name: bytes(_region(reader.file_map, reader.header, name)) for name in _table_names(reader.header)}
    tables = ShardTables(len(reader.file_map), reader.num_pages, reader.page_size, reader.heap_offset,
                         reader.heap_size, np.array(reader.data_table), np.array(reader.allocation_table),
                         blobs.get("metadata", b"{}"))
    return tables, FirstShard(blobs["field_table"], reader.data_table.dtype)


def read_local_tables(manifest: Manifest, number: int, first: FirstShard) -> ShardTables:
    """Shard ``number`` of ``manifest`` (a local path), read and checked as the module docstring says.
    ShardNotFoundError, or a FormatError, CorruptDataError or ShardError naming the shard."""
    shard = manifest.shards[number]
    with error_context(path=shard.location):
        try:
            descriptor = os.open(shard.location, os.O_RDONLY)
        except FileNotFoundError as error:
            raise ShardNotFoundError(f"shard {number} of {len(manifest.shards)} is missing: {error}") from None
        try:
            size = os.fstat(descriptor).st_size
            if size < fmt.HEAP_OFFSET:
                _read_header(np.frombuffer(os.pread(descriptor, fmt.HEADER_SIZE, 0), np.uint8))  # says what is wrong
                raise FormatError(f"file is {size} bytes; a beton file has at least {fmt.HEAP_OFFSET}")
            mapping = mmap.mmap(descriptor, size, access=mmap.ACCESS_READ)
        finally:
            os.close(descriptor)
        try:
            return _tables(manifest, number, np.frombuffer(mapping, np.uint8), first)
        finally:
            try:
                mapping.close()
            except BufferError:  # an exception's traceback still holds a view: the map goes with it
                pass


def _tables(manifest: Manifest, number: int, file_map: np.ndarray, first: FirstShard) -> ShardTables:
    header = _read_header(file_map)
    manifest.check_head(number, header.tobytes(), int(header["num_samples"]))
    _check_layout(header, len(file_map))
    _check_gaps_are_zero(file_map, header)
    tables = {}
    for name in _table_names(header):
        tables[name] = blob = _region(file_map, header, name)
        if zlib.crc32(blob) != int(header[name]["crc32"]):
            raise CorruptDataError(f"checksum of the {name.replace('_', ' ')} does not match (offset "
                                   f"{int(header[name]['offset'])})")
    if tables["field_table"].tobytes() != first.field_table:  # written otherwise: the fields must still match
        descriptors = _parse_field_table(tables["field_table"], header)
        manifest.check_fields(number, field_specs({d.name: d for d in descriptors}))
    num_samples, num_columns = int(header["num_samples"]), int(header["num_payload_fields"])
    _check_sample_count(num_samples, first.data_dtype.itemsize, num_columns, len(file_map))
    data = _typed_table(tables["data_table"], first.data_dtype, (num_samples,), "data_table")
    allocation = _typed_table(tables["allocation_table"], fmt.ALLOCATION_DTYPE, (num_samples, num_columns),
                              "allocation_table")
    heap_offset, heap_size = int(header["heap_offset"]), int(header["heap_size"])
    _check_allocations(allocation, heap_offset, heap_size, lambda column: f"payload column {column}")
    metadata = tables["metadata"].tobytes() if "metadata" in tables else b"{}"
    return ShardTables(len(file_map), int(header["num_pages"]), int(header["page_size"]), heap_offset, heap_size,
                       np.array(data), np.array(allocation), metadata)


def _region(file_map: np.ndarray, header: np.void, name: str) -> np.ndarray:
    """The bytes of table ``name``, where the header says it lies."""
    offset, size = int(header[name]["offset"]), int(header[name]["size"])
    return file_map[offset : offset + size]
