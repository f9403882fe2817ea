"""What a union of many shards reads of each shard when it opens: the tables, not an open file.

A :class:`~beton.dataset.union.ShardedDataset` needs every shard's data and allocation tables (the orders and the
memory layers read them for every sample) and its page geometry, but no shard needs to stay open for that: pages
are read later, through shards opened when the epoch reaches them. :func:`read_local_tables` reads one local
shard's tables in one visit (open, map, check, copy, unmap, close: no descriptor or map outlives the call) and
checks them as :class:`~beton.storage.reader.Reader` checks a file (header, layout, zero padding, every table's
CRC32, allocations inside the heap, the digest table against the header's content digest and, where content is
checked, every table against its digest), against what the manifest lists for the shard (its
header's SHA-256, its sample count) and against the first shard's field table. Where content is checked it keeps
the shard's page digests, which the memory layers check pages against as they first load them. What it leaves to its caller, because it is cheaper once
over the union than once per shard: each field's record checks (``Field.check_records``) and, where a field table's
bytes differ from the first shard's, the field comparison (:func:`field_table_bytes` tells them apart). A full
Reader costs milliseconds a file (it resolves field classes and builds Field objects): fine for one file, minutes
for 100,000 shards; this path costs tens of microseconds.
"""

from __future__ import annotations

import dataclasses
import hashlib
import mmap
import os
import zlib
from collections.abc import Sequence

import numpy as np

from beton.errors import BetonError, CorruptDataError, FormatError, ShardError, ShardNotFoundError, error_context, locate
from beton.dataset.manifest import Manifest, field_specs
from beton.storage import format as fmt
from beton.storage.local_file import open_regular
from beton.storage.page_source import file_identity
from beton.storage.remote import is_url
from beton.storage.reader import (RESERVED_SLICE, TABLE_NAMES, FieldDescriptor, Reader, check_allocations,
                                  check_gaps_are_zero, check_layout, check_sample_count, check_table_digests,
                                  read_digest_table, parse_field_table, read_header, typed_table)

__all__ = ["ShardTables", "UnionTables", "FirstShard", "check_payload_columns", "read_local_tables",
           "read_small_tables", "tables_of_reader", "records", "headers_pass", "file_ends", "SMALL_SHARD_BYTES"]


@dataclasses.dataclass(frozen=True, eq=False)
class ShardTables:
    """One shard's tables and geometry: what the union keeps of it while it is closed. ``size``: the file's size
    when read, checked again when the shard is opened to read pages. ``data`` and ``allocations``: the data and
    allocation tables' bytes as stored (checked), which the union joins into one array each. ``page_digests``: the
    SHA-256 of each page (``num_pages * DIGEST_SIZE`` bytes) where the shard's content is checked, else None.
    ``identity``: a local file's :func:`~beton.storage.page_source.file_identity` when its tables were read, which a
    reopened shard must still have (None for a URL)."""

    size: int
    num_samples: int
    num_pages: int
    page_size: int
    heap_offset: int
    heap_size: int
    data: bytes
    allocations: bytes
    metadata_json: bytes
    page_digests: bytes | None = None
    identity: tuple[int, int, int] | None = None

    def data_table(self, dtype: np.dtype) -> np.ndarray:
        return records(self.data, dtype, (self.num_samples,))

    def allocation_table(self, columns: int) -> np.ndarray:
        return records(self.allocations, fmt.ALLOCATION_DTYPE, (self.num_samples, columns))


@dataclasses.dataclass(frozen=True, eq=False)
class UnionTables:
    """Every shard's tables, as columns (what a ShardedDataset joins): per shard its file's ``sizes``,
    ``num_pages``, ``page_sizes``, ``heap_offsets`` and ``heap_sizes`` (int64 arrays), its file-level ``metadata``
    and ``page_digests`` (None where its content is not checked); the shards' data tables and allocation tables
    (each shard's own offsets) concatenated in order. ``identities``: each local shard's
    :func:`~beton.storage.page_source.file_identity` when its tables were read, or None (a URL, or a shard not yet
    read: its tables came from a tables file). ``table_offsets``: where a tables file says each shard's data and
    allocation tables lie in it (int64, ``(shards, 2)``), which its file is compared at when first opened; None
    where the tables were read from the shards."""

    sizes: np.ndarray
    num_pages: np.ndarray
    page_sizes: np.ndarray
    heap_offsets: np.ndarray
    heap_sizes: np.ndarray
    data: bytes
    allocations: bytes
    metadata: list[bytes]
    page_digests: list[bytes | None]
    identities: list[tuple[int, int, int] | None] | None = None
    table_offsets: np.ndarray | None = None

    @classmethod
    def of(cls, tables: Sequence[ShardTables]) -> UnionTables:
        def column(name: str) -> np.ndarray:
            return np.array([getattr(table, name) for table in tables], np.int64)

        return cls(column("size"), column("num_pages"), column("page_size"), column("heap_offset"),
                   column("heap_size"), b"".join(table.data for table in tables),
                   b"".join(table.allocations for table in tables), [table.metadata_json for table in tables],
                   [table.page_digests for table in tables], [table.identity for table in tables])


def records(data: bytes, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    """Read-only records of ``dtype`` over ``data`` (a zero-size record has no bytes to view)."""
    if not dtype.itemsize:
        return np.zeros(shape, dtype)
    return np.frombuffer(data, dtype).reshape(shape)


@dataclasses.dataclass(frozen=True, eq=False)
class FirstShard:
    """What every shard is compared with: the first shard's field table (bytes), its counts of fields and payload
    fields, its data-table record, and the allocation-table column of each field with a payload."""

    field_table: bytes
    num_fields: int
    num_payload_fields: int
    data_dtype: np.dtype
    payload_columns: dict[str, int]


def check_payload_columns(manifest: Manifest, number: int, descriptors: Sequence[FieldDescriptor],
                          first: FirstShard) -> None:
    """ShardError unless shard ``number`` (whose field table differs from the first shard's in its bytes) keeps each
    field's payloads in the first shard's column: the union joins the allocation tables column by column, so
    another order would hand one field's payloads to another's decoder."""
    columns = {d.name: d.payload_column for d in descriptors if d.has_payload}
    if columns != first.payload_columns:
        raise locate(ShardError(f"shard {number} keeps its fields' payloads in other allocation-table columns "
                                f"({columns}) than shard 0 ({first.payload_columns}): rewrite it with the same "
                                "fields in the same order"), path=manifest.shards[number].location)


def tables_of_reader(reader: Reader) -> tuple[ShardTables, FirstShard]:
    """The tables of an opened, validated Reader (a remote shard, or the first shard), copied out of its map, and
    its field table as the others are compared with it."""
    blobs = {name: bytes(_region(reader.file_map, reader.header, name)) for name in TABLE_NAMES}
    # a local Reader keeps no descriptor: its file as it is now, which a single file's page source records too
    identity = None if is_url(reader.path) else file_identity(os.stat(reader.path))
    tables = ShardTables(len(reader.file_map), reader.num_samples, reader.num_pages, reader.page_size,
                         reader.heap_offset, reader.heap_size, blobs["data_table"], blobs["allocation_table"],
                         blobs["metadata"],
                         reader.page_digests.tobytes() if reader.verify_content else None, identity)
    header = reader.header
    return tables, FirstShard(blobs["field_table"], int(header["num_fields"]), int(header["num_payload_fields"]),
                              reader.data_table.dtype, {name: d.payload_column for name, d in
                                                        reader.descriptors.items() if d.has_payload})


def read_local_tables(manifest: Manifest, number: int, first: FirstShard, verify_content: bool | None) -> ShardTables:
    """Shard ``number`` of ``manifest`` (a local path), read and checked as the module docstring says, its content
    as ``Reader(verify_content=...)`` checks it. ShardNotFoundError, or a FormatError, CorruptDataError or
    ShardError naming the shard."""
    shard = manifest.shards[number]
    with error_context(path=shard.location):
        try:
            descriptor = open_regular(shard.location)
        except FileNotFoundError as error:
            raise ShardNotFoundError(f"shard {number} of {len(manifest.shards)} is missing: {error}") from None
        except OSError as error:  # a directory, a file this user may not read, ...
            raise ShardError(f"shard {number} of {len(manifest.shards)} cannot be read: {error}") from None
        try:
            status = os.fstat(descriptor)
            size = status.st_size
            if size < fmt.HEAP_OFFSET:
                read_header(np.frombuffer(os.pread(descriptor, fmt.HEADER_SIZE, 0), np.uint8))  # says what is wrong
                raise FormatError(f"file is {size} bytes; a beton file has at least {fmt.HEAP_OFFSET}")
            mapping = mmap.mmap(descriptor, size, access=mmap.ACCESS_READ)
        except OSError as error:  # a directory opens, but neither reads nor maps
            raise ShardError(f"shard {number} of {len(manifest.shards)} cannot be read: {error}") from None
        finally:
            os.close(descriptor)
        try:
            tables = _tables(manifest, number, np.frombuffer(mapping, np.uint8), first, verify_content)
            return dataclasses.replace(tables, identity=file_identity(status))
        finally:
            try:
                mapping.close()
            except BufferError:  # an exception's traceback still holds a view: the map goes with it
                pass


def _tables(manifest: Manifest, number: int, file_map: np.ndarray, first: FirstShard,
            verify_content: bool | None) -> ShardTables:
    header = read_header(file_map)
    manifest.check_head(number, header.tobytes(), int(header["num_samples"]))
    check_layout(header, len(file_map))
    check_gaps_are_zero(file_map, header)
    tables = {}
    for name in TABLE_NAMES:
        tables[name] = blob = _region(file_map, header, name)
        if zlib.crc32(blob) != int(header[name]["crc32"]):
            raise CorruptDataError(f"checksum of the {name.replace('_', ' ')} does not match (offset "
                                   f"{int(header[name]['offset'])})")
    counts = (int(header["num_fields"]), int(header["num_payload_fields"]))
    if tables["field_table"].tobytes() != first.field_table or counts != (first.num_fields, first.num_payload_fields):
        # written otherwise (or its header counts fields otherwise): parsed as a Reader parses it, same fields
        descriptors = parse_field_table(tables["field_table"], header)
        manifest.check_fields(number, field_specs({d.name: d for d in descriptors}))
        check_payload_columns(manifest, number, descriptors, first)
    num_samples, num_columns = int(header["num_samples"]), int(header["num_payload_fields"])
    check_sample_count(num_samples, first.data_dtype.itemsize, num_columns, len(file_map))
    data = typed_table(tables["data_table"], first.data_dtype, (num_samples,), "data_table")
    allocation = typed_table(tables["allocation_table"], fmt.ALLOCATION_DTYPE, (num_samples, num_columns),
                              "allocation_table")
    num_pages = int(header["num_pages"])
    typed_table(tables["page_checksums"], fmt.PAGE_CHECKSUM_DTYPE, (num_pages,), "page_checksums")
    table_digests = read_digest_table(header, tables["digest_table"])
    page_digests = None
    if verify_content is not False:
        check_table_digests(file_map, header, table_digests)
        page_digests = table_digests[:num_pages].tobytes()
    heap_offset, heap_size = int(header["heap_offset"]), int(header["heap_size"])
    check_allocations(allocation, heap_offset, heap_size, lambda column: f"payload column {column}")
    return ShardTables(len(file_map), num_samples, num_pages, int(header["page_size"]), heap_offset, heap_size,
                       data.tobytes(), allocation.tobytes(), tables["metadata"].tobytes(), page_digests)


def _region(file_map: np.ndarray, header: np.void, name: str) -> np.ndarray:
    """The bytes of table ``name``, where the header says it lies."""
    offset, size = int(header[name]["offset"]), int(header[name]["size"])
    return file_map[offset : offset + size]


# ---- many small shards at once ----------------------------------------------------------------------------------

#: Shards at most this large are read whole, in one call each, and checked together (:func:`read_small_tables`).
SMALL_SHARD_BYTES = 1 << 20
_SHARDS_AT_ONCE = 256  # small shards read and checked together: at most 256 MiB of files held at once


def read_small_tables(manifest: Manifest, numbers: Sequence[int], first: FirstShard,
                      verify_content: bool | None) -> list[ShardTables]:
    """The tables of local shards ``numbers``, in order, as :func:`read_local_tables` gives them, for a fraction of
    its cost per shard: each shard of at most :data:`SMALL_SHARD_BYTES` is read whole in one call and closed, and
    all are checked together, by vectorised forms of the same checks (the same rules; the Reader's functions stay
    the one home of each rule's message). A shard any of them refuses, and a larger shard, goes through
    :func:`read_local_tables`, whose error names it."""
    result: list[ShardTables] = []
    for start in range(0, len(numbers), _SHARDS_AT_ONCE):  # so that the files read stay few in memory
        chunk = numbers[start : start + _SHARDS_AT_ONCE]
        read = [_read_small(manifest.shards[number].location) for number in chunk]
        contents = [None if found is None else found[0] for found in read]
        small = [position for position, content in enumerate(contents) if content is not None]
        passed = np.zeros(len(chunk), bool)
        made: dict[int, ShardTables] = {}
        if small:
            chosen = [contents[position] for position in small]
            headers = np.frombuffer(b"".join(content[: fmt.HEADER_SIZE] for content in chosen), fmt.HEADER_DTYPE)
            passed[small] = _pass_checks(manifest, [chunk[position] for position in small], chosen, headers, first,
                                         verify_content)
            made = {position: dataclasses.replace(tables, identity=read[position][1])  # type: ignore[index]
                    for position, tables in zip(small, _small_tables(chosen, headers, verify_content))}
        result += [made[position] if passed[position] else read_local_tables(manifest, number, first, verify_content)
                   for position, number in enumerate(chunk)]
    return result


def _read_small(location: str) -> tuple[bytes, tuple[int, int, int]] | None:
    """The whole file and its :func:`~beton.storage.page_source.file_identity`, or None where it is missing, larger
    than :data:`SMALL_SHARD_BYTES`, or smaller than a beton file can be (those are read one by one, which says what
    is wrong)."""
    try:
        descriptor = open_regular(location)
    except (OSError, FormatError):  # read one by one, which says what is wrong
        return None
    try:
        status = os.fstat(descriptor)
        size = status.st_size
        if not fmt.HEAP_OFFSET <= size <= SMALL_SHARD_BYTES:
            return None
        content = os.pread(descriptor, size, 0)
        return (content, file_identity(status)) if len(content) == size else None
    except OSError:  # a directory: read one by one, which says so
        return None
    finally:
        os.close(descriptor)


def _pass_checks(manifest: Manifest, numbers: list[int], contents: list[bytes], headers: np.ndarray,
                 first: FirstShard, verify_content: bool | None) -> np.ndarray:
    """Which shards pass every check of :func:`_tables`, run over all of them at once."""
    sizes = np.array([len(content) for content in contents], np.uint64)
    ok = headers_pass(manifest, numbers, [content[: fmt.HEADER_SIZE] for content in contents], headers, sizes, first)
    _check_contents(contents, headers, ok, first, verify_content)
    _check_allocations_together(contents, headers, ok, first)
    return ok


def headers_pass(manifest: Manifest, numbers: Sequence[int], raw_headers: list[bytes], headers: np.ndarray,
                 sizes: np.ndarray, first: FirstShard) -> np.ndarray:
    """Which of the shards ``numbers`` have a header (``raw_headers``, and parsed, ``headers``) that passes every
    check of :func:`_tables` of a header alone, for files of ``sizes`` bytes: the manifest's SHA-256 and sample
    count, magic, CRC32, version, reserved fields, the first shard's field counts, page geometry, regions in order
    and of the sizes the counts make, the last ending where the file ends."""
    shards = manifest.shards
    ok = headers["magic"] == fmt.MAGIC
    ok &= np.array([zlib.crc32(raw[: fmt.HEADER_SIZE - 4]) for raw in raw_headers]) == headers["header_crc32"]
    ok &= np.array([hashlib.sha256(raw).hexdigest() == shards.digests[number]
                    for raw, number in zip(raw_headers, numbers)])
    ok &= (headers["version"] == fmt.FORMAT_VERSION) & (headers["header_size"] == fmt.HEADER_SIZE)
    ok &= np.array([not any(raw[RESERVED_SLICE]) for raw in raw_headers])
    for name in TABLE_NAMES:
        ok &= headers[name]["reserved"] == 0
    ok &= headers["num_samples"] == shards.counts[list(numbers)].astype(np.uint64)
    ok &= (headers["num_fields"] == first.num_fields) & (headers["num_payload_fields"] == first.num_payload_fields)
    page_size, heap_size = headers["page_size"], headers["heap_size"]
    ok &= (page_size >= fmt.MIN_PAGE_SIZE) & (page_size <= fmt.MAX_PAGE_SIZE) & (page_size & (page_size - 1) == 0)
    ok &= headers["heap_offset"] == fmt.HEAP_OFFSET
    whole_pages = heap_size // np.maximum(page_size, 1)
    ok &= headers["num_pages"] == whole_pages + (heap_size - whole_pages * page_size > 0)
    # regions in file order, each after the one before, the last ending where the file ends
    end = np.full(len(headers), fmt.HEAP_OFFSET, np.uint64)
    for name in ("heap", *TABLE_NAMES):
        start = headers["heap_offset"] if name == "heap" else headers[name]["offset"]
        length = heap_size if name == "heap" else headers[name]["size"]
        stop = start + length
        ok &= (start >= end) & (stop >= start) & (stop <= sizes)
        end = stop
    ok &= end == sizes
    # tables: their sizes for the counts, the first shard's field table, each CRC32, zeros between regions
    samples = headers["num_samples"]
    ok &= samples <= sizes  # what a Reader checks of samples that store nothing; here it also bounds the products
    ok &= headers["data_table"]["size"] == samples * np.uint64(first.data_dtype.itemsize)
    ok &= headers["allocation_table"]["size"] == samples * np.uint64(first.num_payload_fields *
                                                                     fmt.ALLOCATION_DTYPE.itemsize)
    ok &= headers["page_checksums"]["size"] == headers["num_pages"] * np.uint64(fmt.PAGE_CHECKSUM_DTYPE.itemsize)
    digest_rows = headers["num_pages"] + np.uint64(len(fmt.DIGESTED_TABLES))
    ok &= headers["digest_table"]["size"] == digest_rows * np.uint64(fmt.DIGEST_SIZE)
    return ok


def file_ends(headers: np.ndarray) -> np.ndarray:
    """Where each file ends by its header (uint64): the end of its last region (its size, once
    :func:`headers_pass` passes it)."""
    last = headers[TABLE_NAMES[-1]]
    return last["offset"] + last["size"]


def _check_contents(contents: list[bytes], headers: np.ndarray, ok: np.ndarray, first: FirstShard,
                    verify_content: bool | None) -> None:
    """Clear ``ok`` for the shards (of those still passing) with a non-zero byte between regions, a table whose
    CRC32 does not match, a field table other than the first shard's, or a digest table that does not match the
    header's content digest, or where content is checked a table that does not match its digest."""
    regions = [("heap", headers["heap_offset"].tolist(), (headers["heap_offset"] + headers["heap_size"]).tolist(),
                None)]
    for name in TABLE_NAMES:
        reference = headers[name]
        regions.append((name, reference["offset"].tolist(), (reference["offset"] + reference["size"]).tolist(),
                        reference["crc32"].tolist()))
    for position in np.flatnonzero(ok).tolist():
        content, view, previous = contents[position], memoryview(contents[position]), fmt.HEADER_SIZE
        for name, starts, ends, crcs in regions:
            start, end = starts[position], ends[position]
            if content.count(0, previous, start) != start - previous or \
                    (crcs is not None and zlib.crc32(view[start:end]) != crcs[position]):
                ok[position] = False
                break
            previous = end
        else:
            table = regions[1]
            ok[position] = view[table[1][position] : table[2][position]] == first.field_table
            if ok[position]:
                ok[position] = _digests_pass(content, headers[position], verify_content)


def _digests_pass(content: bytes, header: np.void, verify_content: bool | None) -> bool:
    """Whether a shard read whole passes the digest checks of :func:`_tables`."""
    file_map = np.frombuffer(content, np.uint8)
    reference = header["digest_table"]
    start = int(reference["offset"])
    try:
        table_digests = read_digest_table(header, file_map[start : start + int(reference["size"])])
        if verify_content is not False:
            check_table_digests(file_map, header, table_digests)
    except BetonError:
        return False
    return True


def _check_allocations_together(contents: list[bytes], headers: np.ndarray, ok: np.ndarray, first: FirstShard) -> None:
    """Clear ``ok`` for the shards with a payload outside their heap (the rule of the Reader's allocation check)."""
    columns = first.num_payload_fields
    passing = np.flatnonzero(ok)
    if not columns or not len(passing):
        return
    refs = headers["allocation_table"]
    table = np.frombuffer(b"".join(contents[p][int(refs[p]["offset"]) : int(refs[p]["offset"] + refs[p]["size"])]
                                   for p in passing.tolist()), fmt.ALLOCATION_DTYPE).reshape(-1, columns)
    counts = headers["num_samples"][passing].astype(np.int64)
    heap_offset = np.repeat(headers["heap_offset"][passing], counts)[:, None]
    heap_size = np.repeat(headers["heap_size"][passing], counts)[:, None]
    sizes = table["size"]
    bad = (table["offset"] < heap_offset) | (sizes > heap_size)
    bad |= table["offset"] - heap_offset > heap_size - np.minimum(sizes, heap_size)
    rows = np.flatnonzero(bad.any(axis=1))
    if len(rows):
        ok[passing[np.searchsorted(np.cumsum(counts), rows, side="right")]] = False


def _small_tables(contents: list[bytes], headers: np.ndarray, verify_content: bool | None) -> list[ShardTables]:
    """The tables of shards read whole, where their headers say they lie (of use for those that passed)."""
    def columns(*key: str) -> list[int]:
        values = headers
        for part in key:
            values = values[part]
        return values.tolist()

    data_start, data_size = columns("data_table", "offset"), columns("data_table", "size")
    allocation_start, allocation_size = columns("allocation_table", "offset"), columns("allocation_table", "size")
    metadata_start, metadata_size = columns("metadata", "offset"), columns("metadata", "size")
    digests_start = columns("digest_table", "offset")
    samples, pages, page_sizes = columns("num_samples"), columns("num_pages"), columns("page_size")
    heap_offsets, heap_sizes = columns("heap_offset"), columns("heap_size")
    return [ShardTables(len(content), samples[k], pages[k], page_sizes[k], heap_offsets[k], heap_sizes[k],
                        content[data_start[k] : data_start[k] + data_size[k]],
                        content[allocation_start[k] : allocation_start[k] + allocation_size[k]],
                        content[metadata_start[k] : metadata_start[k] + metadata_size[k]],
                        content[digests_start[k] : digests_start[k] + pages[k] * fmt.DIGEST_SIZE]
                        if verify_content is not False else None)
            for k, content in enumerate(contents)]
