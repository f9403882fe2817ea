"""Several beton files as one dataset (:class:`ShardedDataset`), and :func:`open_dataset`, the one road from what a
Loader is given to what it reads.

A Loader reads *a dataset*: fields, a data table, an allocation table, a heap of pages and a page source. One file
is a :class:`~beton.storage.reader.Reader`. Several files (a list, a glob, a manifest file, a
:class:`~beton.dataset.manifest.Manifest`: whatever :func:`~beton.dataset.shards.dataset_manifest` takes) are a
:class:`ShardedDataset`, which presents their union in the same shape, so the orders, the memory layer and the epoch
engine read it as they read one file, without knowing how many files there are:

* **Global sample indices** run across the shards in order: sample ``g`` is sample ``g - start`` of the shard whose
  ``[start, end)`` holds it (:meth:`~beton.dataset.manifest.Manifest.locate`). The data table and the allocation
  table are the shards' tables concatenated (copies, made once on opening).
* **One virtual address space**: every shard's heap pages are numbered after the previous shard's (shard k's page p
  is virtual page ``first_page[k] + p``), and the allocation offsets move with their pages, so a virtual offset
  names one byte of one shard. A shard's last page may be short: ``page_ends`` holds where every virtual page ends,
  and no payload lies after a short page's end (each shard's Reader checked its payloads against its own heap).
* **Pages** come through :class:`ShardedPages`, a :class:`~beton.storage.page_source.PageSource` that maps a virtual
  range to (shard, offset) and reads it from that shard's own page source: a local file (``preadv``, checked for
  changes) or a URL (ranges with retries, CRC32 on arrival, the disk cache), as for a single file.

Refused, with a :class:`~beton.errors.ShardError` naming the shard: fields that differ from the first shard's (the
first difference), a shard whose header's SHA-256 or sample count is not what its manifest lists, shards whose page
sizes differ (their pages would not line up in one address space; ``beton merge --page-size`` makes one file of
them), FFCV files (no checksums). A shard that is not there is a :class:`~beton.errors.ShardNotFoundError`.

No shard stays open. Opening a manifest file with a tables file (what ``beton index`` writes) reads that file
instead of any shard (:mod:`beton.dataset.tables_file`), and each shard is compared with it when first opened;
otherwise opening reads each shard's tables once (:mod:`beton.dataset.shard_tables`: small local shards read
whole and checked together, others one by one; the first shard as a Reader, for its fields) and closes it.
Pages are read through shards opened when an epoch reaches them and closed, least recently read first, beyond
``max_open_shards`` (:data:`DEFAULT_OPEN_SHARDS`), so descriptors, maps and fetch pools stay bounded whatever the
shard count.

Memory: the data and allocation tables joined (copies), 8 bytes per page and a few integers per shard. Remote
shards share one read-ahead budget: each open one gets ``prefetch_bytes`` divided by the number that can be open
at once (at least one page), so the pages fetched ahead stay within what one remote file holds.

The OS cache (one memory map) cannot present several files as one buffer: over a ShardedDataset it maps each local
shard as a batch needs it and copies the batch's payloads out (:class:`~beton.memory.os_cache.ShardMapsLayer`);
the process cache, a Loader's default for several files, reads their pages.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import dataclasses
import hashlib
import mmap
import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal, Union

import numpy as np

from beton.errors import (BetonError, FormatError, LoaderError, NotAFileError, ShardError, ShardNotFoundError,
                          error_context, locate)
from beton.fields.base import Field
from beton.limits import ReadLimits, max_image_pixels_from_environment
from beton.storage import page_source
from beton.dataset.manifest import Manifest, header_digest
from beton.dataset.shard_tables import (FirstShard, ShardTables, UnionTables, check_payload_columns, read_small_tables,
                                         records, tables_of_reader)
from beton.dataset.tables_file import check_shard_tables, read_tables_file
from beton.storage import format as fmt
from beton.storage.digests import PageDigests
from beton.storage.metadata import decode_metadata
from beton.storage.page_source import LocalFile, PageSource
from beton.storage.reader import Reader, TableNames, instantiate_fields
from beton.storage.remote import RemoteOptions, RemotePageSource, is_url, remote_or_default
from beton.storage.remote.pages import expected_reads
from beton.dataset.shards import Source, dataset_manifest, names_one_file

__all__ = ["ShardedDataset", "ShardedPages", "open_dataset", "open_page_source", "page_digests", "content_digest",
           "OpenedDataset", "DEFAULT_OPEN_SHARDS"]

_MAX_CONCURRENT_OPENS = 16  # remote shards whose headers and tables are fetched at once
#: Shards a dataset's page source holds open at once (a descriptor each, or for a URL a pool of fetch threads):
#: opening one more closes the least recently read. Enough for the shards a few batches of any order touch
#: together; ``ShardedDataset(..., max_open_shards=...)`` sets another bound.
DEFAULT_OPEN_SHARDS = 64

#: What a Loader reads: one file, or several as one.
OpenedDataset = Union[Reader, "ShardedDataset"]


def open_dataset(source: Source, *, custom_fields: Mapping[str, type[Field]] | None = None,
                 max_image_pixels: int | None | Literal["environment"] = "environment",
                 remote: RemoteOptions | None = None, verify_content: bool = False) -> OpenedDataset:
    """The dataset ``source`` names, opened and validated: a :class:`Reader` for one beton file (a path or URL that
    is neither a glob nor a manifest file: exactly what ``Reader(source)`` gives), else a :class:`ShardedDataset`
    (a list, even of one file; a glob; a manifest file; a Manifest). The arguments are the Reader's."""
    if names_one_file(source):
        return Reader(source, custom_fields=custom_fields, max_image_pixels=max_image_pixels, remote=remote,
                      verify_content=verify_content)
    manifest = dataset_manifest(source, remote=remote)
    return ShardedDataset(manifest, description=_describe(source, manifest), custom_fields=custom_fields,
                          max_image_pixels=max_image_pixels, verify_content=verify_content)


def content_digest(dataset: OpenedDataset) -> str:
    """A short hex digest naming the dataset's content, not where it lies (the same on another node, under another
    path or URL): of its files' header digests in order (each header holds the CRC32 of every table and page, and
    the digest of its digest table), or, for an FFCV file (no checksums), of its tables."""
    if isinstance(dataset, ShardedDataset):
        parts = list(dataset.manifest.shards.digests)
    elif dataset.checksummed:
        parts = [header_digest(dataset.header.tobytes())]
    else:
        parts = [hashlib.sha256(dataset.data_table.tobytes() + dataset.allocation_table.tobytes()).hexdigest()]
    return hashlib.blake2b("/".join(parts).encode(), digest_size=8).hexdigest()


def page_digests(dataset: OpenedDataset) -> PageDigests | None:
    """What a memory layer checks the pages it first loads against (``verify_content``): a new record, no page
    checked yet, of the digests of the pages of every file whose content is checked; None where none is."""
    if not isinstance(dataset, ShardedDataset):
        return PageDigests.of(dataset)
    if dataset.page_digests is None:
        return None
    return PageDigests(list(dataset.manifest.shards.locations), dataset.page_digests, dataset.first_page,
                       np.zeros(dataset.num_pages, bool))


def open_page_source(dataset: OpenedDataset) -> PageSource:
    """Where the process cache reads a dataset's pages: the file's own page source for a Reader (local or remote),
    :class:`ShardedPages` for several files."""
    if isinstance(dataset, ShardedDataset):
        pages = ShardedPages(dataset)
        dataset._page_sources.append(pages)  # closed with the dataset
        return pages
    return page_source.open_page_source(dataset)


class ShardedDataset(TableNames):
    """Several beton files as one, in the shape of a :class:`~beton.storage.reader.Reader` (module docstring).

    Attributes, as a Reader's: ``path`` (a description: the manifest file, the glob, or the first file and how many
    more), ``num_samples``, ``fields``, ``descriptors``, ``data_table``, ``allocation_table`` (offsets in the virtual
    address space), ``handlers`` and ``alloc_table`` (FFCV's names for ``fields`` and ``allocation_table``),
    ``page_size``, ``num_pages``, ``heap_offset``, ``heap_size``, ``page_ends``. Its own: ``manifest`` (the shards
    in order, their global ranges), ``first_page`` (int64, ``len(shards) + 1``: shard k's pages are virtual pages
    ``first_page[k]`` to ``first_page[k + 1]``), ``shifts`` (virtual offset minus the shard's own offset, per
    shard), ``heap_ends`` (where each shard's heap ends, virtually), ``file_sizes`` (each file's size when opened)
    and ``max_open_shards`` (how many shards its page sources hold open at once).

    ``verify_content`` is the Reader's, for every shard (the shards of a manifest file are always checked:
    :meth:`~beton.dataset.manifest.Manifest.content_checks`); every shard's tables are checked on opening,
    and its pages as a Loader first loads them. Attributes: ``verify_content`` (whether the shards' pages are
    checked), ``page_digests`` (the stored digest of every virtual page; None when they are not).

    No shard stays open: opening reads each shard's tables and closes it; pages are read through
    :class:`ShardedPages`, which opens shards as an epoch reaches them. ``dataset[g]`` and :meth:`payload` take
    global sample indices (each opens the shard's Reader for the call). :meth:`close` (or leaving a ``with`` block)
    closes every page source made from it. Shards at URLs are opened as ``remote`` says (default: the manifest's
    own :class:`~beton.storage.remote.RemoteOptions`).
    """

    def __init__(self, manifest: Manifest, *, description: str | None = None,
                 custom_fields: Mapping[str, type[Field]] | None = None,
                 max_image_pixels: int | None | Literal["environment"] = "environment",
                 remote: RemoteOptions | None = None, max_open_shards: int = DEFAULT_OPEN_SHARDS,
                 verify_content: bool = False) -> None:
        if not manifest.shards:
            raise ShardError("no shards given: a dataset has at least one file")
        if isinstance(max_open_shards, bool) or not isinstance(max_open_shards, int) or max_open_shards < 1:
            raise ValueError(f"max_open_shards must be a positive integer, got {max_open_shards!r}")
        self.manifest = manifest
        self.path = description or _describe(manifest, manifest)
        self.max_open_shards = max_open_shards
        locations = manifest.shards.locations
        # a URL has "://" or "::" (is_url): where no location has either, none is a URL, for one search
        maybe_urls = any(mark in "\n".join(locations) for mark in ("://", "::"))
        self.remote_shards = _read_only(np.array([is_url(location) for location in locations] if maybe_urls else
                                                 np.zeros(len(locations)), bool))
        self._remote = _shared_budget(remote if remote is not None else manifest.remote,
                                      int(self.remote_shards.sum()), max_open_shards)
        self._reader_options = dict(custom_fields=custom_fields, max_image_pixels=max_image_pixels,
                                    verify_content=verify_content)
        self._page_sources: list[ShardedPages] = []
        self._content_checks = manifest.content_checks(verify_content)
        #: shards whose tables came from the manifest's tables file and whose files are not yet compared with them
        self._unchecked: np.ndarray | None = None
        if manifest.tables is not None:
            opened = read_tables_file(manifest, self._content_checks, self._remote)
            self.format = f"beton v{int(opened.header['version'])}"
            self.max_image_pixels = (max_image_pixels_from_environment() if max_image_pixels == "environment"
                                     else max_image_pixels)
            self.descriptors = opened.descriptors
            with error_context(path=manifest.shards[0].location):
                self.fields = instantiate_fields(self.descriptors, custom_fields)
            tables, first = opened.tables, opened.first
            self._unchecked = np.ones(len(manifest.shards), bool)
        else:
            with self.open_shard(0) as first_reader:
                first_tables, first = tables_of_reader(first_reader)
                self.format, self.max_image_pixels = first_reader.format, first_reader.max_image_pixels
                self.fields, self.descriptors = first_reader.fields, first_reader.descriptors
            tables = UnionTables.of([first_tables, *_read_tables(self, first, self._content_checks)])
        self._first = first
        self._join(tables, first)
        self._check_records(tables, first)
        self._join_digests(tables)
        self._metadata_json = tables.metadata[0]
        self._other_metadata = {number: raw for number, raw in enumerate(tables.metadata) if raw != tables.metadata[0]}
        for number, raw in self._other_metadata.items():
            with error_context(path=manifest.shards[number].location):
                decode_metadata(raw)  # checked on open, as a Reader checks its own

    def _join(self, tables: UnionTables, first: FirstShard) -> None:
        shards, page_size = self.manifest.shards, int(tables.page_sizes[0])
        for number in np.flatnonzero(tables.page_sizes != page_size)[:1].tolist():
            raise locate(ShardError(
                f"shard {number} has pages of {int(tables.page_sizes[number])} bytes, shard 0 ({shards[0].location}) "
                f"of {page_size}: the shards of one dataset share a page size (rewrite them with one, or make "
                "one file of them with `beton merge --page-size`)"), path=shards[number].location)
        self.checksummed = True
        self.num_samples = self.manifest.num_samples
        self.page_size, self.heap_offset = page_size, int(tables.heap_offsets[0])
        counts, heap_offsets, heap_sizes = tables.num_pages, tables.heap_offsets, tables.heap_sizes
        self.first_page = _read_only(np.concatenate([[0], np.cumsum(counts)]).astype(np.int64))
        self.num_pages = int(self.first_page[-1])
        self.shifts = _read_only(self.heap_offset + self.first_page[:-1] * self.page_size - heap_offsets)
        self.heap_ends = _read_only(self.shifts + heap_offsets + heap_sizes)
        self.file_sizes = _read_only(tables.sizes.copy())
        # each local shard as its tables were read (None until then where they came from a tables file)
        self._identities = list(tables.identities or [None] * len(shards))
        self._tables_offsets = tables.table_offsets
        shard_of_page = np.repeat(np.arange(len(shards)), counts)
        local_end = (np.arange(self.num_pages, dtype=np.int64) - self.first_page[shard_of_page] + 1) * self.page_size
        self.page_ends = _read_only(heap_offsets[shard_of_page] + np.minimum(local_end, heap_sizes[shard_of_page])
                                    + self.shifts[shard_of_page])
        self.heap_size = int(self.page_ends[-1]) - self.heap_offset if self.num_pages else 0
        self.data_table = records(tables.data, first.data_dtype, (self.num_samples,))
        allocation = records(tables.allocations, fmt.ALLOCATION_DTYPE,
                             (self.num_samples, first.num_payload_fields)).copy()
        samples = np.diff(self.manifest.bounds)
        allocation["offset"] += np.repeat(self.shifts, samples).astype(np.uint64)[:, None]
        self.allocation_table = _read_only(allocation)

    def _check_records(self, tables: UnionTables, first: FirstShard) -> None:
        """Every field's records, checked once over the union (bounded by the largest shard's size); where that
        fails, each shard's alone as its Reader checks them, so that the error names the shard."""
        try:
            _check_records(self.fields, self.descriptors, self.data_table, self.allocation_table,
                           ReadLimits(self.max_image_pixels, max_payload_bytes=int(self.file_sizes.max())))
        except BetonError:
            data = records(tables.data, first.data_dtype, (self.num_samples,))
            allocation = records(tables.allocations, fmt.ALLOCATION_DTYPE, (self.num_samples, first.num_payload_fields))
            bounds = self.manifest.bounds.tolist()
            for number, shard in enumerate(self.manifest.shards):
                with error_context(path=shard.location):
                    rows = slice(bounds[number], bounds[number + 1])
                    _check_records(self.fields, self.descriptors, data[rows], allocation[rows],
                                   ReadLimits(self.max_image_pixels, max_payload_bytes=int(tables.sizes[number])))
            raise

    def _join_digests(self, tables: UnionTables) -> None:
        """The shards' page digests where their content is checked, in the virtual page numbering. Every shard is
        read with the same ``verify_content``, so all have them or none: one without them among others fails the
        join rather than turn every shard's checks off."""
        self.verify_content = any(digests is not None for digests in tables.page_digests)
        self.page_digests: np.ndarray | None = None
        if self.verify_content:
            joined = b"".join(tables.page_digests)  # type: ignore[arg-type]  (every shard's are there)
            self.page_digests = _read_only(np.frombuffer(joined, np.uint8).reshape(self.num_pages, fmt.DIGEST_SIZE))

    # ---- the Reader's reading surface ---------------------------------------------------------------------

    @property
    def metadata(self) -> dict[str, Any]:
        """The shards' file-level metadata, which must be the same in every shard (a new dict on each access);
        ShardError naming the first shard and key that differ otherwise."""
        first = decode_metadata(self._metadata_json)
        for number in sorted(self._other_metadata):
            other = decode_metadata(self._other_metadata[number])
            if other != first:
                key = next(key for key in sorted(set(first) | set(other), key=str) if first.get(key, ...) !=
                           other.get(key, ...))
                raise locate(ShardError(f"shard {number}'s file-level metadata differs from shard 0's at key {key!r}: "
                                        "a dataset of several files has the metadata they share"),
                             path=self.manifest.shards[number].location)
        return first

    def __len__(self) -> int:
        return self.num_samples

    def shard_of(self, index: int) -> tuple[int, int]:
        """(shard number, index within that shard) of global sample ``index`` (negative counts from the end)."""
        position = int(index)
        if position < 0:
            position += self.num_samples
        shard, local = self.manifest.locate(np.array([position], np.int64))
        return int(shard[0]), int(local[0])

    def __getitem__(self, index: int) -> tuple[Any, ...]:
        """Sample ``index`` (global), decoded as ``Reader.__getitem__`` does; errors name the shard's file and the
        sample's index in it."""
        shard, local = self.shard_of(index)
        with self.open_shard(shard) as reader:
            return reader[local]

    def payload(self, index: int, field: str) -> np.ndarray | None:
        """The raw payload bytes of global sample ``index``'s field (read-only), or None for no payload."""
        shard, local = self.shard_of(index)
        with self.open_shard(shard) as reader:
            return reader.payload(local, field)

    def open_shard(self, number: int) -> Reader:
        """Shard ``number`` as a :class:`~beton.storage.reader.Reader`, checked against the manifest (the caller
        closes it); :class:`~beton.errors.ShardNotFoundError` naming it where it is missing."""
        try:
            return self.manifest.open_shard(number, remote=self._remote, **self._reader_options)
        except FileNotFoundError as error:
            if isinstance(error, BetonError):
                raise
            raise self._missing(number, error) from None

    def open_pages(self, number: int) -> PageSource:
        """A page source over shard ``number``, checked to be the file the tables were read from (its size, and its
        header's SHA-256 against the manifest): a ShardError naming it otherwise, a ShardNotFoundError where it is
        missing. The caller closes it."""
        shard = self.manifest.shards[number]
        # One look, before opening, decides whether the file is compared with the tables file: asking again after
        # the open could hear that another thread compared it meanwhile, while this thread opened a file replaced
        # in between (two threads open a shard at once: batches check their own shards while the page reader
        # reads). A local shard compared before is held to the identity recorded then.
        if self.remote_shards[number]:
            compare = self._unchecked is not None and bool(self._unchecked[number])
            reader = self.open_shard(number)
            try:
                if compare:
                    tables = tables_of_reader(reader)[0]
                    self._check_against_tables_file(number, tables.data, tables.allocations)
            except BaseException:
                reader.close()
                raise
            return RemotePageSource(reader.remote)  # type: ignore[arg-type]  (a URL's Reader has one)
        identity = self._identities[number]
        compare = self._unchecked is not None and identity is None
        try:
            source = LocalFile.reopened(shard.location, int(self.file_sizes[number]),
                                        lambda header: header_digest(header) == shard.header_sha256, identity)
        except FileNotFoundError as error:
            raise self._missing(number, error) from None
        except OSError as error:  # a file this user may no longer read, ...
            if isinstance(error, BetonError):
                raise
            raise locate(ShardError(f"shard {number} of {len(self.manifest.shards)} cannot be read: {error}"),
                         path=shard.location) from None
        except NotAFileError as error:
            raise locate(error, path=shard.location)
        except FormatError as error:
            if compare:  # opened for the first time
                raise locate(ShardError(
                    f"shard {number} of {len(self.manifest.shards)} is not the file the manifest lists: its size or "
                    "its header's SHA-256 is not the one the manifest and its tables file give (the file changed "
                    "since `beton index` ran; run it again)"), path=shard.location) from None
            raise locate(ShardError(f"shard {number} of {len(self.manifest.shards)} is not the file this dataset "
                                    f"opened: {error.args[0]}"), path=shard.location) from None
        if compare:
            try:
                self._check_local_against_tables_file(number, source)
            except BaseException:
                source.close()
                raise
        return source

    def unchecked_shards(self, samples: np.ndarray) -> np.ndarray:
        """The shards (ascending) that ``samples`` lie in and that were not yet compared with the manifest's
        tables file (none without one)."""
        if self._unchecked is None or not len(samples):
            return np.zeros(0, np.int64)
        shards = np.unique(self.manifest.locate(samples)[0])
        return shards[self._unchecked[shards]]

    def _check_local_against_tables_file(self, number: int, source: LocalFile) -> None:
        """Compare local shard ``number``, just opened (its size and header's SHA-256 are the manifest's), with the
        tables file: its data and allocation tables, read where its header (in the tables file) says they lie.
        Then it is the file it was, unmodified, when it is opened again (its identity recorded now)."""
        assert self._tables_offsets is not None
        low, high = (int(bound) for bound in self.manifest.bounds[number : number + 2])
        data_offset, allocation_offset = (int(offset) for offset in self._tables_offsets[number])
        data = os.pread(source.fd, (high - low) * self.data_table.dtype.itemsize, data_offset)
        allocations = os.pread(source.fd, (high - low) * self.allocation_table.shape[1] *
                               fmt.ALLOCATION_DTYPE.itemsize, allocation_offset)
        self._check_against_tables_file(number, data, allocations)
        self._identities[number] = source.identity

    def _check_against_tables_file(self, number: int, data: bytes, allocations: bytes) -> None:
        """ShardError naming shard ``number`` unless its data and allocation tables (``data``, ``allocations``: as
        its file stores them) are the ones the manifest's tables file gave for it; then it is not compared again.
        (The tables file's tables were checked against the shard's header on opening, and its header is the
        manifest's: this catches a file whose tables differ from what its header says.)"""
        assert self._unchecked is not None
        low, high = (int(bound) for bound in self.manifest.bounds[number : number + 2])
        listed = self.allocation_table[low:high].copy()  # as the shard stores it: its own offsets
        listed["offset"] -= np.uint64(self.shifts[number])
        check_shard_tables(self.manifest, number, (data, allocations),
                           (self.data_table[low:high].tobytes(), listed.tobytes()))
        self._unchecked[number] = False

    def _missing(self, number: int, error: OSError) -> ShardNotFoundError:
        return locate(ShardNotFoundError(f"shard {number} of {len(self.manifest.shards)} is missing: {error}"),
                      path=self.manifest.shards[number].location)

    def close(self) -> None:
        """Close every shard the page sources made from this dataset hold open (arrays already handed out stay
        valid)."""
        for pages in self._page_sources:
            pages.close()
        self._page_sources = []

    def __enter__(self) -> ShardedDataset:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"ShardedDataset({self.path!r}, shards={len(self.manifest.shards)}, num_samples={self.num_samples}, "
                f"fields={self.field_names})")


class ShardedPages:
    """The process cache's page source over a :class:`ShardedDataset`: virtual byte ranges read from the shards'
    own page sources (see :class:`~beton.storage.page_source.PageSource` for the contract), opened when a read
    first reaches them and closed, least recently read first, once more than ``dataset.max_open_shards`` are open.

    A shard opened is checked to be the file whose tables were read (:meth:`ShardedDataset.open_pages`); one that
    is gone raises :class:`~beton.errors.ShardNotFoundError` naming it, from the read that needed it. ``check()``
    (per batch) checks the open shards whose pages were read since the last check, and a shard closed to make room
    is checked as it is closed, so a batch's pages are always read before a check of their file passes;
    ``check_path()`` (per epoch) checks the shards open (the others are checked when opened). ``will_read`` works
    out the epoch's page reads once (:func:`~beton.storage.remote.pages.expected_reads`, over the cache's one
    budget) and tells each remote shard its part, in order, when it is open or opens.

    Concurrency: ``read_into`` (which opens and closes shards) runs in the page reader's thread, ``check`` in
    workers; the open shards and the set read since the last check are guarded by one lock, and a shard joins that
    set only once its read is complete.
    """

    def __init__(self, dataset: ShardedDataset) -> None:
        self.description = dataset.path
        self.size = dataset.heap_offset + dataset.heap_size
        self._dataset = dataset
        self._heap_offset, self._page_size = dataset.heap_offset, dataset.page_size
        self._first_page, self._shifts, self._heap_ends = dataset.first_page, dataset.shifts, dataset.heap_ends
        self._limit = dataset.max_open_shards
        self._lock = threading.Lock()
        self._open: collections.OrderedDict[int, PageSource] = collections.OrderedDict()  # least recent first
        self._read_since_check: set[int] = set()
        self._plans: dict[int, np.ndarray] = {}  # remote shard -> the pages the epoch reads of it, in order
        self._reads: collections.Counter[int] = collections.Counter()  # remote shard -> reads so far this epoch
        self._pins: collections.Counter[int] = collections.Counter()  # shard -> blocks reading it now
        self._maps: dict[int, _Map] = {}  # shard -> its memory map, for the OS cache
        self._madvise_random = False
        self._closed = False

    def read_into(self, offset: int, out: np.ndarray, what: str) -> None:
        done = 0
        while done < len(out):
            position = offset + done
            page = (position - self._heap_offset) // self._page_size
            shard = int(np.searchsorted(self._first_page[1:], page, side="right"))
            if position < self._heap_offset or shard >= len(self._heap_ends) or position >= self._heap_ends[shard]:
                raise ValueError(f"{what}: byte {position} lies in no shard's heap of {self.description!r}")
            count = min(len(out) - done, int(self._heap_ends[shard]) - position)
            local_page = page - int(self._first_page[shard])
            with self.opened(shard) as source:
                source.read_into(position - int(self._shifts[shard]), out[done : done + count],
                                 f"page {local_page} (shard {shard})")
            with self._lock:
                self._reads[shard] += 1
            done += count

    @contextlib.contextmanager
    def opened(self, shard: int) -> Iterator[PageSource]:
        """Shard ``shard``'s page source, open (and the least recently used closed, where more than the limit are
        open) and kept open while the block runs; the shard counts as read since the last check once it ends. A
        shard is opened outside the lock (a URL's round trips, a first comparison with the tables file) and
        published under it, so that reads and checks of the other shards do not wait for it."""
        with self._lock:
            self._raise_if_closed()
            source = self._open.get(shard)
            if source is not None:
                self._open.move_to_end(shard)
                self._pins[shard] += 1
        if source is None:
            fresh = self._dataset.open_pages(shard)
            with self._lock:
                try:
                    source = self._published(shard, fresh)
                except BaseException:
                    if self._open.get(shard) is not fresh:  # not published (closed since, or opened twice)
                        fresh.close()
                    raise
                self._pins[shard] += 1
        try:
            yield source
        finally:
            with self._lock:
                self._pins[shard] -= 1
                self._read_since_check.add(shard)

    @contextlib.contextmanager
    def mapped(self, shard: int) -> Iterator[np.ndarray]:
        """Local shard ``shard``'s file as a read-only uint8 memory map (read with the same checks as
        :meth:`opened`, for the OS cache), kept open while the block runs."""
        with self.opened(shard) as source:
            with self._lock:
                if shard not in self._maps:
                    self._maps[shard] = _Map(source.fd, self._madvise_random)  # type: ignore[attr-defined]
                view = self._maps[shard].view
            yield view

    def _published(self, shard: int, fresh: PageSource) -> PageSource:
        """(With the lock held.) ``fresh``, just opened, as shard ``shard``'s page source (or the one another
        thread published meanwhile, ``fresh`` closed), told the epoch's reads of it; then the least recently used
        shards nobody is reading are closed beyond the limit, each checked first where its pages were read since
        the last check."""
        self._raise_if_closed()
        if shard in self._open:
            fresh.close()
            self._open.move_to_end(shard)
            return self._open[shard]
        source = self._open[shard] = fresh
        plan = self._plans.get(shard)
        if plan is not None:
            source.fetch_ahead(plan[self._reads[shard] :])  # type: ignore[attr-defined]  (a RemotePageSource)
        for number in [number for number in self._open if not self._pins[number] and number != shard]:
            if len(self._open) <= self._limit:
                break
            self._close_shard(number, check=True)
        return source

    def _close_shard(self, number: int, check: bool) -> None:
        source = self._open.pop(number)
        mapping = self._maps.pop(number, None)
        try:
            if check and number in self._read_since_check:
                self._read_since_check.discard(number)
                source.check()  # its pages were read before this check
        finally:
            if mapping is not None:
                mapping.close()
            source.close()

    def _raise_if_closed(self) -> None:
        if self._closed:
            raise LoaderError(f"{self.description}: the Loader was closed")

    def check(self) -> None:
        """Check every open shard read since the last check; each that fails stays to be checked again, and the
        error raised (the first shard's) names the others that failed."""
        with self._lock:
            self._raise_if_closed()
            failures: list[tuple[int, BaseException]] = []
            for shard in sorted(self._read_since_check):
                try:
                    self._open[shard].check()
                except BetonError as error:
                    failures.append((shard, error))
                else:
                    self._read_since_check.discard(shard)
        if failures:
            shard, error = failures[0]
            if len(failures) > 1:
                locate(error, note=f"(shards {', '.join(str(number) for number, _ in failures[1:])} of "
                                   f"{self.description} failed their checks too)")
            raise error

    def will_serve(self, samples: np.ndarray) -> None:
        """Compare with the tables file every shard a batch's ``samples`` lie in that was not compared yet, before
        any value of the batch is read: a field without payloads (an IntField) takes its values from the tables
        file, and no page read would ever open its shard. Several at once where some are URLs. Per batch, not
        for the whole epoch at its start, which opened every shard of a large union before anything was served,
        and again for its pages once the bound on open shards had closed it (the memory layer leaves out the
        samples whose pages the batch reads: :meth:`~beton.memory.base.MemoryLayer.will_serve`)."""
        shards = self._dataset.unchecked_shards(samples)
        if len(shards) == 0:
            return

        def compare(shard: int) -> None:
            with self.opened(shard):
                pass

        if not self._dataset.remote_shards[shards].any():
            for shard in shards.tolist():
                compare(shard)
            return
        with concurrent.futures.ThreadPoolExecutor(min(len(shards), _MAX_CONCURRENT_OPENS),
                                                   thread_name_prefix="beton-shard-check") as pool:
            list(pool.map(compare, shards.tolist()))  # the first failure in order is raised

    def sample_file(self, sample: int) -> tuple[str, int]:
        shard, local = self._dataset.shard_of(sample)
        return self._dataset.manifest.shards[shard].location, local

    def check_path(self) -> None:
        with self._lock:
            self._raise_if_closed()
            opened = list(self._open.items())
            local = [source for number, source in opened if not self._dataset.remote_shards[number]]
            remote = [source for number, source in opened if self._dataset.remote_shards[number]]
            for source in local:
                source.check_path()  # a stat
            if len(remote) < 2:
                for source in remote:
                    source.check_path()
                return
            # a request per remote file: several at once, the first failure in order raised
            with concurrent.futures.ThreadPoolExecutor(min(len(remote), _MAX_CONCURRENT_OPENS),
                                                       thread_name_prefix="beton-identity") as pool:
                list(pool.map(lambda source: source.check_path(), remote))  # the first failure in order raised

    def will_read(self, batch_pages: Sequence[np.ndarray], budget_pages: int) -> None:
        remote_shards = self._dataset.remote_shards
        if not remote_shards.any():
            return  # local files read when asked, the kernel reading ahead
        reads = expected_reads(batch_pages, budget_pages)
        shard_of = np.searchsorted(self._first_page[1:], reads, side="right")
        order = np.argsort(shard_of, kind="stable")  # each shard's reads, in the epoch's order
        shards, starts, counts = np.unique(shard_of[order], return_index=True, return_counts=True)
        with self._lock:
            self._plans, self._reads = {}, collections.Counter()
            for shard, start, count in zip(shards.tolist(), starts.tolist(), counts.tolist()):
                if remote_shards[shard]:
                    self._plans[shard] = reads[order[start : start + count]] - self._first_page[shard]
            for shard, source in self._open.items():
                if shard in self._plans:
                    source.fetch_ahead(self._plans[shard])  # type: ignore[attr-defined]  (a RemotePageSource)

    def advise_random_access(self) -> None:
        """Map shards with ``MADV_RANDOM`` (the OS cache's ``readahead=False``)."""
        self._madvise_random = True

    def close(self) -> None:
        with self._lock:
            self._closed = True
            for number in list(self._open):
                self._close_shard(number, check=False)


class _Map:
    """A read-only memory map of an open descriptor, as a uint8 array, closed at once unless a view of it is still
    held somewhere (then it goes with that view)."""

    def __init__(self, descriptor: int, random_access: bool) -> None:
        self._mapping = mmap.mmap(descriptor, 0, access=mmap.ACCESS_READ)
        if random_access and hasattr(self._mapping, "madvise") and hasattr(mmap, "MADV_RANDOM"):
            self._mapping.madvise(mmap.MADV_RANDOM)
        self.view = np.frombuffer(self._mapping, np.uint8)

    def close(self) -> None:
        del self.view
        try:
            self._mapping.close()
        except BufferError:
            pass


# ---- opening ----------------------------------------------------------------------------------------------

def _shared_budget(remote: RemoteOptions | None, urls: int, max_open_shards: int) -> RemoteOptions | None:
    """The remote options each remote shard is opened with: one read-ahead budget shared by the remote shards
    that can be open at once (see the module docstring)."""
    if urls < 2:
        return remote
    remote = remote_or_default(remote)
    return dataclasses.replace(remote, prefetch_bytes=max(1, remote.prefetch_bytes // min(urls, max_open_shards)))


def _read_tables(dataset: ShardedDataset, first: FirstShard, verify_content: bool | None) -> list[ShardTables]:
    """The tables of every shard after the first, in order, each shard closed once read (local files together:
    :func:`~beton.dataset.shard_tables.read_small_tables`; URLs several at once), their content checked as
    ``verify_content`` says. A failure among the local files is raised before one among the URLs."""
    numbers = range(1, len(dataset.manifest.shards))
    local = [number for number in numbers if not dataset.remote_shards[number]]
    urls = [number for number in numbers if dataset.remote_shards[number]]
    tables = dict(zip(local, read_small_tables(dataset.manifest, local, first, verify_content)))

    def remote_tables(number: int) -> ShardTables:
        with dataset.open_shard(number) as reader:  # its fields checked against the manifest's as it opened
            check_payload_columns(dataset.manifest, number, list(reader.descriptors.values()), first)
            return tables_of_reader(reader)[0]

    if urls:
        pool = concurrent.futures.ThreadPoolExecutor(min(len(urls), _MAX_CONCURRENT_OPENS),
                                                     thread_name_prefix="beton-open")
        try:
            tables.update(zip(urls, pool.map(remote_tables, urls)))  # the first failure in order is raised
        finally:
            pool.shutdown(cancel_futures=True)
    return [tables[number] for number in numbers]


def _check_records(fields: Mapping[str, Field], descriptors: Mapping[str, Any], data_table: np.ndarray,
                   allocation_table: np.ndarray, limits: ReadLimits) -> None:
    """Every field's stored records against what it can read, as a Reader checks them on open."""
    for name, field in fields.items():
        column = descriptors[name].payload_column
        sizes = allocation_table[:, column]["size"] if descriptors[name].has_payload else None
        with error_context(field=name):
            field.check_records(data_table[name], sizes, limits)


def _describe(source: Any, manifest: Manifest) -> str:
    """How a dataset of several files is named in messages and ``repr``: the manifest file, the glob, or the first
    file and how many more."""
    if manifest.source is not None:
        return manifest.source
    if isinstance(source, (str, os.PathLike)):
        return os.fspath(source)
    locations = [shard.location for shard in manifest.shards]
    return locations[0] if len(locations) == 1 else f"{locations[0]} and {len(locations) - 1} more files"


def _read_only(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False
    return array
