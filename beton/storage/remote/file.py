"""One opened remote file: its identity, the bytes the Reader validates, and its pages once validated.

The Reader reads a remote file through :class:`RemoteBytes`, which it slices as it slices a local file's memory
map, so every check of a local file runs unchanged on a remote one. Slices outside the heap (header, tables,
padding) are fetched when first sliced, in blocks of at least 64 KiB, and kept: they are what the Reader holds
in memory anyway, bounded by the file's own size. Once the Reader has validated the tables it calls
:meth:`RemoteFile.attach_pages`; from then on every slice that touches the heap is served from whole pages
checked against their CRC32 (:class:`~beton.storage.remote.pages.RemotePages`), so ``reader[i]``,
``reader.payload()`` and ``verify`` never see an unchecked byte of the heap (before that, the Reader slices only
the header, the tables and the padding between them).
"""

from __future__ import annotations

import bisect

import numpy as np

from beton.errors import FormatError, locate
from beton.storage.remote.cache import DiskPageCache
from beton.storage.remote.fetch import RangeFetcher, identity_of
from beton.storage.remote.options import RemoteOptions
from beton.storage.remote.pages import RemotePages

__all__ = ["RemoteFile", "RemoteBytes"]

_BLOCK = 64 * 1024


class RemoteFile:
    """A remote file as opened: URL, size and version markers (``identity``), a fetcher, and after validation its
    pages (``pages``)."""

    def __init__(self, url: str, options: RemoteOptions) -> None:
        self.url = url
        self.options = options
        self.fetcher = RangeFetcher(url, options)
        self.size = self.fetcher.size
        self.identity = self.fetcher.identity
        self.pages: RemotePages | None = None

    def structure(self) -> RemoteBytes:
        """A fresh view for the Reader (nothing fetched yet: a second view fetches everything again)."""
        return RemoteBytes(self)

    def attach_pages(self, heap_offset: int, heap_size: int, page_size: int, checksums: np.ndarray,
                     header: bytes) -> RemotePages:
        """The validated page geometry; the disk cache (if any) is keyed by URL, identity and header bytes."""
        cache = None
        if self.options.cache_dir is not None:
            cache = DiskPageCache(self.options.cache_dir, self.options.cache_limit, self.url, (self.identity, header))
        self.pages = RemotePages(self.fetcher, heap_offset, heap_size, page_size, checksums, cache)
        return self.pages

    def check_identity(self) -> None:
        """Raise :class:`~beton.errors.FormatError` if the object changed since it was opened (size, ETag,
        version id or modification time, as far as the storage reports them)."""
        now = identity_of(self.fetcher.stat())
        if now != self.identity:
            raise locate(FormatError(f"the remote file changed since it was opened: it was {dict(self.identity)}, "
                                     f"it is now {dict(now)}; make a new Loader to read the new version"),
                         path=self.url)

    def close(self) -> None:
        if self.pages is not None:
            self.pages.close()


class RemoteBytes:
    """Read-only byte slices of a remote file, for the Reader: ``len()`` is the file's size and ``view[a:b]``
    a read-only uint8 array of exactly those bytes (fetched, or checked pages for the heap)."""

    def __init__(self, remote: RemoteFile) -> None:
        self._remote = remote
        self._starts: list[int] = []  # fetched regions, by start
        self._regions: list[np.ndarray] = []

    def __len__(self) -> int:
        return self._remote.size

    def __getitem__(self, key: slice) -> np.ndarray:
        if not isinstance(key, slice) or key.step not in (None, 1):
            raise TypeError("a remote file's bytes are read by contiguous slices")
        start, stop, _ = key.indices(len(self))
        if stop <= start:
            return np.zeros(0, np.uint8)
        pages = self._remote.pages
        if pages is None:
            return self._structure(start, stop)
        heap_start, heap_end = pages.heap_offset, pages.heap_offset + pages.heap_size
        parts = []
        if start < heap_start:
            parts.append(self._structure(start, min(stop, heap_start)))
        if start < heap_end and stop > heap_start:
            parts.append(_from_pages(pages, max(start, heap_start), min(stop, heap_end)))
        if stop > heap_end:
            parts.append(self._structure(max(start, heap_end), stop))
        if len(parts) == 1:
            return parts[0]
        joined = np.concatenate(parts)
        joined.flags.writeable = False
        return joined

    def _structure(self, start: int, stop: int) -> np.ndarray:
        """Bytes outside the heap: from a region fetched earlier, else fetched now (a block at least)."""
        index = bisect.bisect_right(self._starts, start) - 1
        if index >= 0 and start - self._starts[index] + (stop - start) <= len(self._regions[index]):
            offset = start - self._starts[index]
            return self._regions[index][offset : offset + stop - start]
        end = max(stop, min(start + _BLOCK, len(self)))
        data = np.frombuffer(self._remote.fetcher.fetch(start, end, "the file's header and tables"), np.uint8)
        position = bisect.bisect_left(self._starts, start)
        self._starts.insert(position, start)
        self._regions.insert(position, data)
        return data[: stop - start]

    def release(self) -> None:
        self._starts, self._regions = [], []


def _from_pages(pages: RemotePages, start: int, stop: int) -> np.ndarray:
    first = (start - pages.heap_offset) // pages.page_size
    last = (stop - 1 - pages.heap_offset) // pages.page_size
    if first == last:
        page_start = pages.bounds(first)[0]
        return pages.page(first)[start - page_start : stop - page_start]
    out = np.empty(stop - start, np.uint8)
    for page in range(first, last + 1):
        low, high = pages.bounds(page)
        low_cut, high_cut = max(low, start), min(high, stop)
        out[low_cut - start : high_cut - start] = pages.page(page)[low_cut - low : high_cut - low]
    out.flags.writeable = False
    return out



