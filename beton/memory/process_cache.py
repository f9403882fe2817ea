"""Process cache: whole heap pages read ahead of use, in the epoch's known order, into a bounded pool.

For data that does not fit the OS page cache, network file systems, or to measure and bound the bytes read.

How it works
------------
* At the start of an epoch the cache learns the batches (their samples are known in advance) and computes the
  pages each batch needs.
* A reader thread walks the batches in order. For each batch it *pins* every page the batch needs, reading the
  missing ones from the file (``os.preadv``, no memory map), then marks the batch ready. It never runs more than
  ``num_slots`` batches ahead of the oldest batch not yet finished.
* A worker thread computing batch b waits until b is ready, then copies the batch's payloads from the pinned
  pages into a staging buffer of its slot (reused, grown only when a batch needs more), which the decoders read.
  When the batch is done its pages are unpinned.
* Unpinned pages stay resident while the budget allows, so a page used again soon is not read again; when the
  budget is full the least recently used unpinned page is dropped.

Partial reads (:class:`~beton.pieces.Pieces`, e.g. the first scans of scan-grouped progressive JPEGs at a
low fidelity, fixed for the epoch when it starts): the cache reads only the prefix of each page that holds
the pieces, and gathers each sample's pieces into one payload (``Source.gathered``). So a low fidelity reads
fewer bytes from storage, as in PCR.

``read_bandwidth`` paces the reader thread: after each page it sleeps until the bytes read this epoch are no
more than the rate allows, so storage never sees more than that rate on average (a page may burst).

A file changed under the cache: reads use ``preadv`` on the descriptor of a :class:`LocalFile` (whose
size and modification time are checked before every batch, and the path's identity when an epoch starts), a
short read is an error (never zeros), and the Reader's memory map is not touched after construction (the
allocation columns are copied). So a truncated, rewritten or
replaced file raises :class:`~beton.errors.FormatError` naming the file and never kills the process; pages
already read before the change are copies and stay valid.

Memory bound: ``budget_pages * page_size`` bytes of pages plus the staging buffers (one batch of payloads per
slot). The budget is at least the number of distinct pages any ``num_slots + 1`` consecutive batches need
(less could deadlock), and by default twice that. Under QUASI_RANDOM each page is needed by one contiguous
run of batches, so every page is read once per epoch; under RANDOM a page may be read several times.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Mapping, Sequence

import numpy as np

from beton.errors import CorruptDataError
from beton.memory.os_cache import MemoryCounters, allocation_columns
from beton.pieces import Pieces
from beton.pipeline.operation import Source
from beton.storage.page_source import open_page_source
from beton.storage.reader import Reader

__all__ = ["ProcessCache"]


class ProcessCache:
    def __init__(self, reader: Reader, num_slots: int, budget_pages: int | None = None,
                 read_bandwidth: float | None = None) -> None:
        self._reader = reader
        self._pace = _Pace(read_bandwidth)
        self._pieces: dict[int, Pieces] = {}
        self._page_need: np.ndarray | None = None
        self._num_slots = num_slots
        self._requested_budget = budget_pages
        self._file = open_page_source(reader)  # a LocalFile, or checked pages of a remote file
        self._offsets, self._sizes = allocation_columns(reader)
        self._condition = threading.Condition()
        self._staging: dict[tuple[int, int], np.ndarray] = {}
        self._thread: threading.Thread | None = None
        self._stop = False
        self.counters = MemoryCounters()
        self.budget_pages = 0
        self._reset([])

    # ---- epoch lifecycle ------------------------------------------------------------------------------------

    def start_epoch(self, batches: Sequence[np.ndarray], columns: Sequence[int],
                    pieces: Mapping[int, Pieces] | None = None) -> None:
        """``pieces``: per payload column whose decoders read parts of each allocation, those parts."""
        self._stop_reader()
        self._file.check_path()
        self._pieces = dict(pieces or {})
        self._page_need = self._bytes_needed_per_page(columns) if self._pieces else None
        self._reset([self._pages_of(samples, columns) for samples in batches])
        self._file.will_read(self._batch_pages, self.budget_pages)  # a remote source starts fetching
        self.counters = MemoryCounters()
        self._pace.restart()
        self._stop = False
        self._thread = threading.Thread(target=self._read_ahead, name="beton-page-reader", daemon=True)
        self._thread.start()

    def _reset(self, batch_pages: list[np.ndarray]) -> None:
        self._batch_pages = batch_pages
        minimum = _max_window_union(batch_pages, self._num_slots + 1)
        self.budget_pages = max(self._requested_budget or 2 * minimum, minimum, 1)
        self._resident: collections.OrderedDict[int, np.ndarray] = collections.OrderedDict()  # LRU order
        self._pins: collections.Counter[int] = collections.Counter()
        self._ready = 0  # batches below this number have all their pages pinned and resident
        self._done: set[int] = set()
        self._oldest_unfinished = 0
        self._error: BaseException | None = None

    def _pages_of(self, samples: np.ndarray, columns: Sequence[int]) -> np.ndarray:
        reader = self._reader
        used = [c for c in columns if c >= 0]
        if not used or not len(samples):
            return np.zeros(0, np.int64)
        starts = np.concatenate([self._offsets[c].take(samples) for c in used]) - reader.heap_offset
        sizes = np.concatenate([self._sizes[c].take(samples) for c in used])
        starts, sizes = starts[sizes > 0], sizes[sizes > 0]
        first, last = starts // reader.page_size, (starts + sizes - 1) // reader.page_size
        spans = [np.arange(a, b + 1) for a, b in zip(first[first != last], last[first != last])]
        return np.unique(np.concatenate([first, *spans]) if spans else first)

    def _bytes_needed_per_page(self, columns: Sequence[int]) -> np.ndarray:
        """How many bytes of each page this epoch reads: a prefix, when decoders read only early pieces."""
        reader, page_size = self._reader, self._reader.page_size
        need = np.zeros(reader.num_pages, np.int64)
        for column in sorted({c for c in columns if c >= 0}):
            starts = self._offsets[column] - reader.heap_offset
            extents = self._sizes[column]
            if column in self._pieces:
                extents = self._pieces[column].extents()
            starts, ends = starts[extents > 0], starts[extents > 0] + extents[extents > 0]
            first, last = starts // page_size, (ends - 1) // page_size
            np.maximum.at(need, last, ends - last * page_size)
            for page, final in zip(first[first != last], last[first != last]):
                need[page:final] = page_size  # a payload spanning pages needs all but its last page whole
        return need

    # ---- the reader thread --------------------------------------------------------------------------------

    def _read_ahead(self) -> None:
        try:
            for batch, pages in enumerate(self._batch_pages):
                with self._condition:
                    while not self._stop and batch >= self._oldest_unfinished + self._num_slots:
                        self._condition.wait()
                    if self._stop:
                        return
                for page in pages.tolist():
                    if not self._pin(page):
                        return
                with self._condition:
                    self._ready = batch + 1
                    self._condition.notify_all()
        except BaseException as error:  # noqa: BLE001 - surfaces in the worker waiting for this batch
            with self._condition:
                self._error = error
                self._condition.notify_all()

    def _pin(self, page: int) -> bool:
        with self._condition:
            if page in self._resident:
                self._resident.move_to_end(page)
                self._pins[page] += 1
                return True
            while not self._stop and len(self._resident) >= self.budget_pages:
                victim = next((p for p in self._resident if self._pins[p] == 0), None)
                if victim is not None:
                    del self._resident[victim]
                    break
                self._condition.wait()
            if self._stop:
                return False
        data = self._read_page(page)  # outside the lock: workers keep copying meanwhile
        with self._condition:
            self._resident[page] = data
            self._pins[page] += 1
        return True

    def _read_page(self, page: int) -> np.ndarray:
        start, end = self._reader.page_bounds(page)
        if self._page_need is not None:
            end = start + min(end - start, int(self._page_need[page]))
        buffer = np.empty(end - start, np.uint8)
        self._file.read_into(start, buffer, f"page {page}")
        self.counters.add(1, len(buffer))
        self._pace.after_reading(len(buffer))
        return buffer

    # ---- worker side --------------------------------------------------------------------------------------

    def empty_source(self, metadata: np.ndarray, column: int) -> Source:
        empty = np.zeros(0, np.int64)
        memory = np.zeros(0, np.uint8)
        memory.flags.writeable = False
        return Source(metadata, memory, empty, empty)

    def source(self, metadata: np.ndarray, column: int, samples: np.ndarray, batch: int, slot: int) -> Source:
        if column < 0:
            return self.empty_source(metadata, column)
        self._wait_ready(batch)
        self._file.check()  # after the wait: every page of the batch was read before a check that passed
        reader = self._reader
        offsets = self._offsets[column].take(samples)
        sizes = self._sizes[column].take(samples)
        with self._condition:
            pages = dict(self._resident)  # pinned pages cannot be dropped until batch_done
        if column in self._pieces:
            return self._gathered_source(pages, metadata, column, samples, offsets - reader.heap_offset, slot)
        staging, positions = self._stage(slot, column, sizes)
        for offset, size, position in zip(offsets.tolist(), sizes.tolist(), positions.tolist()):
            self._copy_payload(pages, offset - reader.heap_offset, size, staging[position : position + size])
        return _read_only_source(metadata, staging, positions, sizes)

    def _gathered_source(self, pages: dict[int, np.ndarray], metadata: np.ndarray, column: int, samples: np.ndarray,
                         starts: np.ndarray, slot: int) -> Source:
        """Each sample's pieces, copied out of the page prefixes and laid end to end with the trailer."""
        pieces = self._pieces[column].take(samples)
        sizes = pieces.sizes()
        staging, positions = self._stage(slot, column, sizes)
        for i, (start, position, size) in enumerate(zip(starts.tolist(), positions.tolist(), sizes.tolist())):
            def copy(offset: int, length: int, out: np.ndarray, start: int = start) -> None:
                self._copy_payload(pages, start + offset, length, out)

            pieces.gather(i, copy, staging[position : position + size])
        return _read_only_source(metadata, staging, positions, sizes, gathered=True)

    def _stage(self, slot: int, column: int, sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The slot's staging buffer for payloads of ``sizes`` laid end to end, and where each one starts."""
        positions = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64) if len(sizes) else sizes
        return self._staging_buffer(slot, column, int(sizes.sum())), positions

    def _copy_payload(self, pages: dict[int, np.ndarray], start: int, size: int, out: np.ndarray) -> None:
        page_size = self._reader.page_size
        done = 0
        while done < size:
            page, within = divmod(start + done, page_size)
            piece = min(size - done, page_size - within)
            available = pages[page][within : within + piece]  # pages may be read as prefixes
            if len(available) != piece:
                raise CorruptDataError(f"{self._reader.path}: page {page} was read up to byte {len(pages[page])}, "
                                       f"a payload needs byte {within + piece}")
            out[done : done + piece] = available
            done += piece

    def _staging_buffer(self, slot: int, column: int, size: int) -> np.ndarray:
        buffer = self._staging.get((slot, column))
        if buffer is None or len(buffer) < size:
            buffer = np.empty(max(size, 1), np.uint8)
            self._staging[slot, column] = buffer
        return buffer

    def _wait_ready(self, batch: int) -> None:
        with self._condition:
            while self._ready <= batch and self._error is None and not self._stop:
                self._condition.wait()
            if self._error is not None:
                raise self._error
            if self._stop:
                raise RuntimeError("the process cache was closed")

    def batch_done(self, batch: int) -> None:
        with self._condition:
            if batch < len(self._batch_pages) and batch not in self._done:
                self._done.add(batch)
                if batch < self._ready:
                    for page in self._batch_pages[batch].tolist():
                        self._pins[page] -= 1
                while self._oldest_unfinished in self._done:
                    self._oldest_unfinished += 1
                self._condition.notify_all()

    # ---- teardown -----------------------------------------------------------------------------------------

    def _stop_reader(self) -> None:
        with self._condition:
            self._stop = True
            self._condition.notify_all()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def close(self) -> None:
        self._stop_reader()
        self._file.close()


def _read_only_source(metadata: np.ndarray, staging: np.ndarray, positions: np.ndarray, sizes: np.ndarray,
                      gathered: bool = False) -> Source:
    """A Source over the filled part of a staging buffer, which decoders must not write into."""
    view = staging[: int(sizes.sum())]
    view.flags.writeable = False
    return Source(metadata, view, positions, sizes, gathered=gathered)


class _Pace:
    """Sleeps after reads so that the bytes read since ``restart`` never exceed ``rate`` per second."""

    def __init__(self, rate: float | None) -> None:
        self._rate = rate
        self.restart()

    def restart(self) -> None:
        self._start, self._bytes = time.perf_counter(), 0

    def after_reading(self, nbytes: int) -> None:
        if self._rate is None:
            return
        self._bytes += nbytes
        ahead = self._bytes / self._rate - (time.perf_counter() - self._start)
        if ahead > 0:
            time.sleep(ahead)


def _max_window_union(batch_pages: list[np.ndarray], window: int) -> int:
    """The largest number of distinct pages any `window` consecutive batches need."""
    best = 0
    for start in range(len(batch_pages)):
        pages = batch_pages[start : start + window]
        best = max(best, len(np.unique(np.concatenate(pages))) if pages else 0)
    return best
