"""Heap pages of a remote file: checked against their CRC32 on arrival, kept on disk, fetched ahead.

:meth:`RemotePages.page` returns one page's bytes, always checked: from the read-ahead buffer, else from the disk
cache, else fetched. A page whose CRC32 does not match the file's page-checksum table is fetched again (and a
cached copy that does not match is dropped and fetched again); after the retry budget the caller gets a
:class:`~beton.errors.CorruptDataError` naming the URL and the page. Nothing is ever returned from a page that
failed its checksum.

Reading ahead: :meth:`RemotePages.will_read` takes the pages a consumer is about to ask for, in order (the process
cache passes the pages its epoch will read). Consecutive pages are fetched in one request (up to
``request_bytes``; smaller at the start of a plan: :func:`_run_size`), up to ``max_in_flight`` requests at once,
and at most ``prefetch_bytes`` of pages are held ahead of the consumer. A page asked for out of that order is
simply fetched when asked.

Concurrency model: the consumer thread(s) call :meth:`page`; fetches run on a pool of ``max_in_flight`` threads.
``_lock`` guards the plan, its cursor and the futures of pages fetched ahead; it is never held while waiting for
a fetch. A future resolves to the page's checked bytes or to the exception its fetch ended with; each page
taken from the buffer leaves it. :meth:`close` cancels what has not started and waits for the rest.
"""

from __future__ import annotations

import collections
import concurrent.futures
import threading
import zlib
from collections.abc import Sequence

import numpy as np

from beton.errors import CorruptDataError, locate
from beton.storage.remote.cache import DiskPageCache
from beton.storage.remote.fetch import RangeFetcher

__all__ = ["RemotePages", "expected_reads"]

_MOST_AHEAD = 1024  # pages planned ahead at most, whatever their size: bounds the bookkeeping per page taken


class RemotePages:
    """The heap pages [0, num_pages) of a remote file, at ``heap_offset``, ``page_size`` bytes each (the last one
    may be shorter), with their CRC32 in ``checksums``."""

    def __init__(self, fetcher: RangeFetcher, heap_offset: int, heap_size: int, page_size: int,
                 checksums: np.ndarray, cache: DiskPageCache | None) -> None:
        self.fetcher = fetcher
        self.heap_offset, self.heap_size, self.page_size = heap_offset, heap_size, page_size
        self.num_pages = len(checksums)
        self._checksums = np.array(checksums, dtype=np.int64)  # a copy: the reader's table may be released
        self.cache = cache
        options = fetcher.options
        self._pages_per_request = max(1, options.request_bytes // page_size)
        self._ahead_limit = max(1, min(_MOST_AHEAD, options.prefetch_bytes // page_size))
        self._pool = concurrent.futures.ThreadPoolExecutor(options.max_in_flight, thread_name_prefix="beton-fetch")
        self._lock = threading.Lock()
        self._plan = np.zeros(0, np.int64)
        self._cursor = 0
        self._ahead: dict[int, _PageFuture] = {}
        # The last few pages handed out, so that reading payloads one by one (``reader[i]``) does not fetch a
        # page per payload; small next to the read-ahead buffer.
        self._recent: collections.OrderedDict[int, bytes] = collections.OrderedDict()
        self._recent_limit = max(2, min(16, options.prefetch_bytes // 4 // page_size))
        self._seen_on_disk: set[int] = set()
        self._closed = False
        self.pages_fetched = 0  # pages that came over the network (retries included), for counters and tests

    # ---- one page -------------------------------------------------------------------------------------------

    def bounds(self, page: int) -> tuple[int, int]:
        """Absolute [start, end) of a page in the file."""
        if not 0 <= page < self.num_pages:
            raise IndexError(f"page {page} out of range for {self.num_pages} pages")
        start = self.heap_offset + page * self.page_size
        return start, min(start + self.page_size, self.heap_offset + self.heap_size)

    def page(self, page: int) -> np.ndarray:
        """The checked bytes of one page, read-only."""
        future = self._take_ahead(page)
        data = None
        if future is None:
            with self._lock:
                data = self._recent.get(page)
        if data is None:
            try:
                data = future.result() if future is not None else self._load(page)
            except concurrent.futures.CancelledError:  # a new plan cancelled its request before it started
                data = self._load(page)
        with self._lock:
            self._recent[page] = data
            self._recent.move_to_end(page)
            while len(self._recent) > self._recent_limit:
                self._recent.popitem(last=False)
        return np.frombuffer(data, np.uint8)

    def _load(self, page: int) -> bytes:
        """A page from the disk cache, else fetched (and then cached)."""
        if self.cache is not None:
            start, end = self.bounds(page)
            cached = self.cache.get(page, end - start)  # a cached page must have exactly its page's size
            if cached is not None:
                if self._matches(page, cached):
                    return cached
                self.cache.discard(page)  # damaged on disk: fetch it again
        return _value(self._fetch_run([page]), page)

    def _matches(self, page: int, data: bytes) -> bool:
        start, end = self.bounds(page)
        return len(data) == end - start and zlib.crc32(data) == int(self._checksums[page])

    def _fetch_run(self, pages: list[int]) -> dict[int, bytes | BaseException]:
        """Consecutive pages in one request, each checked; those that fail their checksum are fetched again one
        by one within the retry budget. Every page is cached once it is checked. A page that could not be had
        maps to its error (raised when that page is asked for, not when a neighbour is)."""
        start, end = self.bounds(pages[0])[0], self.bounds(pages[-1])[1]
        what = f"page {pages[0]}" if len(pages) == 1 else f"pages {pages[0]}..{pages[-1]}"
        fetched = self.fetcher.fetch(start, end, what)
        data = memoryview(fetched)
        with self._lock:
            self.pages_fetched += len(pages)
        result: dict[int, bytes | BaseException] = {}
        for page in pages:
            low, high = self.bounds(page)
            # a page of its own run is the fetched bytes themselves; pages of a longer run are copied out, so that
            # holding one page does not hold the whole run in memory
            page_bytes = fetched if len(pages) == 1 else bytes(data[low - start : high - start])
            try:
                result[page] = self._checked(page, page_bytes)
            except Exception as error:  # noqa: BLE001 - delivered to whoever asks for this page
                result[page] = error
        return result

    def _checked(self, page: int, data: bytes) -> bytes:
        attempts = self.fetcher.options.retries + 1
        for attempt in range(attempts):
            if self._matches(page, data):
                if self.cache is not None:
                    try:
                        self.cache.put(page, data)
                    except OSError:  # a full or read-only cache disk costs speed, never the read
                        pass
                return data
            if attempt + 1 < attempts:
                self.fetcher.pause(attempt)
                start, end = self.bounds(page)
                data = self.fetcher.fetch(start, end, f"page {page} (its checksum did not match)")
                with self._lock:
                    self.pages_fetched += 1
        raise locate(CorruptDataError(
            f"checksum of heap page {page} does not match the file's page-checksum table in {attempts} fetches: "
            "the server delivers other bytes than the file holds (the remote file changed, or the data is "
            "corrupted in storage or on the way)"), path=self.fetcher.url, page=page)

    # ---- reading ahead --------------------------------------------------------------------------------------

    def will_read(self, pages: Sequence[int] | np.ndarray) -> None:
        """The pages the consumer will ask for next, in order: fetching starts now, replacing an earlier plan."""
        with self._lock:
            for future in self._ahead.values():
                future.run.cancel()
            self._ahead = {}
            self._plan = np.asarray(pages, dtype=np.int64).reshape(-1)
            self._cursor = 0
            self._top_up()

    def _take_ahead(self, page: int) -> _PageFuture | None:
        with self._lock:
            window = self._plan[self._cursor : self._cursor + self._ahead_limit]
            found = np.flatnonzero(window == page)
            if not len(found):
                return None
            self._cursor += int(found[0]) + 1
            future = self._ahead.pop(page, None)
            # Pages planned before this one were not asked for (the consumer still held them): drop their bytes,
            # and cancel their requests where no page still wanted shares them.
            upcoming = set(self._plan[self._cursor : self._cursor + self._ahead_limit].tolist())
            dropped = [self._ahead.pop(p) for p in [p for p in self._ahead if p not in upcoming]]
            wanted = {id(f.run) for f in self._ahead.values()} | ({id(future.run)} if future is not None else set())
            for skipped in dropped:
                if id(skipped.run) not in wanted:
                    skipped.run.cancel()  # effective only if it has not started
            self._top_up()
            return future

    def _top_up(self) -> None:
        """Start fetches for the planned pages within the read-ahead window (called with the lock held)."""
        if self._closed:
            return
        run: list[int] = []
        run_size = 0
        window = self._plan[self._cursor : self._cursor + self._ahead_limit].tolist()
        for position, page in enumerate(window, start=self._cursor):
            if len(self._ahead) + len(run) >= self._ahead_limit:
                break
            if page in self._ahead or page in run or self._on_disk(page):
                continue  # cached pages are read from disk when asked for: nothing to hold in memory
            if run and (page != run[-1] + 1 or len(run) >= run_size):
                self._submit(run)
                run = []
            if not run:
                run_size = _run_size(position, self._pages_per_request)
            run.append(page)
        if run:
            self._submit(run)

    def _on_disk(self, page: int) -> bool:
        """Whether the disk cache holds a page (remembered once seen: a page evicted since is fetched when asked
        for, as any page out of plan)."""
        if self.cache is None:
            return False
        if page in self._seen_on_disk:
            return True
        if self.cache.contains(page):
            self._seen_on_disk.add(page)
            return True
        return False

    def _submit(self, run: list[int]) -> None:
        shared = self._pool.submit(self._fetch_run, list(run))
        for page in run:
            self._ahead[page] = _PageFuture(shared, page)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            for future in self._ahead.values():
                future.run.cancel()
            self._ahead = {}
        self._pool.shutdown(wait=True, cancel_futures=True)


def _run_size(position: int, pages_per_request: int) -> int:
    """Most pages in a request whose first page comes ``position`` pages into the plan: a quarter of the pages
    planned before it, one at least, ``pages_per_request`` at most.

    Requests in flight share the link, so a request completes only when about ``max_in_flight`` times its size
    has arrived. Were the plan's first pages fetched in full-size requests, the consumer would wait for many
    megabytes before its first page; growing requests from single pages let the first pages arrive after a few
    pages' worth of transfer. (Runs form only from pages that enter the read-ahead window together: once the plan
    is longer than the window, pages join it one by one and go one per request.)"""
    return max(1, min(pages_per_request, position // 4))


class _PageFuture:
    """One page of a run fetched in one request: the run's future, narrowed to that page."""

    def __init__(self, run: concurrent.futures.Future, page: int) -> None:
        self.run, self._page = run, page

    def result(self) -> bytes:
        return _value(self.run.result(), self._page)


def _value(run: dict[int, bytes | BaseException], page: int) -> bytes:
    value = run[page]
    if isinstance(value, BaseException):
        raise value
    return value


def expected_reads(batch_pages: Sequence[np.ndarray], budget_pages: int) -> np.ndarray:
    """The pages a least-recently-used cache of ``budget_pages`` pages reads, in order, when its batches need
    ``batch_pages``: what the process cache will ask a page source for in an epoch (pages it still holds are not
    read again). Pins can make the real order differ slightly; a page asked for out of plan is fetched then."""
    resident: collections.OrderedDict[int, None] = collections.OrderedDict()
    reads = []
    for pages in batch_pages:
        for page in np.asarray(pages).tolist():
            if page in resident:
                resident.move_to_end(page)
                continue
            if len(resident) >= max(1, budget_pages):
                resident.popitem(last=False)
            resident[page] = None
            reads.append(page)
    return np.asarray(reads, dtype=np.int64)
