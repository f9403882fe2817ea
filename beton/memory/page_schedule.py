"""The process cache's schedule: which heap pages each batch needs, the page budget, and the pinned pages.

Two sides share a :class:`PageSchedule`, under its one condition:

* the page reader (:mod:`beton.memory.page_reader`) walks the epoch's batches in order and, for each, *pins*
  every page the batch needs (:meth:`PageSchedule.pin`: a resident page is reused, a missing one is read,
  outside the lock), then marks the batch ready;
* a worker computing batch b waits until b is ready (:meth:`PageSchedule.pages_for`), copies its payloads
  out of the pinned pages, and releases the batch when its stages are over (:meth:`PageSchedule.release`),
  which unpins its pages.

Unpinned pages stay resident while the budget allows, so a page used again soon is not read again; when the
budget is full the least recently used unpinned page is dropped. The budget is at least the number of
distinct pages any ``num_slots + 1`` consecutive batches need: the slot gate lets the reader pin at most that
many consecutive batches (:func:`beton.memory.page_reader.pinned_batches`), so it never waits for a page
another batch holds.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
from collections.abc import Callable, Sequence

import numpy as np

from beton.dataset.union import OpenedDataset

__all__ = ["Heap", "PageSchedule", "minimum_budget"]


@dataclasses.dataclass(frozen=True)
class Heap:
    """Where a dataset's heap lies and how it is paged. ``page_ends``: where each page ends, when pages before the
    last may be short (several files as one: each file's last page); None when only the heap's last page may be."""

    offset: int
    size: int
    page_size: int
    num_pages: int
    page_ends: np.ndarray | None = dataclasses.field(default=None, repr=False, compare=False)

    @classmethod
    def of(cls, dataset: OpenedDataset) -> Heap:
        return cls(dataset.heap_offset, dataset.heap_size, dataset.page_size, dataset.num_pages, dataset.page_ends)

    def page_bounds(self, page: int) -> tuple[int, int]:
        """Absolute [start, end) byte range of one page."""
        start = self.offset + page * self.page_size
        if self.page_ends is not None:
            return start, int(self.page_ends[page])
        return start, min(start + self.page_size, self.offset + self.size)

    def pages_of(self, offsets: np.ndarray, sizes: np.ndarray) -> np.ndarray:
        """The sorted distinct pages that payloads at absolute ``offsets`` of ``sizes`` bytes touch."""
        starts = offsets[sizes > 0] - self.offset
        sizes = sizes[sizes > 0]
        first, last = starts // self.page_size, (starts + sizes - 1) // self.page_size
        spans = [np.arange(a, b + 1) for a, b in zip(first[first != last], last[first != last])]
        return np.unique(np.concatenate([first, *spans]) if spans else first)


def minimum_budget(batch_pages: Sequence[np.ndarray], window: int) -> int:
    """The largest number of distinct pages any ``window`` consecutive batches need."""
    best = 0
    for start in range(len(batch_pages)):
        pages = batch_pages[start : start + window]
        best = max(best, len(np.unique(np.concatenate(pages))) if pages else 0)
    return best


class PageSchedule:
    """One epoch's pages: needed per batch (``batch_pages``, by batch number), resident, pinned, ready.

    Batches are made ready in order from ``first``. ``stop()`` or ``fail(error)`` wakes every waiter: pinning
    returns False, and workers waiting for a batch raise (the error, or a RuntimeError once stopped).
    """

    def __init__(self, batch_pages: Sequence[np.ndarray], first: int, budget_pages: int) -> None:
        self.batch_pages = batch_pages
        self.budget_pages = budget_pages
        self._condition = threading.Condition()
        self._resident: collections.OrderedDict[int, np.ndarray] = collections.OrderedDict()  # LRU order
        self._pins: collections.Counter[int] = collections.Counter()
        self._ready = first  # batches from first up to this number have every page pinned and resident
        self._released: set[int] = set()
        self._error: BaseException | None = None
        self._stopped = False

    # ---- the reader's side ----------------------------------------------------------------------------------

    def pin(self, page: int, read: Callable[[int], np.ndarray]) -> bool:
        """Pin ``page``, reading it with ``read(page)`` (outside the lock) unless it is resident; False once
        stopped."""
        with self._condition:
            if page in self._resident:
                self._resident.move_to_end(page)
                self._pins[page] += 1
                return True
            while not self._stopped and len(self._resident) >= self.budget_pages:
                victim = next((p for p in self._resident if self._pins[p] == 0), None)
                if victim is not None:
                    del self._resident[victim]
                    break
                self._condition.wait()
            if self._stopped:
                return False
        data = read(page)  # workers keep copying meanwhile
        with self._condition:
            self._resident[page] = data
            self._pins[page] += 1
        return True

    def mark_ready(self, batch: int) -> None:
        with self._condition:
            self._ready = batch + 1
            self._condition.notify_all()

    def fail(self, error: BaseException) -> None:
        """The reader failed: every worker waiting for a batch raises ``error``."""
        with self._condition:
            self._error = error
            self._condition.notify_all()

    def stop(self) -> None:
        with self._condition:
            self._stopped = True
            self._condition.notify_all()

    # ---- the workers' side ----------------------------------------------------------------------------------

    def pages_for(self, batch: int) -> dict[int, np.ndarray]:
        """Wait until ``batch`` is ready; its pages (pinned: they stay resident until ``release(batch)``)."""
        with self._condition:
            while self._ready <= batch and self._error is None and not self._stopped:
                self._condition.wait()
            if self._ready > batch:  # read before the reader failed: the batch is served, the error comes later
                return {page: self._resident[page] for page in self.batch_pages[batch].tolist()}
            if self._error is not None:
                raise self._error
            if self._stopped:
                raise RuntimeError("the process cache was closed")
            return {page: self._resident[page] for page in self.batch_pages[batch].tolist()}

    def release(self, batch: int) -> None:
        """The batch's stages are over: unpin its pages (once; a batch never made ready pinned nothing)."""
        with self._condition:
            if batch in self._released or batch >= self._ready or batch >= len(self.batch_pages):
                return
            self._released.add(batch)
            for page in self.batch_pages[batch].tolist():
                self._pins[page] -= 1
            self._condition.notify_all()
