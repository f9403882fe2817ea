"""Reader: open a .beton file, validate every offset, size and table checksum, and expose its tables.

Validation happens once, on open, with vectorised numpy checks (``benchmarks/open_time.py`` times a million
samples), so that compiled code reading payloads later can trust every (offset, size) in the allocation table:
each one lies inside the heap, which lies inside the file. Page contents are checked by :func:`verify`, which
reads the whole file.

Files are untrusted input, and checksums do not make them trustworthy (whoever edits a file can recompute them).
So every count and record is checked against the file before it is used, and what opening and reading cost is
bounded by the file's size: counts against the tables that hold them; field-table strings against the table
(each distinct string decoded and parsed once, so records sharing a string cannot multiply the work); JSON
nesting (:mod:`beton.bounded_json`); metadata dtypes against plain little-endian numbers; and every field's records
against what the field can read (:meth:`~beton.fields.Field.check_records`: image modes, channels, sizes, the
pixel cap, scan tables, lossless sizes), vectorised over the whole data table. The metadata table
(:mod:`beton.storage.metadata`) is checked like the other tables: bounds, padding, CRC32, then size, UTF-8, JSON
nesting depth and that it is a JSON object.
"""

from __future__ import annotations

import dataclasses
import math
import os
import zlib
from collections.abc import Callable, Mapping
from typing import Any, Literal

import numpy as np

from beton import bounded_json, dtypes
from beton.limits import ReadLimits, max_image_pixels_from_environment
from beton.storage import ffcv_format
from beton.storage import format as fmt
from beton.errors import (CorruptDataError, FieldError, FormatError, NotAFileError, ShardNotFoundError, error_context,
                          locate)
from beton.storage.digests import digest
from beton.storage.local_file import map_regular
from beton.storage.metadata import decode_metadata
from beton.fields import BUILTIN_FIELDS
from beton.fields.base import Field, UnknownField
from beton.fields.registry import FieldClasses, field_from_arguments, unregistered_reason
from beton.storage.remote import RemoteFile, RemoteOptions, is_url, remote_or_default

__all__ = ["Reader", "TableNames", "FieldDescriptor", "TABLE_NAMES", "FileHead", "read_head",
           # the checks a Reader makes of a file's structure, each the one home of its rule and message, which the
           # union's readers of many shards at once (beton.dataset.shard_tables, beton.dataset.tables_file) share
           "read_header", "check_layout", "check_gaps_are_zero", "parse_field_table", "typed_table",
           "check_sample_count", "check_allocations", "read_digest_table", "check_table_digests",
           "CONTENT_DIGEST_SLICE", "instantiate_fields"]

#: A file's tables, in file order.
TABLE_NAMES = ("field_table", "data_table", "allocation_table", "page_checksums", "metadata", "digest_table")


@dataclasses.dataclass(frozen=True)
class FieldDescriptor:
    """A field as the file stores it, independent of whether its class can be found."""

    name: str
    type_name: str
    arguments: dict[str, Any]
    metadata_dtype: np.dtype
    payload_column: int

    @property
    def has_payload(self) -> bool:
        return self.payload_column != fmt.NO_PAYLOAD


class TableNames:
    """Names an opened dataset (one file, or several as one) derives from its tables, FFCV's among them."""

    descriptors: dict[str, Any]
    fields: dict[str, Any]
    allocation_table: np.ndarray

    @property
    def field_names(self) -> list[str]:
        return list(self.descriptors)

    @property
    def handlers(self) -> dict[str, Any]:
        """FFCV's name for :attr:`fields`: field name -> field object (``loader.reader.handlers["mask"].shape``)."""
        return self.fields

    @property
    def alloc_table(self) -> np.ndarray:
        """FFCV's name for :attr:`allocation_table`. Its layout is beton's, not FFCV's: one row per sample and one
        column per payload field, each entry ``(offset, size)`` (for several files, offsets in their joint
        address space); FFCV's is one flat row per allocation, ``(sample_id, ptr, size)``."""
        return self.allocation_table


class Reader(TableNames):
    """A validated, read-only view of a .beton file.

    Attributes:
        path, num_samples, page_size, num_pages, heap_offset, heap_size
        metadata: the file-level metadata (a new dict on each access; empty for files written without it)
        fields: field name -> Field (an :class:`~beton.fields.UnknownField` where the class is not found)
        descriptors: field name -> :class:`FieldDescriptor`, as stored
        data_table: read-only memory-mapped structured array, one record per sample
        allocation_table: read-only (num_samples, num_payload_fields) array of (offset, size)
        page_checksums: stored CRC32 of every page
        page_digests: stored SHA-256 of every page (``(num_pages, 32)`` uint8), or None for an FFCV file (no
            content digests)
        content_digest: the header's digest of the digest table (bytes), or None likewise
        verify_content: whether pages are checked against their digests as a Loader first loads them
        handlers, alloc_table: FFCV's names for ``fields`` and ``allocation_table`` (the layout is beton's)

    ``reader[i]`` decodes sample i into a tuple of Python values (for inspection and tests; the Loader is the
    fast path). Use as a context manager or call :meth:`close` to release the memory map.

    ``max_image_pixels`` caps the decoded size (height x width) of every image record, checked on open: a file
    claiming more is refused before anything is allocated. The default, "environment", takes
    ``$BETON_MAX_IMAGE_PIXELS`` (a number, or "none") and otherwise :data:`beton.limits.DEFAULT_MAX_IMAGE_PIXELS`;
    None lifts the cap, for files you trust.

    ``path`` may be a URL (``https://...``, ``s3://bucket/key``, anything fsspec resolves; see docs/remote.md):
    the header and tables are fetched by byte range and validated as a local file's, and payloads come from whole
    pages checked against their CRC32. ``remote`` (a :class:`~beton.storage.remote.RemoteOptions`) says how: fsspec's
    ``storage_options``, the page cache on disk, requests in flight, retries; a local path ignores it. The
    attribute ``remote`` is the opened :class:`~beton.storage.remote.RemoteFile`, or None.

    ``verify_content=True`` checks the content against the file's SHA-256 digests, which CRC32 checksums cannot
    do against someone who edits the file: every table on open, and every heap page the first time a Loader
    reading this Reader loads it (:class:`~beton.errors.CorruptDataError` naming the file and page). An FFCV file,
    which has no digests, is then refused (:class:`~beton.errors.FormatError`). None: check a beton file, not an
    FFCV file (what the shards of a manifest file get: its hash of each header pins the digests). False
    (default): CRC32s only; ``beton verify`` still checks every digest.
    """

    #: Where each heap page ends, for heaps whose pages are not all ``page_size`` long before the last one (a
    #: :class:`~beton.dataset.union.ShardedDataset`); None for one file, whose pages all are.
    page_ends: np.ndarray | None = None

    def __init__(
        self, path: str | os.PathLike[str], custom_fields: Mapping[str, type[Field]] | None = None, *,
        max_image_pixels: int | None | Literal["environment"] = "environment",
        remote: RemoteOptions | None = None, verify_content: bool | None = False,
    ) -> None:
        self.path = os.fspath(path)
        self._verify_content = verify_content
        self.page_digests: np.ndarray | None = None
        self.content_digest: bytes | None = None
        self.max_image_pixels = (max_image_pixels_from_environment() if max_image_pixels == "environment"
                                 else max_image_pixels)
        options = remote_or_default(remote)
        self.remote: RemoteFile | None = None
        with error_context(path=self.path):
            if is_url(self.path):
                self._open_remote(custom_fields, options)
            else:
                self._open(custom_fields)

    def _open(self, custom_fields: Mapping[str, type[Field]] | None) -> None:
        try:
            self._memmap = map_regular(self.path)
        except FileNotFoundError as error:  # a BetonError, as for a missing object at a URL (a shard gone mid-epoch)
            raise ShardNotFoundError(f"no such file: {error.strerror}") from None
        except IsADirectoryError:
            raise FormatError("is a directory, not a beton file (for a folder of shards, pass a glob such as "
                              "'DIR/*.beton' or a manifest)") from None
        except NotAFileError:
            raise
        except ValueError:  # numpy refuses to map an empty file
            raise FormatError(f"file is empty; a beton file has at least {fmt.HEAP_OFFSET} bytes") from None
        self._map = self._memmap.view(np.ndarray)  # plain arrays: slices need not carry memmap baggage
        if bytes(self._map[: len(fmt.MAGIC)]) == fmt.MAGIC:
            self._open_beton(custom_fields)
            return
        # FFCV files have no magic number: only a consistent structure tells them from other files
        problem = ffcv_format.structure_problem(self._map)
        if problem is None:
            self._open_ffcv()
        elif bytes(self._map[:2]) == ffcv_format.VERSION_BYTES:
            raise FormatError(f"not a beton or FFCV file: it starts like an FFCV v{ffcv_format.FFCV_VERSION} file, "
                              f"but {problem}")
        else:
            read_header(self._map)  # raises: not a beton file

    def _open_remote(self, custom_fields: Mapping[str, type[Field]] | None, options: RemoteOptions) -> None:
        """A URL: the validation of a local file, on bytes fetched by range. A header or table whose checksum does
        not match is fetched again (a byte damaged on the way), within the retry budget."""
        self.remote = RemoteFile(self.path, options)
        self._memmap = None
        try:
            for attempt in range(options.retries + 1):
                self._map = self.remote.structure()
                if bytes(self._map[: len(fmt.MAGIC)]) != fmt.MAGIC:  # its bytes are not said: not ours to show
                    raise FormatError(f"{_NOT_BETON} (FFCV files, which carry no checksums, are read from local "
                                      "paths only)")
                try:
                    self._open_beton(custom_fields)
                    break
                except CorruptDataError as error:
                    if attempt == options.retries:
                        locate(error, note=f"(fetched {attempt + 1} times from {self.path})")
                        raise
                    self.remote.fetcher.pause(attempt)
            self.remote.attach_pages(self.heap_offset, self.heap_size, self.page_size, self.page_checksums,
                                     bytes(self._map[: fmt.HEADER_SIZE]))
        except BaseException:
            self.remote.close()
            raise

    def _open_beton(self, custom_fields: Mapping[str, type[Field]] | None) -> None:
        self.checksummed = True
        self.header = read_header(self._map)
        self.format = f"beton v{int(self.header['version'])}"
        self.num_samples = int(self.header["num_samples"])
        self.page_size = int(self.header["page_size"])
        self.num_pages = int(self.header["num_pages"])
        self.heap_offset = int(self.header["heap_offset"])
        self.heap_size = int(self.header["heap_size"])
        check_layout(self.header, len(self._map))
        check_gaps_are_zero(self._map, self.header)
        tables = {name: self._table_bytes(name) for name in TABLE_NAMES}
        decode_metadata(tables["metadata"])  # checked on open, like every other table (its size first)
        self._metadata_json = tables["metadata"].tobytes()
        self.descriptors = {d.name: d for d in parse_field_table(tables["field_table"], self.header)}
        self.fields = instantiate_fields(self.descriptors, custom_fields)
        num_columns = int(self.header["num_payload_fields"])
        data_dtype = self._data_dtype()
        check_sample_count(self.num_samples, data_dtype.itemsize, num_columns, len(self._map))
        self.data_table = typed_table(tables["data_table"], data_dtype, (self.num_samples,), "data_table")
        self.allocation_table = typed_table(
            tables["allocation_table"], fmt.ALLOCATION_DTYPE, (self.num_samples, num_columns), "allocation_table"
        )
        self.page_checksums = typed_table(
            tables["page_checksums"], fmt.PAGE_CHECKSUM_DTYPE, (self.num_pages,), "page_checksums"
        )
        self.content_digest = self.header.tobytes()[CONTENT_DIGEST_SLICE]
        self._table_digests = read_digest_table(self.header, tables["digest_table"])
        self.page_digests = self._table_digests[: self.num_pages]
        self.verify_content = self._verify_content is not False
        if self.verify_content:
            self.check_table_digests()
        check_allocations(self.allocation_table, self.heap_offset, self.heap_size, self.field_of_column)
        self._check_records()

    def check_table_digests(self) -> None:
        """CorruptDataError naming the first table whose bytes do not have their stored SHA-256 digest (a file
        with content digests; see :attr:`page_digests`)."""
        check_table_digests(self._map, self.header, self._table_digests)

    def _open_ffcv(self) -> None:
        """A file written by FFCV (format version 2): read-only, no checksums to check."""
        tables = ffcv_format.read_ffcv(self._map)
        self.format = f"FFCV v{ffcv_format.FFCV_VERSION} (read-only, no checksums)"
        if self._verify_content:
            raise FormatError("verify_content=True: an FFCV file has no content digests (nor checksums): convert it "
                              "to a beton file first, or read it without verify_content")
        self.checksummed = False
        self.verify_content = False
        self.header = None
        self._metadata_json = b"{}"
        self.num_samples, self.page_size = tables.num_samples, tables.page_size
        self.heap_offset, self.heap_size = 0, len(self._map)  # FFCV pages are numbered from the file's start
        self.num_pages = fmt.page_count(self.heap_size, self.page_size)
        columns = iter(range(tables.allocation_table.shape[1]))
        self.descriptors = {
            name: FieldDescriptor(name, field.stored_type_name(), field.arguments(), field.metadata_dtype,
                                  next(columns) if field.has_payload else fmt.NO_PAYLOAD)
            for name, field in zip(tables.names, tables.fields)
        }
        self.fields = dict(zip(tables.names, tables.fields))
        self.data_table, self.allocation_table = tables.data_table, tables.allocation_table
        self.page_checksums = np.zeros(0, fmt.PAGE_CHECKSUM_DTYPE)
        check_allocations(self.allocation_table, self.heap_offset, self.heap_size, self.field_of_column)
        self._check_records()

    def field_of_column(self, column: int) -> str:
        """The name of the field whose payloads fill allocation-table column ``column``."""
        return next(d.name for d in self.descriptors.values() if d.payload_column == column)

    def _payload_sizes(self, name: str) -> np.ndarray | None:
        column = self.descriptors[name].payload_column
        return None if column == fmt.NO_PAYLOAD else self.allocation_table[:, column]["size"]

    def _check_records(self) -> None:
        """Every field's stored records against what it can read (vectorised, once, on open)."""
        limits = ReadLimits(self.max_image_pixels, max_payload_bytes=len(self._map))
        for name, field in self.fields.items():
            with error_context(field=name):
                field.check_records(self.data_table[name], self._payload_sizes(name), limits)

    def check_payloads(self) -> None:
        """The checks of stored records that opening leaves to decoders (each payload's size against its
        field's shape), over the whole file: for :func:`beton.storage.verify`."""
        for name, field in self.fields.items():
            with error_context(field=name):
                field.check_payloads(self.data_table[name], self._payload_sizes(name))

    def _table_bytes(self, name: str) -> np.ndarray:
        ref = self.header[name]
        offset, size = int(ref["offset"]), int(ref["size"])
        blob = self._map[offset : offset + size]
        if zlib.crc32(blob) != int(ref["crc32"]):
            raise CorruptDataError(f"checksum of the {name.replace('_', ' ')} does not match (offset {offset})")
        return blob

    def _data_dtype(self) -> np.dtype:
        try:
            return fmt.data_table_dtype((d.name, d.metadata_dtype) for d in self.descriptors.values())
        except (TypeError, ValueError) as error:
            raise FormatError(f"the fields' metadata dtypes do not form a data table record: {error}") from None

    @property
    def metadata(self) -> dict[str, Any]:
        """The file-level metadata (``DatasetWriter(..., metadata=...)``) as a new dict: changing it changes
        nothing else. Empty for files written without metadata and for FFCV files."""
        return decode_metadata(self._metadata_json)

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, index: int) -> tuple[Any, ...]:
        position = _check_index(index, self.num_samples)
        record = self.data_table[position]
        values = []
        for name, field in self.fields.items():
            with error_context(path=self.path, field=name, sample=position):
                values.append(field.to_python(record[name], self.payload(position, name)))
        return tuple(values)

    def payload(self, index: int, field: str) -> np.ndarray | None:
        """The raw payload bytes of one sample's field as a read-only uint8 view (None for no payload)."""
        position = _check_index(index, self.num_samples)
        column = self.descriptors[field].payload_column
        if column == fmt.NO_PAYLOAD:
            return None
        offset, size = self.allocation_table[position, column]
        return self._map[int(offset) : int(offset) + int(size)]

    def page_bounds(self, page: int) -> tuple[int, int]:
        """Absolute [start, end) byte range of one heap page."""
        start = self.heap_offset + page * self.page_size
        return start, min(start + self.page_size, self.heap_offset + self.heap_size)

    def advise_random_access(self) -> None:
        """Tell the kernel not to read ahead on this file's memory map (``MADV_RANDOM``), where supported."""
        import mmap as mmap_module

        raw = getattr(self._memmap, "_mmap", None)
        if raw is not None and hasattr(raw, "madvise") and hasattr(mmap_module, "MADV_RANDOM"):
            raw.madvise(mmap_module.MADV_RANDOM)

    @property
    def file_map(self) -> np.ndarray:
        """The whole file as a read-only uint8 memory map (for a URL, a :class:`~beton.storage.remote.RemoteBytes`
        that slices the same way)."""
        return self._map

    def close(self) -> None:
        """Drop this reader's references to the memory map.

        The map itself is unmapped when the last array viewing it is garbage collected: numpy views do not
        count as buffer exports of the mmap object, so closing it here would leave views handed out earlier
        (tables, payloads) pointing at unmapped memory, and reading them would crash the process.
        """
        self._map = self._memmap = None
        self.data_table = self.allocation_table = self.page_checksums = None
        if self.remote is not None:
            self.remote.close()

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Reader({self.path!r}, num_samples={self.num_samples}, fields={self.field_names})"


@dataclasses.dataclass(frozen=True)
class FileHead:
    """What a beton file says of itself before its data, validated: the header (``header``: its 256 bytes, which
    hold every table's CRC32, so their hash names the file's content) and the field table (``descriptors``)."""

    path: str
    header: bytes
    num_samples: int
    page_size: int
    descriptors: dict[str, FieldDescriptor]


def read_head(path: str | os.PathLike[str], *, remote: RemoteOptions | None = None,
              parsed: dict[tuple[bytes, int, int], dict[str, FieldDescriptor]] | None = None) -> FileHead:
    """The header and field table of a beton file (a path or URL), checked as :class:`Reader` checks them (magic,
    version, header CRC32, the layout against the file's size, the field table's CRC32 and contents) without
    reading the other tables: what a manifest records of a shard, for the cost of two small reads. FFCV files
    carry no checksums and are refused (FormatError). ``remote``: as for :class:`Reader`. ``parsed``: field tables
    parsed before (their bytes and the header's field counts: the descriptors), which this call reuses and adds
    to: the shards of one writer share one field table, parsed once rather than once a shard."""
    path = os.fspath(path)
    options = remote_or_default(remote)
    with error_context(path=path):
        if not is_url(path):
            try:
                file_map = map_regular(path).view(np.ndarray)
            except NotAFileError:
                raise
            except ValueError:  # numpy refuses to map an empty file
                raise FormatError(f"file is empty; a beton file has at least {fmt.HEAP_OFFSET} bytes") from None
            return _head(path, file_map, parsed)
        opened = RemoteFile(path, options)
        try:
            attempt = 0
            while True:
                try:
                    return _head(path, opened.structure(), parsed)
                except CorruptDataError:  # a byte damaged on the way: fetched again, as the Reader does
                    if attempt == options.retries:
                        raise
                    opened.fetcher.pause(attempt)
                    attempt += 1
        finally:
            opened.close()


def _head(path: str, file_map: np.ndarray,
          parsed: dict[tuple[bytes, int, int], dict[str, FieldDescriptor]] | None) -> FileHead:
    if bytes(file_map[: len(fmt.MAGIC)]) != fmt.MAGIC and len(file_map) >= fmt.HEADER_SIZE \
            and ffcv_format.structure_problem(file_map) is None:
        raise FormatError("an FFCV file carries no checksums, so it cannot be listed as a shard or merged: convert "
                          "it to a beton file first")
    header = read_header(file_map)
    check_layout(header, len(file_map))
    ref = header["field_table"]
    offset, size = int(ref["offset"]), int(ref["size"])
    blob = file_map[offset : offset + size]
    if zlib.crc32(blob) != int(ref["crc32"]):
        raise CorruptDataError(f"checksum of the field table does not match (offset {offset})")
    key = (blob.tobytes(), int(header["num_fields"]), int(header["num_payload_fields"]))
    known = None if parsed is None else parsed.get(key)
    descriptors = dict(known) if known is not None else {d.name: d for d in parse_field_table(blob, header)}
    if parsed is not None and known is None:
        parsed[key] = dict(descriptors)
    return FileHead(path, header.tobytes(), int(header["num_samples"]), int(header["page_size"]), descriptors)


def _check_index(index: int, num_samples: int) -> int:
    position = int(index)
    if position < 0:
        position += num_samples
    if not 0 <= position < num_samples:
        raise IndexError(f"sample index {index} out of range for {num_samples} samples")
    return position


#: What a file without beton's magic number is told: none of its bytes.
_NOT_BETON = f"not a beton file: its first bytes are not beton's magic number {fmt.MAGIC!r}"


def read_header(file_map: np.ndarray) -> np.void:
    # The magic first, and no byte of a file without it in the message (nor its size): a path from an untrusted
    # manifest or URL must not turn errors into a way to read or probe files that are not beton files.
    if bytes(file_map[: len(fmt.MAGIC)]) != fmt.MAGIC:
        raise FormatError(_NOT_BETON)
    if len(file_map) < fmt.HEADER_SIZE:
        raise FormatError(f"file is {len(file_map)} bytes, smaller than the {fmt.HEADER_SIZE}-byte header")
    raw = bytes(file_map[: fmt.HEADER_SIZE])
    header = np.frombuffer(raw, fmt.HEADER_DTYPE)[0]
    if zlib.crc32(raw[: fmt.HEADER_SIZE - 4]) != int(header["header_crc32"]):
        raise CorruptDataError("header checksum does not match")
    version = int(header["version"])
    if version != fmt.FORMAT_VERSION:
        raise FormatError(f"format version {version} is not {fmt.FORMAT_VERSION}, the one this beton reads"
                          + (" (versions 1 and 2 were never released)" if version in (1, 2) else ""))
    if int(header["header_size"]) != fmt.HEADER_SIZE:
        raise FormatError(f"header size is {int(header['header_size'])}, expected {fmt.HEADER_SIZE}")
    # a file with anything there was made by something else, which this reader cannot know how to read
    if any(raw[RESERVED_SLICE]):
        raise FormatError("the header's reserved bytes are not zero")
    for name in TABLE_NAMES:
        if int(header[name]["reserved"]) != 0:
            raise FormatError(f"the header's reference to the {name.replace('_', ' ')} has a reserved field that "
                              "is not zero")
    return header


#: The header's reserved bytes: zero in every file this version writes (a later version that uses them changes the
#: version number), and required to be.
RESERVED_SLICE = slice(fmt.HEADER_DTYPE.fields["reserved"][1],
                       fmt.HEADER_DTYPE.fields["reserved"][1] + fmt.HEADER_DTYPE["reserved"].itemsize)

#: Where the header holds its content digest.
CONTENT_DIGEST_SLICE = slice(fmt.HEADER_DTYPE.fields["content_digest"][1],
                              fmt.HEADER_DTYPE.fields["content_digest"][1] + fmt.DIGEST_SIZE)


def read_digest_table(header: np.void, blob: np.ndarray) -> np.ndarray:
    """A file's digest table (``blob``, its CRC32 checked) as a ``(num_pages + len(DIGESTED_TABLES),
    DIGEST_SIZE)`` uint8 array, checked against the header's content digest (one hash of a small table: opening
    always checks it). Shared with :mod:`beton.dataset.shard_tables`, which reads shards without a Reader."""
    if digest(blob) != header.tobytes()[CONTENT_DIGEST_SLICE]:
        raise CorruptDataError("the digest table does not match the header's content digest")
    return typed_table(blob, np.dtype(np.uint8), (int(header["num_pages"]) + len(fmt.DIGESTED_TABLES),
                                                    fmt.DIGEST_SIZE), "digest_table")


def check_table_digests(file_map: np.ndarray, header: np.void, table_digests: np.ndarray) -> None:
    """CorruptDataError naming the first table of :data:`~beton.storage.format.DIGESTED_TABLES` whose bytes in
    ``file_map`` do not have their digest in ``table_digests`` (a :func:`read_digest_table`)."""
    for name, expected in zip(fmt.DIGESTED_TABLES, table_digests[-len(fmt.DIGESTED_TABLES) :]):
        ref = header[name]
        offset, size = int(ref["offset"]), int(ref["size"])
        if digest(file_map[offset : offset + size]) != expected.tobytes():
            raise CorruptDataError(f"content digest of the {name.replace('_', ' ')} does not match (offset "
                                   f"{offset}): its bytes are not those the file was written with")


def _regions(header: np.void) -> list[tuple[str, int, int]]:
    """Every region after the header: (name, start, end), in file order."""
    heap_start = int(header["heap_offset"])
    regions = [("heap", heap_start, heap_start + int(header["heap_size"]))]
    for name in TABLE_NAMES:
        offset = int(header[name]["offset"])
        regions.append((name, offset, offset + int(header[name]["size"])))
    return regions


def check_layout(header: np.void, file_size: int) -> None:
    page_size = int(header["page_size"])
    if not fmt.is_valid_page_size(page_size):
        raise FormatError(f"page size {page_size} is not a power of two in [{fmt.MIN_PAGE_SIZE}, {fmt.MAX_PAGE_SIZE}]")
    if int(header["heap_offset"]) != fmt.HEAP_OFFSET:
        raise FormatError(f"heap offset is {int(header['heap_offset'])}, expected {fmt.HEAP_OFFSET}")
    expected_pages = fmt.page_count(int(header["heap_size"]), page_size)
    if int(header["num_pages"]) != expected_pages:
        raise FormatError(f"header says {int(header['num_pages'])} pages, the heap size implies {expected_pages}")
    previous_name, previous_end = "header", fmt.HEAP_OFFSET
    for name, start, end in _regions(header):
        if start < previous_end:
            raise FormatError(f"{name} at offset {start} overlaps the {previous_name} ending at {previous_end}")
        if end > file_size:
            raise FormatError(
                f"{name} ends at offset {end} but the file is only {file_size} bytes (truncated?)"
            )
        previous_name, previous_end = name, end
    if previous_end != file_size:
        raise FormatError(f"file is {file_size} bytes, the header says it ends at {previous_end}")


def check_gaps_are_zero(file_map: np.ndarray, header: np.void) -> None:
    # Padding between regions carries no data; requiring zeros there means no byte of the file goes unchecked.
    previous_end = fmt.HEADER_SIZE
    for name, start, end in _regions(header):
        if file_map[previous_end:start].any():
            raise CorruptDataError(f"padding before the {name} (offsets {previous_end}..{start}) is not zero")
        previous_end = end


_STRING_PARTS = ("type_name", "name", "arguments", "metadata_dtype")


def parse_field_table(blob: np.ndarray, header: np.void) -> list[FieldDescriptor]:
    num_fields, num_payload_fields = int(header["num_fields"]), int(header["num_payload_fields"])
    records_size = num_fields * fmt.FIELD_RECORD_DTYPE.itemsize
    if records_size > len(blob):
        raise FormatError(f"field table is {len(blob)} bytes, too small for {num_fields} field records")
    if num_payload_fields > num_fields:
        raise FormatError(f"header says {num_payload_fields} payload fields but only {num_fields} fields")
    records = np.frombuffer(blob[:records_size].tobytes(), fmt.FIELD_RECORD_DTYPE)
    strings = _StringArea(blob[records_size:].tobytes(), records)
    descriptors = [_parse_field_record(record, strings, index) for index, record in enumerate(records)]
    _check_descriptors(descriptors, num_payload_fields)
    return descriptors


class _StringArea:
    """The field table's strings, checked against the area all at once, each distinct one decoded and parsed
    once: records may share a string, and sharing must not multiply the memory and time spent on it."""

    def __init__(self, data: bytes, records: np.ndarray) -> None:
        self._data = data
        self._parsed: dict[tuple[str, int, int], Any] = {}
        refs = np.stack([records[part] for part in _STRING_PARTS])  # (part, record)
        offsets, sizes = refs["offset"].astype(np.uint64), refs["size"].astype(np.uint64)
        outside = offsets + sizes > len(data)  # u4 + u4: no overflow in u8
        if outside.any():
            part, index = (int(i) for i in np.argwhere(outside)[0])
            raise FormatError(f"field record {index}: {_STRING_PARTS[part]} string lies outside the field table")
        distinct = np.unique(np.stack([offsets.ravel(), sizes.ravel()], axis=1), axis=0)
        total = int(distinct[:, 1].sum())
        if total > len(data):
            raise FormatError(f"field records refer to {total} bytes of distinct strings that overlap, more than "
                              f"the {len(data)}-byte string area holds")

    def text(self, record: np.void, part: str, index: int) -> str:
        return self._cached("text", record[part], lambda raw: _utf8(raw, part, index))

    def dtype(self, record: np.void, index: int) -> np.dtype:
        return self._cached("dtype", record["metadata_dtype"],
                            lambda raw: _metadata_dtype(_utf8(raw, "metadata_dtype", index)))

    def json(self, record: np.void, part: str, index: int) -> Any:
        """Parsed JSON, shared by the records that share the string (read it, do not change it)."""
        return self._cached("json", record[part], lambda raw: bounded_json.loads(_utf8(raw, part, index)))

    def _cached(self, kind: str, ref: np.void, parse: Any) -> Any:
        offset, size = int(ref["offset"]), int(ref["size"])
        key = (kind, offset, size)
        if key not in self._parsed:
            self._parsed[key] = parse(self._data[offset : offset + size])
        return self._parsed[key]


def _utf8(raw: bytes, part: str, index: int) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise FormatError(f"field record {index}: {part} is not valid UTF-8") from None


def _metadata_dtype(text: str) -> np.dtype:
    try:  # numpy parses the description: anything it raises on a hostile one is a bad file
        dtype = dtypes.dtype_from_json(text)
    except (ValueError, TypeError, LookupError, ArithmeticError, RecursionError) as error:
        raise ValueError(f"not a dtype: {error}") from None
    dtypes.check_metadata_dtype(dtype)
    return dtype


def _parse_field_record(record: np.void, strings: _StringArea, index: int) -> FieldDescriptor:
    name = strings.text(record, "name", index)
    try:
        arguments = strings.json(record, "arguments", index)
        metadata_dtype = strings.dtype(record, index)
    except ValueError as error:
        if isinstance(error, FormatError):
            raise
        raise FormatError(f"field {name!r}: stored arguments or metadata dtype are invalid: {error}") from None
    if not isinstance(arguments, dict):
        raise FormatError(f"field {name!r}: stored arguments are not a JSON object")
    if int(record["reserved"]) != 0:
        raise FormatError(f"field {name!r}: the field record's reserved field is not zero")
    return FieldDescriptor(name, strings.text(record, "type_name", index), arguments, metadata_dtype,
                           int(record["payload_column"]))


def _check_descriptors(descriptors: list[FieldDescriptor], num_payload_fields: int) -> None:
    names = [d.name for d in descriptors]
    if len(set(names)) != len(names) or not all(names):
        raise FormatError(f"field names must be unique and non-empty, got {names}")
    columns = sorted(d.payload_column for d in descriptors if d.has_payload)
    if columns != list(range(num_payload_fields)):
        raise FormatError(f"payload columns {columns} do not match {num_payload_fields} payload fields")


def instantiate_fields(descriptors: Mapping[str, FieldDescriptor],
                        custom_fields: Mapping[str, type[Field]] | None) -> dict[str, Field]:
    classes = FieldClasses(BUILTIN_FIELDS, custom_fields)  # once per file, however many fields it names
    return {name: _instantiate_field(descriptor, classes) for name, descriptor in descriptors.items()}


def _instantiate_field(descriptor: FieldDescriptor, classes: FieldClasses) -> Field:
    with error_context(field=descriptor.name):
        cls = classes.resolve(descriptor.type_name, descriptor.name)
        if cls is None:
            return UnknownField(descriptor.type_name, descriptor.arguments, descriptor.metadata_dtype,
                                descriptor.has_payload, unregistered_reason(descriptor.type_name, descriptor.name))
        try:
            field = field_from_arguments(cls, descriptor.arguments)
        except (TypeError, ValueError, LookupError, ArithmeticError) as error:  # arguments are the file's JSON
            raise FieldError(f"{cls.__name__} cannot be built from stored arguments: {error}") from None
        if field.metadata_dtype != descriptor.metadata_dtype or field.has_payload != descriptor.has_payload:
            raise FieldError(
                f"{cls.__name__} does not match the stored field: metadata dtype {field.metadata_dtype} / "
                f"payload {field.has_payload}, stored {descriptor.metadata_dtype} / {descriptor.has_payload}"
            )
    return field


def check_sample_count(num_samples: int, record_size: int, num_columns: int, file_size: int) -> None:
    """Samples that store nothing (no metadata, no payload) cost no bytes of the file, so the table sizes do not
    bound their count; the file's size does, or the index arrays a Loader builds per sample could be anything."""
    if record_size == 0 and num_columns == 0 and num_samples > file_size:
        raise FormatError(f"header claims {num_samples} samples that store no bytes; a file of {file_size} bytes "
                          f"holds at most {file_size}")


def typed_table(blob: np.ndarray, dtype: np.dtype, shape: tuple[int, ...], name: str) -> np.ndarray:
    expected = math.prod(shape) * dtype.itemsize  # Python integers: header counts cannot overflow them
    if len(blob) != expected:
        raise FormatError(f"{name} is {len(blob)} bytes, expected {expected} for shape {shape} of {dtype}")
    if expected == 0:
        return np.zeros(shape, dtype)
    table = blob.view(dtype).reshape(shape)
    return table


def check_allocations(table: np.ndarray, heap_offset: int, heap_size: int,
                       field_of_column: Callable[[int], str]) -> None:
    if table.size == 0:
        return
    relative = table["offset"].astype(np.uint64) - np.uint64(heap_offset)
    sizes = table["size"].astype(np.uint64)
    # Written without additions that could overflow: offset >= heap start, size <= heap size,
    # and (offset - heap start) <= heap size - size.
    bad = (table["offset"] < heap_offset) | (sizes > heap_size)
    bad |= relative > (np.uint64(heap_size) - np.minimum(sizes, np.uint64(heap_size)))
    if bad.any():
        sample, column = (int(i) for i in np.argwhere(bad)[0])
        raise locate(FormatError(
            f"payload at offset {int(table[sample, column]['offset'])} with size "
            f"{int(table[sample, column]['size'])} lies outside the heap [{heap_offset}, {heap_offset + heap_size})"
        ), sample=sample, field=field_of_column(column))
