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

Memory: what each shard's Reader holds (its tables; for a URL, fetched and bounded by the file's size), the
concatenated copies of the data and allocation tables, and 8 bytes per page. Remote shards share one read-ahead
budget: each gets ``prefetch_bytes`` divided by the number of remote shards (at least one page), so the pages
fetched ahead stay within what one remote file holds.

The OS cache (one memory map) cannot present several files as one buffer: a ShardedDataset is read through the
process cache, a Loader's default for it; ``OSCache`` with one is a ValueError.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import os
import threading
from collections.abc import Mapping, Sequence
from typing import Any, Literal, Union

import numpy as np

from beton.errors import BetonError, LoaderError, ShardError, ShardNotFoundError, locate
from beton.fields.base import Field
from beton.storage import page_source
from beton.dataset.manifest import Manifest, header_digest
from beton.storage.page_source import PageSource
from beton.storage.reader import Reader, TableNames
from beton.storage.remote import RemoteOptions, is_url, remote_or_default
from beton.storage.remote.pages import expected_reads
from beton.dataset.shards import Source, dataset_manifest, names_one_file

__all__ = ["ShardedDataset", "ShardedPages", "open_dataset", "open_page_source", "content_digest", "OpenedDataset"]

_MAX_CONCURRENT_OPENS = 16  # remote shards whose headers and tables are fetched at once

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
    path or URL): of its files' header digests in order (each header holds the CRC32 of every table and page),
    or, for an FFCV file (no checksums), of its tables."""
    if isinstance(dataset, ShardedDataset):
        parts = [shard.header_sha256 for shard in dataset.manifest.shards]
    elif dataset.checksummed:
        parts = [header_digest(dataset.header.tobytes())]
    else:
        parts = [hashlib.sha256(dataset.data_table.tobytes() + dataset.allocation_table.tobytes()).hexdigest()]
    return hashlib.blake2b("/".join(parts).encode(), digest_size=8).hexdigest()


def open_page_source(dataset: OpenedDataset) -> PageSource:
    """Where the process cache reads a dataset's pages: the file's own page source for a Reader (local or remote),
    :class:`ShardedPages` for several files."""
    if isinstance(dataset, ShardedDataset):
        return ShardedPages(dataset)
    return page_source.open_page_source(dataset)


class ShardedDataset(TableNames):
    """Several beton files as one, in the shape of a :class:`~beton.storage.reader.Reader` (module docstring).

    Attributes, as a Reader's: ``path`` (a description: the manifest file, the glob, or the first file and how many
    more), ``num_samples``, ``fields``, ``descriptors``, ``data_table``, ``allocation_table`` (offsets in the virtual
    address space), ``handlers`` and ``alloc_table`` (FFCV's names for ``fields`` and ``allocation_table``),
    ``page_size``, ``num_pages``, ``heap_offset``, ``heap_size``, ``page_ends``. Its own:
    ``manifest`` (the shards in order, their global ranges), ``readers`` (each shard's open Reader),
    ``first_page`` (int64, ``len(shards) + 1``: shard k's pages are virtual pages ``first_page[k]`` to
    ``first_page[k + 1]``) and ``shifts`` (virtual offset minus the shard's own offset, per shard).

    ``dataset[g]`` and :meth:`payload` take global sample indices. Close it (or use it as a context manager) to
    release the shards. Shards at URLs are opened as ``remote`` says (default: the manifest's own
    :class:`~beton.storage.remote.RemoteOptions`).
    """

    def __init__(self, manifest: Manifest, *, description: str | None = None,
                 custom_fields: Mapping[str, type[Field]] | None = None,
                 max_image_pixels: int | None | Literal["environment"] = "environment",
                 remote: RemoteOptions | None = None, verify_content: bool = False) -> None:
        if not manifest.shards:
            raise ShardError("no shards given: a dataset has at least one file")
        self.manifest = manifest
        self.path = description or _describe(manifest, manifest)
        self.readers: tuple[Reader, ...] = ()
        self.readers = _open_shards(manifest, dict(custom_fields=custom_fields, max_image_pixels=max_image_pixels,
                                                   verify_content=verify_content),
                                    remote if remote is not None else manifest.remote)
        try:
            self._join()
        except BaseException:
            self.close()
            raise

    def _join(self) -> None:
        readers, first = self.readers, self.readers[0]
        for number, reader in enumerate(readers):
            if reader.page_size != first.page_size:
                raise locate(ShardError(
                    f"shard {number} has pages of {reader.page_size} bytes, shard 0 ({readers[0].path}) of "
                    f"{first.page_size}: the shards of one dataset share a page size (rewrite them with one, or make "
                    "one file of them with `beton merge --page-size`)"), path=reader.path)
        self.checksummed = True
        self.format = first.format
        self.fields, self.descriptors = first.fields, first.descriptors
        self.num_samples = self.manifest.num_samples
        self.page_size = first.page_size
        self.heap_offset = first.heap_offset
        counts = np.array([reader.num_pages for reader in readers], np.int64)
        self.first_page = _read_only(np.concatenate([[0], np.cumsum(counts)]).astype(np.int64))
        self.num_pages = int(self.first_page[-1])
        self.shifts = _read_only(np.array(
            [self.heap_offset + int(self.first_page[k]) * self.page_size - reader.heap_offset
             for k, reader in enumerate(readers)], np.int64))
        ends = np.empty(self.num_pages, np.int64)
        for k, reader in enumerate(readers):
            local = np.arange(1, reader.num_pages + 1, dtype=np.int64) * reader.page_size
            ends[self.first_page[k] : self.first_page[k + 1]] = (
                reader.heap_offset + np.minimum(local, reader.heap_size) + self.shifts[k])
        self.page_ends = _read_only(ends)
        self.heap_size = int(ends[-1]) - self.heap_offset if self.num_pages else 0
        self.data_table = _read_only(np.concatenate([reader.data_table for reader in readers]))
        allocation = np.concatenate([reader.allocation_table for reader in readers])
        bounds = self.manifest.bounds
        for k in range(len(readers)):
            allocation["offset"][bounds[k] : bounds[k + 1]] += np.uint64(self.shifts[k])
        self.allocation_table = _read_only(allocation)

    # ---- the Reader's reading surface ---------------------------------------------------------------------

    @property
    def metadata(self) -> dict[str, Any]:
        """The shards' file-level metadata, which must be the same in every shard (a new dict on each access);
        ShardError naming the first shard and key that differ otherwise."""
        first = self.readers[0].metadata
        for number, reader in enumerate(self.readers[1:], 1):
            other = reader.metadata
            if other != first:
                key = next(key for key in sorted(set(first) | set(other), key=str) if first.get(key, ...) !=
                           other.get(key, ...))
                raise locate(ShardError(f"shard {number}'s file-level metadata differs from shard 0's at key {key!r}: "
                                        "a dataset of several files has the metadata they share"), path=reader.path)
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
        return self.readers[shard][local]

    def payload(self, index: int, field: str) -> np.ndarray | None:
        """The raw payload bytes of global sample ``index``'s field (read-only), or None for no payload."""
        shard, local = self.shard_of(index)
        return self.readers[shard].payload(local, field)

    def close(self) -> None:
        """Close every shard's Reader (arrays already handed out stay valid)."""
        for reader in self.readers:
            reader.close()

    def __enter__(self) -> ShardedDataset:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"ShardedDataset({self.path!r}, shards={len(self.readers)}, num_samples={self.num_samples}, "
                f"fields={self.field_names})")


class ShardedPages:
    """The process cache's page source over a :class:`ShardedDataset`: virtual byte ranges read from the shards'
    own page sources (see :class:`~beton.storage.page_source.PageSource` for the contract).

    ``check()`` (per batch) checks the shards whose pages were read since the last check, so a batch's pages
    are always read before a check of their file passes, and one file's batches cost one check, as for a single Reader;
    ``check_path()`` (per epoch) checks every shard. ``will_read`` works out the epoch's page reads once
    (:func:`~beton.storage.remote.pages.expected_reads`, over the cache's one budget) and tells each remote
    shard its part, in order.

    Concurrency: ``read_into`` runs in the page reader's thread, ``check`` in workers; the set of shards read
    since the last check is guarded by a lock, and a shard joins it only once its read is complete.
    """

    def __init__(self, dataset: ShardedDataset) -> None:
        self.description = dataset.path
        self.size = dataset.heap_offset + dataset.heap_size
        self._heap_offset, self._page_size = dataset.heap_offset, dataset.page_size
        self._first_page, self._shifts = dataset.first_page, dataset.shifts
        self._heap_ends = np.array([int(shift) + reader.heap_offset + reader.heap_size
                                    for shift, reader in zip(dataset.shifts, dataset.readers)], np.int64)
        self._remote = [number for number, reader in enumerate(dataset.readers) if reader.remote is not None]
        self._sources: list[PageSource] = []
        try:
            for reader in dataset.readers:
                self._sources.append(page_source.open_page_source(reader))
        except BaseException:
            self.close()
            raise
        self._lock = threading.Lock()
        self._read_since_check: set[int] = set()
        self._closed = False

    def read_into(self, offset: int, out: np.ndarray, what: str) -> None:
        done = 0
        while done < len(out):
            position = offset + done
            page = (position - self._heap_offset) // self._page_size
            shard = int(np.searchsorted(self._first_page[1:], page, side="right"))
            if position < self._heap_offset or shard >= len(self._sources) or position >= self._heap_ends[shard]:
                raise ValueError(f"{what}: byte {position} lies in no shard's heap of {self.description!r}")
            count = min(len(out) - done, int(self._heap_ends[shard]) - position)
            local_page = page - int(self._first_page[shard])
            self._sources[shard].read_into(position - int(self._shifts[shard]), out[done : done + count],
                                           f"page {local_page} (shard {shard})")
            with self._lock:
                self._read_since_check.add(shard)
            done += count

    def check(self) -> None:
        if self._closed:
            raise LoaderError(f"{self.description}: the Loader was closed")
        with self._lock:
            shards, self._read_since_check = self._read_since_check, set()
        for shard in sorted(shards):
            self._sources[shard].check()

    def check_path(self) -> None:
        if self._closed:
            raise LoaderError(f"{self.description}: the Loader was closed")
        remote = set(self._remote)
        for number, source in enumerate(self._sources):
            if number not in remote:
                source.check_path()  # a stat
        if len(remote) < 2:
            for number in remote:
                self._sources[number].check_path()
            return
        # a request per remote file: several at once, the first failure in order raised
        with concurrent.futures.ThreadPoolExecutor(min(len(remote), _MAX_CONCURRENT_OPENS),
                                                   thread_name_prefix="beton-identity") as pool:
            for future in [pool.submit(self._sources[number].check_path) for number in self._remote]:
                future.result()

    def will_read(self, batch_pages: Sequence[np.ndarray], budget_pages: int) -> None:
        if not self._remote:
            return  # local files read when asked, the kernel reading ahead
        reads = expected_reads(batch_pages, budget_pages)
        shard_of = np.searchsorted(self._first_page[1:], reads, side="right")
        order = np.argsort(shard_of, kind="stable")  # each shard's reads, in the epoch's order
        ends = np.cumsum(np.bincount(shard_of, minlength=len(self._sources)))
        for shard in self._remote:
            start = int(ends[shard - 1]) if shard else 0
            pages = reads[order[start : int(ends[shard])]] - self._first_page[shard]
            self._sources[shard].fetch_ahead(pages)  # type: ignore[attr-defined]  (a RemotePageSource)

    def close(self) -> None:
        self._closed = True
        for source in self._sources:
            source.close()


# ---- opening ----------------------------------------------------------------------------------------------

def _open_shards(manifest: Manifest, reader_options: dict[str, Any],
                 remote: RemoteOptions | None) -> tuple[Reader, ...]:
    """Every shard opened and checked against the manifest, in order (URLs several at once); on failure, the ones
    opened are closed and the first failure in order is raised."""
    locations = [shard.location for shard in manifest.shards]
    urls = sum(1 for location in locations if is_url(location))
    if urls > 1:  # one read-ahead budget for all: see the module docstring
        remote = remote_or_default(remote)
        remote = dataclasses.replace(remote, prefetch_bytes=max(1, remote.prefetch_bytes // urls))

    def one(number: int) -> Reader:
        location = locations[number]
        try:
            return manifest.open_shard(number, remote=remote, **reader_options)
        except FileNotFoundError as error:
            if isinstance(error, BetonError):
                raise
            raise locate(ShardNotFoundError(f"shard {number} of {len(locations)} is missing: {error}"),
                         path=location) from None

    opened: list[Reader | None] = [None] * len(locations)
    try:
        if urls < 2:
            for number in range(len(locations)):
                opened[number] = one(number)
        else:
            with concurrent.futures.ThreadPoolExecutor(min(urls, _MAX_CONCURRENT_OPENS),
                                                       thread_name_prefix="beton-open") as pool:
                futures = [pool.submit(one, number) for number in range(len(locations))]
                for number, future in enumerate(futures):
                    try:
                        opened[number] = future.result()
                    except BaseException:
                        for rest in futures[number + 1 :]:
                            rest.cancel()
                        for rest in futures[number + 1 :]:
                            if not rest.cancelled() and rest.exception() is None:
                                rest.result().close()
                        raise
    except BaseException:
        for reader in opened:
            if reader is not None:
                reader.close()
        raise
    return tuple(opened)  # type: ignore[arg-type]


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
