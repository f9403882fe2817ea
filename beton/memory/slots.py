"""Batch slots: the memory one batch is computed in, and the one gate that says when a slot may be refilled.

Concurrency model
-----------------
* **A slot owns all of a batch's memory**: its output buffers (one per pipeline step that has one, sized for a
  full batch), the operations' scratch buffers, and the memory layer's staging buffers (the process cache
  copies the batch's payloads there). Batch ``b`` of an epoch is computed in slot ``b % num_slots``; the ring
  of slots lives as long as the Loader's plan and serves every epoch.
* **Who owns a slot when.** From the moment its batch passes the gate until the training loop asks for the
  batch after next, a slot belongs to that batch: first to the thread computing it (and, for its staging,
  to the memory layer filling it), then to the loop, whose variables still hold the batch while ``next()``
  runs for the following one.
* **One gate** (:class:`SlotGate`, one per epoch): batch ``b`` reuses the slot of batch ``b - num_slots``,
  which the loop may hold until it asks for batch ``b - num_slots + 2``; so batch ``b`` may start once the
  loop has asked for that batch. Every producer of a batch waits on this gate: the worker threads before
  computing it, and a memory layer that reads ahead (the process cache's page reader) before reading its
  pages. A producer that does not write into the slot (the page reader fills its own page pool) may *lead*
  the workers by a fixed number of batches, so that a batch's pages are read before a worker takes it; the
  ring plus that lead bounds how far anything runs ahead of the loop.
* **Kept batches**: a batch the loop keeps (``outputs.append(y)``) still references its slot's buffers when
  the slot comes round again; :meth:`Slot.release_kept` then gives the slot fresh buffers (pinned again where
  they were) and leaves the old ones to the kept batch.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Sequence

import numpy as np
import torch

from beton.pipeline.compiler import BufferSpec
from beton.pipeline.operation import Scratch, torch_dtype

__all__ = ["Slot", "SlotGate", "pinned_empty"]


def _reference_counts(buffers: list[np.ndarray]) -> list[int]:
    """Reference counts of the buffers as seen from here (compared with that of a buffer nobody else holds)."""
    return [sys.getrefcount(buffer) for buffer in buffers]


#: what _reference_counts reports for a buffer that only its slot's list holds (whatever its size)
_UNREFERENCED = _reference_counts([np.empty(0, np.uint8)])[0]


class Slot:
    """The memory of one batch: output ``buffers``, operations' ``scratch``, the memory layer's ``staging``.

    ``scratch`` and ``staging`` are grow-only and never part of an output; ``buffers`` are what the outputs
    view. See the module docstring for who owns a slot when.
    """

    def __init__(self, buffers: list[np.ndarray], pinned: Sequence[bool] = ()) -> None:
        self.buffers = buffers
        self.scratch = Scratch()
        self.staging = Scratch()
        self._pinned = tuple(pinned) or (False,) * len(buffers)  # per buffer: page-locked

    @classmethod
    def allocate(cls, batch_size: int, specs: Sequence[BufferSpec]) -> Slot:
        """A slot with one buffer of ``batch_size`` samples per spec; a pinned spec's is page-locked where CUDA
        is available (torch pins host memory only with CUDA)."""
        pinned = tuple(spec.pinned and torch.cuda.is_available() for spec in specs)
        return cls([_empty((batch_size, *spec.shape), spec.dtype, pin) for spec, pin in zip(specs, pinned)],
                   pinned)

    def release_kept(self) -> None:
        """Give the slot fresh memory where its previous batch is still referenced (kept by the loop).

        Views handed out for the previous batch (numpy views, tensors from ``torch.from_numpy``) each hold a
        reference to their buffer; the loop no longer holds that batch unless it kept it, so a count above a
        lone buffer's means a kept batch, which keeps the old memory. A loop that keeps nothing never allocates.
        """
        buffers = self.buffers
        for index, count in enumerate(_reference_counts(buffers)):
            if count > _UNREFERENCED:
                old = buffers[index]
                buffers[index] = _empty(old.shape, old.dtype, self._pinned[index])


def pinned_empty(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """An uninitialised numpy array in page-locked memory (needs CUDA); plain memory for a dtype torch has no
    twin of. The array is torch's own view of its pinned tensor, not a view of a view: numpy views of it then
    reference it, which :meth:`Slot.release_kept` counts."""
    try:
        dtype_of_torch = torch_dtype(np.dtype(dtype))
    except TypeError:
        return np.empty(shape, dtype)
    return torch.empty(shape, dtype=dtype_of_torch).pin_memory().numpy()


def _empty(shape: tuple[int, ...], dtype: np.dtype, pinned: bool) -> np.ndarray:
    return pinned_empty(shape, dtype) if pinned else np.empty(shape, dtype)


class SlotGate:
    """When a batch may take its slot, for everything that produces batches of one epoch (see module docstring).

    :meth:`wait` blocks a producer until batch ``b``'s slot is free (the loop has asked for batch
    ``b - num_slots + 2``) and returns False instead once the gate is closed (the epoch ended). The loop calls
    :meth:`asked_for` with each batch it asks for.
    """

    def __init__(self, num_slots: int, first: int) -> None:
        if num_slots < 3:
            raise ValueError(f"a ring needs at least 3 slots (the batch computed, the one held, the one before), "
                             f"got {num_slots}")
        self._condition = threading.Condition()
        self._ahead = num_slots - 2
        self._limit = first + self._ahead  # batches below this may take their slot
        self._closed = False
        self._waiting = 0  # producers blocked in wait(): asked_for wakes them, and spares the call when none is
        self._on_close: list[Callable[[], None]] = []

    def wait(self, batch: int, lead: int = 0) -> bool:
        """Wait until ``batch`` may take its slot (or, with ``lead``, until batch ``batch - lead`` may): True, or
        False when the gate was closed meanwhile."""
        if batch - lead < self._limit and not self._closed:
            return True  # the common case, without the lock: the limit only grows, so a stale read only waits
        with self._condition:
            self._waiting += 1
            try:
                while not self._closed and batch - lead >= self._limit:
                    self._condition.wait()
            finally:
                self._waiting -= 1
            return not self._closed

    def asked_for(self, batch: int) -> None:
        """The loop asks for ``batch``: it holds ``batch - 1`` at most, so slots up to ``batch + num_slots - 3``
        are free."""
        with self._condition:
            if batch + 1 + self._ahead > self._limit:
                self._limit = batch + 1 + self._ahead
                if self._waiting:
                    self._condition.notify_all()

    def close(self) -> None:
        """End the epoch for every producer: waits return False from now on, and the callbacks given to
        :meth:`on_close` run (once, in this thread)."""
        with self._condition:
            self._closed = True
            callbacks, self._on_close = self._on_close, []
            self._condition.notify_all()
        for callback in callbacks:  # outside the lock: a callback takes its producer's own locks
            callback()

    def on_close(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` when the gate closes (at once if it is closed): for a producer that also waits on
        something other than the gate (the page reader's page budget, and workers waiting for its pages), so
        that closing the gate ends every wait of the epoch."""
        with self._condition:
            if not self._closed:
                self._on_close.append(callback)
                return
        callback()

    @property
    def closed(self) -> bool:
        return self._closed
