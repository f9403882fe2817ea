"""One per-sample (Python) stage of one batch, whose positions idle worker threads may share.

A batch is one worker's unit of work, so an epoch ends when its slowest worker finishes its last batch: the other
workers, with no batch left to take, would wait for up to a batch's time each. A :class:`SampleLoop` hands out
the stage's batch positions in runs, under a lock, to the batch's own thread (:meth:`SampleLoop.run`) and to any
idle worker that joins it (:meth:`SampleLoop.help`, with scratch buffers of its own); the batch's thread then
waits for every run handed out (:meth:`SampleLoop.finish`) before its next stage. Each position is written once,
by whichever thread took it, from the same inputs and keys: the batch is the same whoever computed which sample.

A failure ends its run and the handing out. Runs are handed out in order, so every position before a failing one
was taken before it, and has finished when :meth:`SampleLoop.finish` returns: the lowest failing position it
reports is the one a loop over the batch in one thread would have stopped at.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any, Callable

import numpy as np

from beton.pipeline.operation import BatchContext, Scratch

__all__ = ["SampleLoop"]

# Positions are handed out in runs of 1/_SHARE of those left (at least one): few hand-outs where an operation is
# cheap (a lock per position would cost a cheap copy of a small array a fifth of its time), single positions
# towards the end, where helpers join.
_SHARE = 8


class SampleLoop:
    """``apply(current, destination, i, sample, context)`` for every position ``i`` of ``samples``."""

    def __init__(self, apply: Callable[..., None], samples: np.ndarray, current: Any, destination: Any,
                 context: BatchContext) -> None:
        self._apply, self._samples, self._current, self._destination = apply, samples, current, destination
        self._context = context
        # a plain lock for handing out positions, and a condition on it for finish()
        self._lock = threading.Lock()
        self._condition = threading.Condition(self._lock)
        self._next = 0  # the next position to hand out
        self._closed = False  # no position is handed out once the batch's own thread has left run()
        self._helping = 0  # runs of positions helpers took and have not finished
        self._failures: list[tuple[int, BaseException]] = []

    @property
    def open(self) -> bool:
        """Whether positions are left to hand out (read without the lock: a hint for helpers)."""
        return not self._closed and self._next < len(self._samples) and not self._failures

    def run(self) -> None:
        """Compute positions in the calling thread, the batch's own, until none is left to hand out; then hand out
        no more, also where something interrupted it (a KeyboardInterrupt in the loop's thread, ``num_workers=0``)
        between two positions."""
        try:
            self._work(self._context, helper=False)
        finally:
            with self._condition:
                self._closed = True

    def help(self, scratch: Scratch) -> None:
        """Compute positions in an idle worker thread, with its own ``scratch``, until none is left."""
        self._work(dataclasses.replace(self._context, scratch=scratch), helper=True)

    def finish(self) -> tuple[int, BaseException] | None:
        """Once :meth:`run` has returned (or raised): wait for the positions helpers are computing; the first
        failure (position, exception), or None."""
        with self._condition:
            self._condition.wait_for(lambda: self._helping == 0)
            return min(self._failures, key=lambda failure: failure[0], default=None)

    def _work(self, context: BatchContext, helper: bool) -> None:
        # Only helpers' runs are counted: the batch's own thread calls finish() after its own, so nothing it left
        # behind (interrupted between two statements here) can make finish() wait for ever.
        count, taken, failure = len(self._samples), False, None
        while True:
            with self._lock:  # one hold per run of positions: give the last back, take the next
                if taken and helper:
                    self._helping -= 1
                if failure is not None:
                    self._failures.append(failure)
                if self._closed or self._failures or self._next >= count:
                    if self._helping == 0:
                        self._condition.notify_all()
                    return
                start = self._next
                end = self._next = start + max(1, (count - start) // _SHARE)
                taken = True
                if helper:
                    self._helping += 1
            failure = None
            for position in range(start, end):
                try:
                    self._apply(self._current, self._destination, position, int(self._samples[position]), context)
                except BaseException as error:  # noqa: BLE001 - reported by finish() in the batch's thread
                    failure = (position, error)
                    break
