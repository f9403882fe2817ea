"""``beton merge``: the shards of a dataset combined into one ordinary ``.beton`` file.

Samples keep the shards' order (shard 0's first). Nothing is decoded or encoded again: each sample's data-table row
and payload bytes are copied, and the :class:`~beton.storage.file_builder.FileBuilder` lays them out as a write
does, page by page with fresh page checksums, so the result is what ``DatasetWriter`` would have written: for
shards written with ``from_indexed_dataset(shard=...)`` (same fields, seed, page size and metadata), byte for byte
the file of one write of the whole dataset.

What the copy has to redo, because a shard's bytes describe their place in the shard:

* **scan-grouped images** (``RGBImageField(write_mode="progressive", scan_grouped=True)``, and any field that groups
  pieces: :meth:`~beton.fields.Field.layout_pieces`): a page holds several samples' first scans, then their second
  scans... Each sample's scans are gathered back into one payload and grouped again by the builder, so records
  fill the merged file's pages as they would in one write (a shard's last, partly filled record does not stay
  partly filled);
* **fields whose records hold their own sample's place** (:attr:`~beton.fields.Field.holds_sample_places`: those
  written to FFCV's contract, :mod:`beton.ffcv.fields`): it is renumbered to the sample's place in the merged file.

Checks, so that a merge can never launder damaged data into a file with fresh checksums: every shard is opened as
a Reader opens a file (and against its manifest entry, when a manifest names it), its payloads are checked against
their fields as ``verify`` does, and every heap page is copied out of the shard once and checked on that copy, against
its CRC32 and, in a beton file, its content digest (SHA-256, which whoever changes a page cannot
keep as they can keep a CRC32; with the table digests, checked on opening): payloads are then taken from the
checked copies, never read again from the shard, so the bytes merged (and given fresh checksums and digests) are
the bytes checked. Fields must be the same in every shard (:class:`~beton.errors.ShardError` naming the
first difference) and their classes known (registered or built in), since laying samples out may depend on them.

File-level metadata: by default every shard's must be the same (a ShardError names the first shard and key that
differ) and the merged file gets it; ``metadata=`` sets the merged file's instead (None: none).

Memory: the data and allocation tables of the merged file (as in a write), plus one chunk of payloads (at most
about :data:`CHUNK_BYTES`, or one payload when it is larger), the checked copies of the heap pages under it, and
one page of grouped samples. Shards are opened one
at a time. The file is written under a temporary name and renamed when complete (a URL: uploaded when complete,
:mod:`beton.storage.remote.upload`); an error, Ctrl-C or SIGTERM leaves the target as it was.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
import zlib
from collections.abc import Iterator, Mapping
from typing import Any, Literal

import numpy as np

from beton.errors import BetonError, CorruptDataError, FieldError, ShardError, error_context, locate
from beton.fields.base import Field, UnknownField
from beton.storage import format as fmt
from beton.storage.encode import EncodedChunk, EncodeSpec
from beton.storage.file_builder import FileBuilder, sigterm_cleans_up, write_error
from beton.storage.metadata import encode_metadata
from beton.storage.reader import Reader
from beton.storage.remote import RemoteOptions
from beton.dataset.shards import Source, dataset_manifest
from beton.storage.digests import digest
from beton.storage.verify import page_error

__all__ = ["merge", "MergeReport", "CHUNK_BYTES"]

#: Payload bytes copied per chunk (a larger single payload is one chunk of its own).
CHUNK_BYTES = 32 * 1024 * 1024
_CHUNK_SAMPLES = 4096


@dataclasses.dataclass(frozen=True)
class MergeReport:
    """What :func:`merge` wrote: the file, its samples, the shards it came from (in order) and its page size."""

    path: str
    num_samples: int
    shards: tuple[str, ...]
    page_size: int
    seconds: float


def merge(output: str | os.PathLike[str], source: Source, *, page_size: int | None = None,
          metadata: Mapping[str, Any] | None | Literal["shards"] = "shards",
          custom_fields: Mapping[str, type[Field]] | None = None, remote: RemoteOptions | None = None) -> MergeReport:
    """Combine the shards ``source`` names (files, URLs, globs, manifest files or a list of them: see
    :func:`~beton.dataset.shards.dataset_manifest`) into the file ``output``, a path or a URL (uploaded once
    complete, as ``DatasetWriter`` does; module docstring).

    ``page_size``: the merged file's (default: the first shard's). ``metadata``: "shards" (default) takes the
    shards' file-level metadata, which must be the same in all; a mapping (or None: none) sets it instead.
    ``custom_fields``, ``remote`` (how shards, manifests and an ``output`` at URLs are reached): as for
    :class:`~beton.Reader`.
    """
    output = os.fspath(output)
    if page_size is not None and not fmt.is_valid_page_size(page_size):
        raise ValueError(f"page_size must be a power of two between {fmt.MIN_PAGE_SIZE} and {fmt.MAX_PAGE_SIZE}, "
                         f"got {page_size}")
    from_shards = isinstance(metadata, str) and metadata == "shards"
    chosen_metadata = None if from_shards else encode_metadata(metadata)  # type: ignore[arg-type]
    manifest = dataset_manifest(source, remote=remote)  # its shards open with the same remote=
    if not manifest.shards:
        raise ValueError("the dataset lists no shards: nothing to merge")
    started = time.perf_counter()
    with sigterm_cleans_up():
        builder: FileBuilder | None = None
        try:
            first_metadata: dict[str, Any] = {}
            for number, shard in enumerate(manifest.shards):
                with manifest.open_shard(number, custom_fields=custom_fields) as reader, \
                        error_context(path=shard.location):
                    if builder is None:
                        first_metadata = reader.metadata
                        page_size = page_size or reader.page_size
                        table = encode_metadata(first_metadata) if from_shards else chosen_metadata
                        with _writing(output):
                            builder = _builder(output, reader, page_size, table, remote)
                    elif from_shards:
                        _check_metadata(first_metadata, reader.metadata, number)
                    reader.check_payloads()
                    if reader.page_digests is not None:  # not an FFCV file: its tables pinned as its pages are
                        reader.check_table_digests()
                    for chunk in _shard_chunks(reader, builder.num_samples):
                        with _writing(output):
                            builder.add(chunk)
            with _writing(output):
                builder.commit()
        except BaseException:
            if builder is not None:
                builder.abort()
            raise
    return MergeReport(output, builder.num_samples, tuple(shard.location for shard in manifest.shards), page_size,
                       time.perf_counter() - started)


@contextlib.contextmanager
def _writing(path: str) -> Iterator[None]:
    """OSErrors of writing the merged file become WriterErrors naming it (a full disk says so); errors of reading a
    shard (a StorageError, a missing file) pass as they are."""
    try:
        yield
    except BetonError:
        raise
    except OSError as error:
        raise write_error(path, error) from error


def _builder(output: str, reader: Reader, page_size: int, metadata: bytes | None,
             remote: RemoteOptions | None) -> FileBuilder:
    """The builder of the merged file, with the first shard's fields (the others' are checked against them)."""
    for name, field in reader.fields.items():
        if isinstance(field, UnknownField):
            raise locate(FieldError(f"merging needs the field's class ({reader.descriptors[name].type_name}), since "
                                    f"how its samples are laid out may depend on it: {field.reason}"), field=name)
    names = tuple(reader.descriptors)
    spec = EncodeSpec(output, names, tuple(reader.fields.values()), reader.data_table.dtype, seed=0)
    columns = [reader.descriptors[name].payload_column for name in names if reader.descriptors[name].has_payload]
    # The builder numbers payload columns in field order, as every beton writer does: the shard's field table is
    # then valid as it is, and copied byte for byte; a file numbered otherwise gets a table built from its fields.
    field_table = _field_table(reader) if columns == list(range(len(columns))) else None
    return FileBuilder(spec, page_size, metadata, field_table=field_table, remote=remote)


def _field_table(reader: Reader) -> bytes:
    ref = reader.header["field_table"]
    return bytes(reader.file_map[int(ref["offset"]) : int(ref["offset"]) + int(ref["size"])])


def _check_metadata(expected: dict[str, Any], got: dict[str, Any], number: int) -> None:
    if got == expected:
        return
    key = next(key for key in [*expected, *got] if key not in got or key not in expected or got[key] != expected[key])
    raise ShardError(f"shard {number}'s file-level metadata differs from shard 0's at key {key!r}; merge keeps "
                     "metadata only when every shard has the same (pass metadata= to set the merged file's)")


def _shard_chunks(reader: Reader, first_position: int) -> Iterator[EncodedChunk]:
    """The shard's samples as chunks for the builder: rows copied (pointers renumbered), payloads taken from
    checked copies of their pages (grouped payloads gathered from their pieces), at most about CHUNK_BYTES."""
    names = list(reader.descriptors)
    payload_names = [name for name in names if reader.descriptors[name].has_payload]
    columns = [reader.descriptors[name].payload_column for name in payload_names]
    allocations = reader.allocation_table[:, columns] if columns else np.zeros((reader.num_samples, 0),
                                                                                fmt.ALLOCATION_DTYPE)
    ends = np.cumsum(allocations["size"].sum(axis=1, dtype=np.uint64), dtype=np.uint64)
    pages = _CheckedPages(reader)
    if reader.remote is not None:  # fetch ahead, several requests at once, in the order they are copied
        reader.remote.pages.will_read(np.arange(reader.num_pages))
    start = 0
    while start < reader.num_samples:
        before = int(ends[start - 1]) if start else 0
        stop = int(np.searchsorted(ends, np.uint64(before + CHUNK_BYTES), side="right"))
        stop = min(max(stop, start + 1), start + _CHUNK_SAMPLES, reader.num_samples)
        chunk = allocations[start:stop]
        pages.cover(chunk)
        rows = np.array(reader.data_table[start:stop])  # a copy: the builder writes scan starts into it
        payloads: list[list[bytes]] = [[] for _ in range(stop - start)]
        for column, name in enumerate(payload_names):
            field = reader.fields[name]
            for row, data in enumerate(_payloads(pages, field, name, rows, chunk[:, column], start)):
                payloads[row].append(data)
        for name in names:
            if reader.fields[name].holds_sample_places:
                with error_context(field=name):
                    reader.fields[name].move_records(rows[name], first_position)
        yield EncodedChunk(first_position + start, rows, payloads)
        start = stop


def _payloads(pages: _CheckedPages, field: Field, name: str, rows: np.ndarray, allocations: np.ndarray,
              first: int) -> Iterator[bytes]:
    """Each sample's payload of one field as its writer gave it to the builder: the allocation's bytes, or for a
    sample whose pieces are grouped (scans of a progressive JPEG), its pieces end to end; taken from the checked
    copies of its pages (``pages``, covering the chunk)."""
    pieces = None
    for row, (offset, size) in enumerate(allocations.tolist()):
        ends = field.layout_pieces(rows[row][name])
        if ends is None:
            yield pages.read(offset, size)
            continue
        if pieces is None:
            pieces = field.read_pieces(rows[name], None)
        with error_context(field=name, sample=first + row):
            if pieces is None:
                raise FieldError(f"{type(field).__name__} groups pieces (layout_pieces) but does not say where they "
                                 "are (read_pieces): its samples cannot be gathered for a merge")
            parts = [pages.read(offset + start, length)
                     for start, length in zip(pieces.starts[row].tolist(), pieces.lengths[row].tolist()) if length]
            data = b"".join(parts)
            if not ends or len(data) != ends[-1]:
                raise CorruptDataError(f"the sample's pieces hold {len(data)} bytes, its record says "
                                       f"{ends[-1] if ends else 0}")
        yield data


class _CheckedPages:
    """Copies of the shard's heap pages under the current chunk, each checked, on the copy, against its CRC32 and
    (in a beton file) its content digest: the bytes a merge copies are those it checked, whatever the shard's
    file does meanwhile. A page is copied and checked once while consecutive chunks need it."""

    def __init__(self, reader: Reader) -> None:
        self._reader = reader
        self._pages: dict[int, np.ndarray] = {}

    def cover(self, allocations: np.ndarray) -> None:
        """Hold checked copies of every page under these allocations (and no other)."""
        reader = self._reader
        used = allocations["size"] > 0
        starts = allocations["offset"][used].astype(np.int64) - reader.heap_offset
        ends = starts + allocations["size"][used].astype(np.int64)
        first, last = starts // reader.page_size, (ends - 1) // reader.page_size
        needed = np.unique(np.concatenate([np.arange(a, b + 1) for a, b in zip(first.tolist(), last.tolist())])
                           if len(first) else np.zeros(0, np.int64)).tolist()
        self._pages = {page: self._pages[page] if page in self._pages else self._checked_copy(page)
                       for page in needed}

    def _checked_copy(self, page: int) -> np.ndarray:
        reader = self._reader
        start, end = reader.page_bounds(page)
        data = np.array(reader.file_map[start:end], np.uint8)  # the copy: every later read is of it
        if zlib.crc32(data) != int(reader.page_checksums[page]):
            raise page_error(reader, page, start, end)
        if reader.page_digests is not None and digest(data) != reader.page_digests[page].tobytes():
            raise page_error(reader, page, start, end, "content digest")
        return data

    def read(self, offset: int, size: int) -> bytes:
        """``size`` bytes at absolute ``offset``, from the pages held (:meth:`cover` covered them)."""
        reader = self._reader
        parts = []
        while size > 0:
            page = (offset - reader.heap_offset) // reader.page_size
            start, end = reader.page_bounds(page)
            taken = min(size, end - offset)
            parts.append(self._pages[page][offset - start : offset - start + taken])
            offset, size = offset + taken, size - taken
        return b"".join(part.tobytes() for part in parts) if len(parts) != 1 else parts[0].tobytes()
