"""One epoch of batches: worker threads filling a ring of preallocated batch slots, one consumer.

Concurrency model
-----------------
* **Slots.** The Loader owns ``num_slots`` slots, each a set of buffers sized for a full batch, allocated once
  and reused by every epoch. Batch ``b`` is computed in slot ``b % num_slots``.
* **Who owns a slot when.** A worker thread takes the next batch number under the lock, waits until that
  batch's slot is free, fills it without holding the lock, then publishes the batch's result (outputs, or the
  exception it raised) under the lock. The consumer owns a slot from the moment ``next()`` returns its batch
  until the following ``next()`` call, and a slot is taken for a new batch only once the consumer has asked
  for the batch after the next one, so the loop's variables (which still hold the previous batch while
  ``next()`` runs) never point into a slot being refilled. Formally: batch ``x`` may be computed once the
  consumer has asked for batch ``x - num_slots + 2``. Batches the loop *keeps* (``outputs.append(y)``) are
  protected by the Loader, which gives a slot fresh memory when something still references the old one.
* **Errors.** An exception in any stage is stored as that batch's result, stops further batches from being
  started, and is raised by ``next()`` in the consumer as the original exception, with a note naming the
  pipeline, operation and sample. Batches before it are still delivered first, in order.
* **Teardown.** ``close()`` - called on exhaustion, on an error, by ``break`` (the iterator is dropped), by the
  Loader starting another epoch, by ``Loader.close()`` and by garbage collection - sets the stop flag, wakes
  every thread and joins them. An iterator closed because the Loader started another epoch raises
  :class:`~beton.errors.LoaderError` when asked for more, instead of ending as if its epoch were over. Worker threads reference only the shared ``_EpochState``, never the iterator,
  so dropping the iterator is enough to collect it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from beton.errors import LoaderError
from beton.pipeline.executor import BatchJob

__all__ = ["EpochIterator"]

_WAIT_SECONDS = 0.1  # how often a waiting consumer checks that the workers are still alive


class _EpochState:
    """Everything the threads share; guarded by ``condition``."""

    def __init__(self, num_batches: int, num_slots: int) -> None:
        self.condition = threading.Condition()
        self.num_batches = num_batches
        self.num_slots = num_slots
        self.next_batch = 0  # next batch number a worker will take
        self.requested = 0  # the consumer has asked for every batch below this number (and holds requested-1)
        self.results: dict[int, tuple[bool, Any]] = {}  # batch -> (ok, outputs or exception)
        self.stop = False
        self.superseded = False  # closed because the Loader started another epoch

    def take_batch(self) -> int | None:
        """Next batch number for a worker, after waiting for its slot; None when there is nothing left."""
        with self.condition:
            if self.stop or self.next_batch >= self.num_batches:
                return None
            batch = self.next_batch
            self.next_batch += 1
            # The slot of `batch` is free once the consumer has asked for batch - num_slots + 2: its loop then
            # holds batch - num_slots + 1 at most, no longer the slot's previous batch.
            while not self.stop and batch >= self.requested + self.num_slots - 2:
                self.condition.wait()
            return None if self.stop else batch

    def publish(self, batch: int, ok: bool, value: Any) -> None:
        with self.condition:
            self.results[batch] = (ok, value)
            if not ok:
                self.next_batch = self.num_batches  # start nothing more
            self.condition.notify_all()


def _work(state: _EpochState, compute: Callable[[int], tuple]) -> None:
    while (batch := state.take_batch()) is not None:
        _compute_and_publish(state, batch, compute)


def _compute_and_publish(state: _EpochState, batch: int, compute: Callable[[int], tuple]) -> None:
    """Publish the batch's outputs, or whatever it raised: every failure must reach the consumer."""
    try:
        state.publish(batch, True, compute(batch))
    except BaseException as error:  # noqa: BLE001 - raised again by __next__ in the consumer
        state.publish(batch, False, error)


class EpochIterator:
    """Iterator over the batches of one epoch; see the module docstring for the concurrency model."""

    def __init__(
        self,
        *,
        batches: Sequence[np.ndarray],
        epoch: int,
        first_batch: int,
        num_workers: int,
        num_slots: int,
        make_job: Callable[[int, np.ndarray, int], BatchJob],
        run_job: Callable[[BatchJob, int], tuple],
        finish: Callable[[tuple], tuple],
        delivered: Callable[[int], None],
    ) -> None:
        self.epoch = epoch
        self.first_batch = first_batch
        self.consumed = 0  # batches returned by this iterator
        self._delivered = delivered  # told the epoch's position after each batch handed to the loop
        self._batches = batches
        self._finish = finish
        self._state = _EpochState(len(batches), num_slots)

        def compute(batch: int) -> tuple:
            slot = batch % num_slots
            return run_job(make_job(first_batch + batch, batches[batch], slot), slot)

        self._compute = compute
        self._threads = [
            threading.Thread(target=_work, args=(self._state, compute), name=f"beton-worker-{i}", daemon=True)
            for i in range(min(num_workers, max(1, len(batches))))
        ]  # none for num_workers=0: __next__ computes each batch in the calling thread
        for thread in self._threads:
            thread.start()

    @property
    def position(self) -> int:
        """Batches of the epoch consumed so far, counting those skipped by a resume."""
        return self.first_batch + self.consumed

    def __iter__(self) -> EpochIterator:
        return self

    def __len__(self) -> int:
        return len(self._batches) - self.consumed

    def __next__(self) -> tuple:
        state = self._state
        batch = self.consumed
        if state.superseded:
            raise LoaderError(f"this iterator of epoch {self.epoch} was ended at batch {self.position} because "
                              "iter(loader) started another epoch; a Loader runs one epoch at a time")
        if batch >= state.num_batches or state.stop:
            self.close()
            raise StopIteration
        if not self._threads:
            _compute_and_publish(state, batch, self._compute)
        with state.condition:
            state.requested = batch + 1  # the previous batch's slot may be reused from now on
            state.condition.notify_all()
            while batch not in state.results:
                if not state.condition.wait(_WAIT_SECONDS) and not any(t.is_alive() for t in self._threads):
                    raise RuntimeError("beton worker threads ended without producing a batch")  # a bug
            ok, value = state.results.pop(batch)
        if not ok:
            self.close()
            raise value
        finished = self._finish(value)
        self.consumed += 1
        self._delivered(self.position)  # only once the batch is the loop's: a pinning error leaves it undelivered
        return finished

    def supersede(self) -> None:
        """Close because the Loader starts another epoch; a later ``next()`` raises instead of ending quietly."""
        if self.consumed < len(self._batches) and not self._state.stop:
            self._state.superseded = True
        self.close()

    def close(self) -> None:
        state = self._state
        with state.condition:
            state.stop = True
            state.results.clear()
            state.condition.notify_all()
        current = threading.current_thread()
        for thread in self._threads:
            if thread is not current:
                thread.join()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - never raise from a finaliser
            pass
