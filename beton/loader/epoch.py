"""The epoch engine: worker threads computing batches into a ring of slots, one consumer, one slot gate.

An :class:`EpochEngine` belongs to one plan of the Loader's pipelines (a replan builds another): it owns the
ring of :class:`~beton.memory.slots.Slot` (each batch's output buffers, scratch and staging), computes a batch
in its slot (sources from the memory layer, then the plan's stages), and starts each epoch's
:class:`EpochIterator`. A batch's number is its place in the epoch (counting batches a resume skipped), the
same number everywhere: the gate, the slot, the memory layer, ``BatchContext.batch`` and ``state_dict``.

Concurrency model
-----------------
* **Slots and the gate.** Batch ``b`` is computed in slot ``b % num_slots``. One
  :class:`~beton.memory.slots.SlotGate` per epoch says when a batch may take its slot: once the consumer has
  asked for batch ``b - num_slots + 2``, so the loop's variables (which still hold the previous batch while
  ``next()`` runs) never point into a slot being refilled. The workers wait on it before computing a batch, and
  a memory layer that reads ahead (the process cache's page reader) before reading one. Batches the loop
  *keeps* (``outputs.append(y)``) are protected by the slot, which takes fresh memory when something still
  references the old one (``Slot.release_kept``).
* **Who owns a slot when.** A worker takes the next batch number under the epoch's lock, waits on the gate,
  fills the slot without holding any lock, then publishes the batch's result (outputs, or the exception it
  raised) under the lock. The consumer owns the slot from the moment ``next()`` returns its batch until it
  asks for the batch after the next one.
* **Helping at the end.** A worker with no batch left to take helps the others finish theirs: it takes
  positions of their per-sample stages (:class:`~beton.pipeline.sample_loop.SampleLoop`, offered while they
  run) with scratch buffers of its own, until no batch is being computed. It writes only the positions it took,
  into the slot of a batch whose own thread waits for it before that stage ends, and so before the batch is
  published or its memory released.
* **Errors.** An exception in any stage is stored as that batch's result, stops further batches from being
  started, and is raised by ``next()`` in the consumer as the original exception, with a note naming the
  pipeline, operation and sample. Batches before it are still delivered first, in order.
* **Teardown.** ``close()`` - called on exhaustion, on an error, by ``break`` (the iterator is dropped), by the
  Loader starting another epoch, by ``Loader.close()`` and by garbage collection - sets the stop flag, closes
  the gate (which ends the page reader's walk too), wakes every thread and joins the workers. An unfinished
  iterator the Loader ended (another epoch, ``load_state_dict``, ``close()``) raises
  :class:`~beton.errors.LoaderError` when asked for more, instead of ending as if its epoch were over. Worker
  threads reference only the shared ``_EpochState`` and the engine, never the iterator, so dropping the
  iterator is enough to collect it. Its finaliser, which may run in any thread at any allocation, ends the
  epoch but joins only briefly (see ``__del__``). The iterator holds its
  Loader (which holds it only weakly): a Loader referenced by nothing but its iterator (``for x in
  Loader(...)``) lives until the iterator is dropped.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from beton.errors import BetonError, LoaderError, locate
from beton.memory.base import EpochReads, MemoryLayer, StoredField
from beton.pieces import Pieces
from beton.pipeline.compiler import Plan
from beton.pipeline.executor import run_batch, warm_up
from beton.pipeline.operation import BatchContext, Scratch
from beton.pipeline.sample_loop import SampleLoop
from beton.pipeline.ragged import map_parts
from beton.memory.slots import Slot, SlotGate
from beton.random import operation_key

__all__ = ["EpochEngine", "EpochIterator", "Delivery", "Progress"]

_WAIT_SECONDS = 0.1  # how often a waiting consumer checks that the workers are still alive
_FINALISER_WAIT_SECONDS = 10.0  # the most a finaliser waits for the workers to leave their loop
_FINALISER_JOIN_SECONDS = 0.1  # then for them to exit (which needs a lock its thread may hold: see __del__)


@dataclasses.dataclass(frozen=True)
class Delivery:
    """How batches reach the loop: ``pin_memory`` (page-locked copies of CPU tensors, for CUDA), ``copy``
    (copies of every output), ``overwrite_kept`` (FFCV's ring: no check for kept batches)."""

    pin_memory: bool = False
    copy: bool = False
    overwrite_kept: bool = False


class Progress:
    """Where an epoch stands: updated by its iterator, read by ``Loader.state_dict`` (also once it is gone)."""

    def __init__(self, epoch: int, next_batch: int, end: int) -> None:
        self.epoch, self.next_batch, self.end = epoch, next_batch, end

    @property
    def finished(self) -> bool:
        return self.next_batch >= self.end


@dataclasses.dataclass(frozen=True, eq=False)
class _Epoch:
    """What every batch of one epoch shares."""

    number: int
    batches: Sequence[np.ndarray]  # by batch number
    seed: int
    keys: Mapping[tuple[int, int], np.uint64]  # (output, position) -> the operation's key for this epoch


class EpochEngine:
    """The ring of slots of one plan, how a batch is computed in it, and each epoch's start.

    ``fields``: per output of the plan, the stored field it reads. ``memory``: the Loader's memory layer.
    ``fidelity``: progressive-JPEG scans the decoders read (``Loader.set_fidelity``; None: their own setting),
    read by every batch as it starts, and by the memory layer at each epoch's start.
    """

    def __init__(self, plan: Plan, fields: Sequence[StoredField], memory: MemoryLayer, *, batch_size: int,
                 num_slots: int, num_workers: int, delivery: Delivery, fidelity: int | None = None) -> None:
        self.plan, self.fields, self.memory = plan, tuple(fields), memory
        self.batch_size, self.num_workers, self.delivery = batch_size, num_workers, delivery
        self.fidelity = fidelity
        self.kernel_arguments = {
            (step.output, step.position): step.operation.kernel_arguments(step.input_state)
            for stage in plan.stages if stage.kind == "jit" for step in stage.steps
        }
        self._payloads = tuple(sorted({stored.payload for stored in self.fields if stored.payload >= 0}))
        needed = _slot_bytes(plan, batch_size) * num_slots
        if needed > _physical_memory():
            raise LoaderError(f"{self._slot_memory_text(num_slots)}, more than this machine's "
                              f"{_physical_memory() / 2**30:.1f} GiB of memory")
        try:
            self.slots = [Slot.allocate(batch_size, plan.buffers) for _ in range(num_slots)]
        except MemoryError:
            raise LoaderError(f"{self._slot_memory_text(num_slots)}: the allocation failed") from None
        warm_up(plan, self.kernel_arguments, self.slots[0].buffers,
                [memory.empty_source(stored) for stored in self.fields])

    def _slot_memory_text(self, num_slots: int) -> str:
        # A file's image records may claim large sizes (up to the pixel cap each): what the slots need follows
        # from them, and is refused when it exceeds the machine's memory rather than failing in numpy.
        plan = self.plan
        largest = max(range(len(plan.buffers)), key=lambda b: _buffer_bytes(plan.buffers[b], 1))
        owner = next((plan.output_names[step.output] for stage in plan.stages for step in stage.steps
                      if step.buffer == largest), "?")
        spec = plan.buffers[largest]
        return (f"the batch slots would need {_slot_bytes(plan, self.batch_size) * num_slots / 2**30:.1f} "
                f"GiB ({num_slots} slots of batch_size={self.batch_size}; the largest buffer is pipeline "
                f"{owner!r}'s {spec.shape} {spec.dtype} per sample: the largest image in the file, for a decoder "
                "that keeps sizes; a crop decoder, a smaller batch_size or max_image_pixels= bound it)")

    # ---- an epoch --------------------------------------------------------------------------------------------

    def start(self, epoch: int, batches: Sequence[np.ndarray], first: int, seed: int,
              owner: object = None) -> EpochIterator:
        """Start computing ``batches[first:]`` of epoch ``epoch``; the iterator hands them to the loop and keeps
        ``owner`` (the Loader) alive as long as it lives itself."""
        keys = {(s.output, s.position): operation_key(seed, epoch, s.output, s.position)
                for stage in self.plan.stages for s in stage.steps}
        gate = SlotGate(len(self.slots), first)
        # may raise: the file changed since it was opened
        self.memory.start_epoch(EpochReads(batches, first, self._payloads, self._read_pieces(self.fidelity, keys),
                                           gate))
        try:
            return EpochIterator(self, _Epoch(epoch, batches, seed, keys), first, gate, owner)
        except BaseException:
            gate.close()
            raise

    def _read_pieces(self, fidelity: int | None, keys: Mapping[tuple[int, int], np.uint64]) -> dict[int, Pieces]:
        """Per payload column whose decoders read only parts of each allocation, the parts they read this epoch:
        the parts a decoder declares itself (``Operation.payload_pieces``: a ragged window, drawn with the key its
        kernel gets), else the field's at the largest setting its decoders read at (``Operation.payload_setting``
        and ``Field.read_pieces``: the first scans of scan-grouped JPEGs at this epoch's fidelity). A column
        whose decoders do not all declare the same parts is read whole."""
        settings: dict[int, int | None] = {}
        declared: dict[int, list[Pieces | None]] = {}
        for stage in self.plan.stages:
            for step in stage.steps:
                column = self.fields[step.output].payload
                if step.position != 0 or column < 0:
                    continue
                declared.setdefault(column, []).append(
                    step.operation.payload_pieces(step.input_state, keys[step.output, step.position]))
                wanted = step.operation.payload_setting(fidelity)
                known = settings.get(column, 0)
                settings[column] = None if wanted is None or known is None else max(wanted, known)
        pieces = {}
        for column, found in declared.items():
            if any(part is not None for part in found):
                if all(part is not None and part.same_as(found[0]) for part in found):
                    pieces[column] = found[0]
                settings.pop(column)  # declared by some decoders only, or differently: whole allocations
        for stored in self.fields:
            if stored.payload in settings and stored.payload not in pieces:
                found = stored.field.read_pieces(stored.metadata, settings[stored.payload])
                if found is not None:
                    pieces[stored.payload] = found
        return pieces

    # ---- a batch (in a worker thread, or the loop's with num_workers=0) ---------------------------------------

    def compute(self, epoch: _Epoch, batch: int, share: Callable[[SampleLoop | None], None] | None = None) -> tuple:
        """Batch ``batch`` of ``epoch``, computed in its slot (whose gate the caller passed); ``share`` offers its
        per-sample stages to idle workers (:func:`~beton.pipeline.executor.run_batch`)."""
        slot = self.slots[batch % len(self.slots)]
        samples = epoch.batches[batch]
        memory = self.memory
        try:
            memory.will_serve(samples)
            sources = [memory.source(stored, samples, batch, slot) for stored in self.fields]
            if not self.delivery.overwrite_kept:
                slot.release_kept()
            context = BatchContext(samples, epoch.number, batch=batch, seed=epoch.seed, scratch=slot.scratch,
                                   fidelity=self.fidelity, keys=epoch.keys, sources=sources)
            return run_batch(self.plan, self.kernel_arguments, slot.buffers, context, share)
        finally:
            memory.batch_done(batch)

    def name_file(self, error: BaseException) -> None:
        """Add the file to a batch's error about one sample (a decoder knows the sample, never the file): the
        dataset the sample's number counts in, and for a union of shards a note naming the shard and the
        sample's index in it."""
        sample = getattr(error, "sample", None)
        if isinstance(error, BetonError) and sample is not None and error.path is None:
            dataset = self.memory.file.description
            shard, index = self.memory.file.sample_file(sample)
            locate(error, path=dataset, note=None if shard == dataset else
                   f"beton: sample {sample} of the dataset is sample {index} of the shard {shard!r}")

    def deliver(self, outputs: tuple) -> tuple:
        """The batch as the loop receives it (in the loop's thread): pinned or copied if asked."""
        if self.delivery.pin_memory:  # both parts of Padded/Packed batches
            return tuple(map_parts(_pinned, value) for value in outputs)
        if not self.delivery.copy:
            return outputs
        return tuple(map_parts(_copy, value) for value in outputs)


class _EpochState:
    """Everything the threads of one epoch share; guarded by ``condition`` (the gate has its own)."""

    def __init__(self, first: int, end: int, gate: SlotGate) -> None:
        self.condition = threading.Condition()
        self.gate = gate
        self.end = end
        self.next_batch = first  # next batch number a worker will take
        self.results: dict[int, tuple[bool, Any]] = {}  # batch -> (ok, outputs or exception)
        self.stop = False
        self.ended_by: str | None = None  # why the Loader ended the epoch early (another epoch, close())
        self.working = 0  # workers inside their loop (_work): a finaliser waits for none, not for the threads
        self.computing = 0  # batches taken by workers and not yet published
        self.loops: dict[int, SampleLoop] = {}  # batch -> its per-sample stage running now, offered to idle workers

    def close(self) -> None:
        """Stop the epoch: no batch starts from now on and no result is kept; the gate closes."""
        with self.condition:
            self.stop = True
            self.results.clear()
            self.condition.notify_all()
        self.gate.close()

    def wait_idle(self, timeout: float) -> bool:
        """Wait until every worker has left its loop (True), or ``timeout`` seconds (False)."""
        with self.condition:
            return self.condition.wait_for(lambda: self.working == 0, timeout)

    def take_batch(self) -> int | None:
        """Next batch number for a worker, once its slot is free; None when there is nothing left. A batch taken
        is :meth:`finished` by the worker once published."""
        with self.condition:
            if self.stop or self.next_batch >= self.end:
                return None
            batch = self.next_batch
            self.next_batch += 1
            self.computing += 1
        try:
            if self.gate.wait(batch):
                return batch
        except BaseException:
            self.finished()
            raise
        self.finished()
        return None

    def finished(self) -> None:
        with self.condition:
            self.computing -= 1
            self.condition.notify_all()  # helpers waiting for the epoch's last batches

    def share(self, batch: int, loop: SampleLoop | None) -> None:
        """Offer ``loop``, a per-sample stage of ``batch`` starting now, to idle workers; None: withdraw it."""
        with self.condition:
            if loop is None:
                self.loops.pop(batch, None)
            else:
                self.loops[batch] = loop
            self.condition.notify_all()

    def loop_to_help(self) -> SampleLoop | None:
        """For a worker with no batch left to take: a per-sample stage with positions left, once there is one;
        None once no batch is being computed (or the epoch stopped)."""
        with self.condition:
            while not self.stop:
                found = next((loop for loop in self.loops.values() if loop.open), None)
                if found is not None:
                    return found
                if self.computing == 0:
                    return None
                # timed: the collector may run this epoch's finaliser in this very thread, at any allocation above,
                # and its close() (the lock is reentrant) then notifies everyone but the thread about to wait
                self.condition.wait(_WAIT_SECONDS)
            return None

    def publish(self, batch: int, ok: bool, value: Any) -> None:
        with self.condition:
            if self.stop:  # the epoch was ended: what a batch cut short raised (its pages gone) is nobody's result
                return
            self.results[batch] = (ok, value)
            if not ok:
                self.next_batch = self.end  # start nothing more
            self.condition.notify_all()


def _work(state: _EpochState, compute: Callable[..., tuple]) -> None:
    try:
        while (batch := state.take_batch()) is not None:
            try:
                _compute_and_publish(state, batch, compute, functools.partial(state.share, batch))
            finally:
                state.finished()
        # no batch left to take: help the others finish theirs, a few samples at a time, with this thread's scratch
        scratch = None
        while (loop := state.loop_to_help()) is not None:
            if scratch is None:
                scratch = Scratch()
            loop.help(scratch)
    finally:
        with state.condition:
            state.working -= 1
            state.condition.notify_all()


def _compute_and_publish(state: _EpochState, batch: int, compute: Callable[..., tuple],
                         share: Callable[[SampleLoop | None], None] | None = None) -> None:
    """Publish the batch's outputs, or whatever it raised: every failure must reach the consumer."""
    try:
        state.publish(batch, True, compute(batch, share))
    except BaseException as error:  # noqa: BLE001 - raised again by __next__ in the consumer
        state.publish(batch, False, error)


class EpochIterator:
    """Iterator over the batches of one epoch; see the module docstring for the concurrency model.

    ``progress`` says where the epoch stands (the next batch the loop will receive); ``len()`` is the number of
    batches still to come.
    """

    def __init__(self, engine: EpochEngine, epoch: _Epoch, first: int, gate: SlotGate, owner: object = None) -> None:
        self.epoch = epoch.number
        # `for x in Loader(...)` and `next(iter(Loader(...)))` hold only the iterator: it must keep the Loader
        # (whose finaliser closes the epoch and the memory layer) alive until the iterator itself is dropped.
        self._owner = owner
        self.progress = Progress(epoch.number, first, len(epoch.batches))
        self._engine = engine
        self._state = _EpochState(first, len(epoch.batches), gate)

        def compute(batch: int, share: Callable[[SampleLoop | None], None] | None) -> tuple:
            return engine.compute(epoch, batch, share)

        self._compute = compute
        self._threads = [
            threading.Thread(target=_work, args=(self._state, compute), name=f"beton-worker-{i}", daemon=True)
            for i in range(engine.num_workers)
        ]  # none for num_workers=0: __next__ computes each batch in the calling thread. All of them also where
        # fewer batches are left: those without one help with the others' (_work)
        self._state.working = len(self._threads)
        for thread in self._threads:
            thread.start()

    def __iter__(self) -> EpochIterator:
        return self

    def __len__(self) -> int:
        return self.progress.end - self.progress.next_batch

    def __next__(self) -> tuple:
        state, progress = self._state, self.progress
        batch = progress.next_batch
        if state.ended_by is not None:
            raise LoaderError(f"this iterator of epoch {self.epoch} was ended at batch {batch} because "
                              f"{state.ended_by}")
        if batch >= state.end or state.stop:
            self.close()
            raise StopIteration
        with state.condition:
            state.results.pop(batch - 1, None)  # the batch the last call returned (left there: see the end)
        if not self._threads and batch not in state.results:  # (there already if its delivery was interrupted)
            _compute_and_publish(state, batch, self._compute)
        state.gate.asked_for(batch)  # the previous batch's slot may be reused from now on
        with state.condition:
            # Results and liveness are read under one hold of the lock: a worker publishes under it, so a worker
            # found dead here has published everything it ever will before the results were read.
            while batch not in state.results:
                if state.ended_by is not None or state.stop:
                    break  # ended from another thread while waiting (Loader.close(), another iter())
                if not any(thread.is_alive() for thread in self._threads):
                    raise LoaderError(f"beton's worker threads ended without producing batch {batch} of epoch "
                                      f"{self.epoch} (a bug in beton: please report it)")
                state.condition.wait(_WAIT_SECONDS)
            # Read, not taken (the next call takes it): whatever interrupts the rest of this call (Ctrl-C, a pinning
            # error) leaves the batch where the next call finds it, rather than lost with the workers waiting for it.
            found = None if state.ended_by is not None or state.stop else state.results[batch]
        if found is None:
            return self.__next__()  # raises as the ended epoch says
        ok, value = found
        if not ok:
            self._engine.name_file(value)
            # the epoch ends here: a later next() says so rather than ending as if the epoch were over
            state.ended_by = f"batch {batch} raised {type(value).__name__}: {value}"
            self.close()
            raise value
        delivered = self._engine.deliver(value)
        # Last, and without a Python call before the return, where no Ctrl-C can land: the batch counts as
        # delivered only once it is the loop's (a pinning error or an interrupt before leaves it undelivered).
        progress.next_batch = batch + 1
        return delivered

    def interrupt(self, reason: str) -> None:
        """Close because the Loader ended the epoch early (``reason`` says how); a later ``next()`` raises
        LoaderError naming it instead of ending as if the epoch were over."""
        if not self.progress.finished and not self._state.stop:
            self._state.ended_by = reason
        self.close()

    def close(self) -> None:
        """End the epoch and join its workers."""
        self._state.close()
        current = threading.current_thread()
        for thread in self._threads:
            if thread is not current:
                thread.join()

    def __del__(self) -> None:
        """End the epoch; wait for the workers only where that cannot deadlock.

        A finaliser runs wherever the reference count drops or the garbage collector runs (an iterator in a
        reference cycle): in any thread, at any allocation, whatever locks that thread holds. Joining there
        can deadlock: a collection inside ``threading.enumerate()`` or ``Thread.start()`` holds the lock every
        thread takes as it exits, and one in a worker of this epoch may hold a lock the others need. So the
        finaliser ends the epoch, returns at once in one of its workers, else waits for the workers to leave
        their loop (which needs only the epoch's own lock) and gives each a short join, after which a thread
        whose exit is blocked ends by itself once the lock is released.

        At the interpreter's exit it does nothing: the other threads are stopped for good then, wherever they
        were, possibly holding this epoch's lock or the OS cache's lease lock, so taking either would hang the
        exit; the process's end releases the file, its lease and the memory anyway.
        """
        if sys.is_finalizing():
            return
        try:
            self._state.close()
            if threading.current_thread() in self._threads:
                return
            self._state.wait_idle(_FINALISER_WAIT_SECONDS)
            for thread in self._threads:
                thread.join(_FINALISER_JOIN_SECONDS)
        except Exception:  # noqa: BLE001 - never raise from a finaliser
            pass


def _buffer_bytes(spec: Any, batch_size: int) -> int:
    return batch_size * int(np.prod(spec.shape, dtype=np.int64)) * np.dtype(spec.dtype).itemsize


def _slot_bytes(plan: Plan, batch_size: int) -> int:
    return sum(_buffer_bytes(spec, batch_size) for spec in plan.buffers)


def _physical_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not POSIX: no bound known
        return 1 << 62


def _pinned(value: Any) -> Any:
    if not isinstance(value, torch.Tensor) or value.device.type != "cpu":
        return value
    if value.is_pinned():  # a slot's pinned buffer: pin_memory() would hand out the slot itself, not a copy
        return torch.empty_like(value, pin_memory=True).copy_(value)
    return value.pin_memory()


def _copy(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, np.ndarray):
        return value.copy()
    return value
