"""The process cache's page reader: one thread per epoch reading the pages each batch needs, ahead of the workers.

It reads through a :class:`~beton.storage.page_source.PageSource` and nothing else of the file: a local file
(:class:`~beton.storage.page_source.LocalFile`) or any other source with the same small interface. A source
must fill the buffer it is given with exactly the file's bytes or raise a
:class:`~beton.errors.BetonError`; whatever it raises reaches the worker waiting for the batch, hence the
training loop, as it was raised.

Walk: for each batch from the epoch's first, wait on the epoch's slot gate, leading the workers by
:data:`READ_LEAD` batches (so that a worker taking a batch finds its pages read, while the pages pinned stay
within the budget: see :func:`pinned_batches`), pin every page of the batch in the
:class:`~beton.memory.page_schedule.PageSchedule` (reading the missing ones), then mark the batch ready. When
the gate closes (the epoch ended), the walk stops the schedule, so that no worker waits for a batch that will
never be read.

Pacing (``rate`` bytes per second): after each page the thread sleeps until the bytes read this epoch are no
more than the rate allows, so storage never sees more than that rate on average (a page may burst).
"""

from __future__ import annotations

import threading
import time

import numpy as np

from beton.memory.base import MemoryCounters
from beton.memory.page_schedule import Heap, PageSchedule
from beton.memory.slots import SlotGate
from beton.storage.page_source import PageSource

__all__ = ["PageReader", "READ_LEAD", "pinned_batches"]

#: batches the page reader may run ahead of the workers on the slot gate
READ_LEAD = 2
_STOP_WAIT_SECONDS = 10.0  # the most stop() waits for the walk to end (a page read in flight finishes first)
_STOP_JOIN_SECONDS = 0.1  # then for the thread to exit (which needs a lock the stopping thread may hold)


def pinned_batches(num_slots: int) -> int:
    """The most consecutive batches whose pages are pinned at once: the loop has received every batch before
    the one it asked for last (so those released their pages), and the reader pins up to ``READ_LEAD``
    batches beyond the ``num_slots - 2`` the gate admits after it. The page budget must hold their pages."""
    return num_slots - 1 + READ_LEAD


class PageReader:
    """Reads one epoch's pages into a schedule, in its own thread (``beton-page-reader``).

    ``page_need``: bytes to read of each page (a prefix where decoders read only early pieces), or None for
    whole pages. ``counters`` count the pages and bytes read. :meth:`stop` ends the thread and joins it.
    """

    def __init__(self, file: PageSource, heap: Heap, schedule: PageSchedule, gate: SlotGate, first: int,
                 counters: MemoryCounters, rate: float | None = None, page_need: np.ndarray | None = None) -> None:
        self._file, self._heap, self._schedule, self._gate = file, heap, schedule, gate
        self._first, self._counters, self._page_need = first, counters, page_need
        self._stopping = threading.Event()  # wakes a paced sleep early
        self._walked = threading.Event()  # the walk is over: what stop() waits for, rather than the thread's exit
        self._pace = _Pace(rate, self._stopping)
        # The gate closing (the epoch ended) ends every wait of the walk: a paced sleep, a page budget held by
        # batches no worker will finish, and the workers waiting for pages that will not be read.
        gate.on_close(self._halt)
        self._thread = threading.Thread(target=self._run, name="beton-page-reader", daemon=True)
        self._thread.start()

    def _halt(self) -> None:
        self._stopping.set()
        self._schedule.stop()

    def _run(self) -> None:
        try:
            self._walk()
        finally:
            self._walked.set()

    def _walk(self) -> None:
        schedule = self._schedule
        try:
            for batch in range(self._first, len(schedule.batch_pages)):
                if not self._gate.wait(batch, READ_LEAD):
                    schedule.stop()  # the epoch ended: a worker still waiting for a batch must not wait forever
                    return
                for page in schedule.batch_pages[batch].tolist():
                    if not schedule.pin(page, self.read_page):
                        return
                schedule.mark_ready(batch)
        except BaseException as error:  # noqa: BLE001 - raised in the worker waiting for the batch
            schedule.fail(error)

    def read_page(self, page: int) -> np.ndarray:
        """Page ``page`` from the source (its needed prefix), counted and paced."""
        start, end = self._heap.page_bounds(page)
        if self._page_need is not None:
            end = start + min(end - start, int(self._page_need[page]))
        buffer = np.empty(end - start, np.uint8)
        self._file.read_into(start, buffer, f"page {page}")
        self._counters.add(1, len(buffer))
        self._pace.after_reading(len(buffer))
        return buffer

    def stop(self) -> None:
        """End the walk (the epoch cannot go on without it: its gate closes too) and wait for it to end.

        It waits for the walk, then only briefly for the thread's exit: ``stop`` also runs in finalisers (the
        Loader's), hence wherever the garbage collector runs, possibly holding the lock a thread takes as it
        exits (a collection inside ``threading.enumerate()``); a thread whose exit is blocked there ends by
        itself once the lock is released.
        """
        self._gate.close()  # and _halt, through on_close
        self._halt()  # done already, unless another thread closed the gate and runs its callbacks now
        if self._thread is threading.current_thread():
            return
        self._walked.wait(_STOP_WAIT_SECONDS)
        self._thread.join(_STOP_JOIN_SECONDS)


class _Pace:
    """Sleeps after reads so that the bytes read since it was made never exceed ``rate`` per second (or until
    ``wake`` is set)."""

    def __init__(self, rate: float | None, wake: threading.Event) -> None:
        self._rate, self._wake = rate, wake
        self._start, self._bytes = time.perf_counter(), 0

    def after_reading(self, nbytes: int) -> None:
        if self._rate is None:
            return
        self._bytes += nbytes
        ahead = self._bytes / self._rate - (time.perf_counter() - self._start)
        if ahead > 0:
            self._wake.wait(ahead)
