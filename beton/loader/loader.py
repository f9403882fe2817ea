"""Loader: the torch DataLoader replacement. Reads a .beton file through compiled per-field pipelines."""

from __future__ import annotations

import dataclasses
import os
import secrets
import sys
import warnings
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import numpy as np
import torch

from beton._cores import resolve_workers
from beton.errors import LoaderError, PipelineError
from beton.fields.base import Field
from beton.codecs.jpeg_scans import scans_to_read
from beton.fields.rgb_image import RGBImageField
from beton.loader.epoch import EpochIterator
from beton.memory.os_cache import OSCache, metadata_column
from beton.pieces import Pieces
from beton.memory.process_cache import ProcessCache
from beton.order import (ORDERS, BalancedOrder, Order, OrderContext, OrderOption, QuasiRandomOrder,
                         SequentialOrder, shard)
from beton.traversal_order.base import TraversalOrder, TraversalOrderAdapter
from beton.pipeline.compiler import Plan, build_plan, default_cache_dir
from beton.pipeline.executor import BatchJob, run_batch, warm_up
from beton.pipeline.operation import Scratch
from beton.pipeline.ragged import map_parts
from beton.random import operation_key
from beton.loader.pipelines import resolve_pipelines
from beton.threading_layer import ensure_thread_safe_layer
from beton.storage.reader import Reader
from beton.storage.remote import RemoteOptions, is_url

__all__ = ["Loader"]

_WINDOWED_ORDERS = (QuasiRandomOrder, BalancedOrder)  # built with the Loader's quasi_random_window


class Loader:
    """Iterate over batches of a .beton file, one tuple of outputs per batch (in field order).

    Args:
        path: the .beton file.
        batch_size: samples per batch.
        num_workers: worker threads; -1 uses every usable core; 0 computes each batch in the calling thread
            when the loop asks for it (for debugging: breakpoints and profilers see the pipeline).
        os_cache: True reads through a memory map (the OS page cache); False uses a process cache that
            reads whole pages ahead of use in the epoch's known order (see :mod:`beton.memory.process_cache`).
            A URL is always read through the process cache (there is no memory map of a remote file).
        order: an :class:`OrderOption`, an :class:`~beton.order.Order` instance or subclass, or a subclass of
            FFCV's :class:`~beton.traversal_order.TraversalOrder` (default SEQUENTIAL, or RANDOM with
            ``shuffle=True``).
        distributed: shard by ``torch.distributed`` rank and world size (or by ``rank``/``world_size``).
        seed: seeds the order and every random augmentation; None draws one, recorded in ``state_dict()``.
            Under ``distributed=True`` every rank must use the same seed, or the ranks' shares overlap: with
            None, rank 0 draws one and broadcasts it through the process group (a collective call: every rank
            builds its Loader, as DDP code does); with ``rank=``/``world_size=`` given by hand, the seed is 0
            (as FFCV's).
        indices: the subset of samples to load (in this order for SEQUENTIAL).
        pipelines: field name -> list of operations; a missing field gets its default decoder and
            ToTensor; ``None`` drops the field.
        custom_fields: field classes for stored types that cannot be imported (see :class:`~beton.Reader`).
        drop_last: drop the last partial batch (default False: partial batches are delivered).
        batches_ahead: batches prepared ahead of the training loop.
        copy: return copies of every batch (costs a copy per batch; rarely needed, see ``overwrite_kept``).
        overwrite_kept: False (default): a batch the loop keeps (``outputs.append(y)``) stays valid, like a
            torch DataLoader's: before refilling a slot, the Loader checks whether anything still references
            its memory and, if so, gives the slot fresh memory. True: FFCV's zero-copy ring, in which a batch
            is overwritten a few batches later whether or not it was kept (valid only until the next batch
            is requested; for loops that never keep a batch, saving the check's rare allocations).
        quasi_random_window: pages per QUASI_RANDOM (and BALANCED) window (default: see
            :mod:`beton.order.quasi_random`).
        process_cache_pages: page budget of the process cache (default: enough for the batches in flight).
        read_bandwidth: process cache only: read at most this many bytes per second, to share a disk with other
            jobs, or to measure how a pipeline behaves on slower storage (None: as fast as the file allows).
        kernel_cache_dir: where generated stages and numba's compiled code are kept.
        fuse_stages: False compiles each operation separately (slower; for measuring what fusion gains).
        readahead: with ``os_cache=True``, False stops the kernel reading ahead around each access, so that
            only touched pages are read from storage (random access, progressive-JPEG fidelity).
        recompile: accepted for FFCV compatibility: an operation changed between epochs (``decoder.output_size =
            ...``) is noticed at the next ``iter(loader)``, which plans and allocates again. Changes are found by
            comparing the operations' attributes as their repr shows them: edit a large array inside an
            operation in place and the change goes unseen; replace the operation (or the array) instead.
        max_image_pixels: refuse files holding an image of more decoded pixels (see :class:`~beton.Reader`);
            by default ``$BETON_MAX_IMAGE_PIXELS`` or 2**27; None lifts the cap.
        storage_options, cache_dir, cache_limit, remote_options: for a URL (``https://...``, ``s3://...``):
            fsspec's options, the local page cache's directory and size in bytes, and request tuning (see
            :class:`~beton.Reader` and docs/remote.md). Local paths ignore them.
        order_kwargs: keyword arguments for the order's class (e.g. ``{"window_pages": 4}`` for QUASI_RANDOM, or
            those of a TraversalOrder subclass).

    The torch DataLoader's names are accepted where they mean something:

        shuffle: True is ``order=OrderOption.RANDOM``, False is SEQUENTIAL (an ``order`` that disagrees is an
            error).
        pin_memory: copy every output tensor into page-locked memory, for faster and asynchronous copies to
            a GPU; only where CUDA is available (elsewhere a warning says it is ignored, as torch's does).
        prefetch_factor: batches prepared ahead per worker, as torch's: ``batches_ahead = prefetch_factor *
            max(1, num_workers)`` (give one or the other).
        persistent_workers: accepted and changes nothing: compiled stages and the batch slots already persist
            across epochs, and starting worker threads costs microseconds.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        batch_size: int,
        num_workers: int = -1,
        os_cache: bool = True,
        order: OrderOption | Order | None = None,
        distributed: bool = False,
        seed: int | None = None,
        indices: Sequence[int] | np.ndarray | None = None,
        pipelines: Mapping[str, Sequence[Any] | None] | None = None,
        custom_fields: Mapping[str, type[Field]] | None = None,
        drop_last: bool = False,
        batches_ahead: int | None = None,
        *,
        rank: int | None = None,
        world_size: int | None = None,
        copy: bool = False,
        overwrite_kept: bool = False,
        quasi_random_window: int | None = None,
        process_cache_pages: int | None = None,
        read_bandwidth: float | None = None,
        kernel_cache_dir: str | None = None,
        fuse_stages: bool = True,
        readahead: bool = True,
        recompile: bool = False,
        shuffle: bool | None = None,
        pin_memory: bool = False,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
        order_kwargs: Mapping[str, Any] | None = None,
        max_image_pixels: int | None | Literal["environment"] = "environment",
        storage_options: Mapping[str, Any] | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit: int | None = None,
        remote_options: RemoteOptions | None = None,
    ) -> None:
        self._arguments = {name: value for name, value in locals().items() if name not in ("self", "__class__")}
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        os_cache = os_cache and not is_url(path)  # a remote file is read through the process cache
        if read_bandwidth is not None and (os_cache or read_bandwidth <= 0):
            raise ValueError("read_bandwidth needs os_cache=False (the process cache) and a positive rate, got "
                             f"os_cache={os_cache}, read_bandwidth={read_bandwidth}")
        ensure_thread_safe_layer()
        self.reader = Reader(path, custom_fields=custom_fields, max_image_pixels=max_image_pixels,
                             storage_options=storage_options, cache_dir=cache_dir, cache_limit=cache_limit,
                             remote_options=remote_options)
        self.batch_size = batch_size
        self.num_workers = resolve_workers(num_workers, minimum=0)
        batches_ahead = _resolve_batches_ahead(batches_ahead, prefetch_factor, self.num_workers)
        self.pin_memory = _resolve_pin_memory(pin_memory)
        self.drop_last = drop_last
        self.copy = copy
        self.overwrite_kept = overwrite_kept
        self.indices = _resolve_indices(indices, self.reader.num_samples)
        self.rank, self.world_size = _resolve_shard(distributed, rank, world_size)
        self.seed = _agree_seed(seed, self.world_size, collective=distributed and rank is None and world_size is None)
        self.order = self._resolve_order(_order_or_shuffle(order, shuffle), quasi_random_window, order_kwargs or {})
        self._order_context = OrderContext(_sample_pages(self.reader), batch_size, _image_modes(self.reader),
                                           _sample_lengths(self.reader), self.world_size, drop_last)
        # One slot per batch ahead and one per worker, plus the batch the loop holds and the one it held
        # while asking for the next (see beton.loader.epoch).
        self.num_slots = max(batches_ahead + 1, self.num_workers) + 2
        self.memory = OSCache(self.reader, readahead) if os_cache else ProcessCache(
            self.reader, self.num_slots, process_cache_pages, read_bandwidth)
        self._scratch = [Scratch() for _ in range(self.num_slots)]
        self._pipelines = pipelines  # the user's own operations, read (never changed) at every epoch's start
        self._kernel_cache_dir, self._fuse_stages = kernel_cache_dir or default_cache_dir(), fuse_stages
        self._compile_pipelines()
        self._next_epoch = 0
        self._next_position = 0
        self._active: weakref.ref[EpochIterator] | None = None
        self._progress: _Progress | None = None  # the latest epoch's position, kept after its iterator is gone
        self.fidelity: int | None = None

    def _compile_pipelines(self) -> None:
        """Plan the pipelines as their operations are now, allocate the slots for it, and compile it."""
        self._fingerprint = _pipelines_fingerprint(self._pipelines)
        outputs = resolve_pipelines(self.reader.fields, self._pipelines)
        columns = {field_name: metadata_column(self.reader, field_name) for _, field_name, _, _ in outputs}
        self.plan: Plan = build_plan(outputs, self._kernel_cache_dir, self._fuse_stages, columns)
        self._columns = [self.reader.descriptors[name].payload_column for name in self.plan.field_names]
        self._metadata = [columns[name] for name in self.plan.field_names]
        self._kernel_arguments = {
            (step.output, step.position): step.operation.kernel_arguments(step.input_state)
            for stage in self.plan.stages if stage.kind == "jit" for step in stage.steps
        }
        self._check_slot_memory()
        try:
            self._slots = [self._new_buffers() for _ in range(self.num_slots)]
        except MemoryError:
            raise LoaderError(f"{self._slot_memory_text()}: the allocation failed") from None
        # a buffer's count as seen from _reference_counts when only its slot list holds it (whatever its size)
        self._unreferenced = _reference_counts([np.empty(0, np.uint8)])[0]
        warm_up(self.plan, self._kernel_arguments, self._slots[0],
                [self.memory.empty_source(m, c) for m, c in zip(self._metadata, self._columns)])

    # ---- epochs -------------------------------------------------------------------------------------------

    def epoch_batches(self, epoch: int) -> list[np.ndarray]:
        """This rank's batches of an epoch, as arrays of sample indices (a pure function of seed and epoch)."""
        permutation = self.order.permutation(self.indices, self.seed, epoch, self._order_context)
        mine = shard(np.asarray(permutation, dtype=np.int64), self.rank, self.world_size, self.drop_last)
        count = len(mine) // self.batch_size if self.drop_last else -(-len(mine) // self.batch_size)
        return [mine[b * self.batch_size : (b + 1) * self.batch_size] for b in range(count)]

    @property
    def metadata(self) -> dict[str, Any]:
        """The file's metadata (class names, source, ...; see ``Reader.metadata``), a new dict on each access."""
        return self.reader.metadata

    def __len__(self) -> int:
        per_rank = len(shard(self.indices, self.rank, self.world_size, self.drop_last))
        return per_rank // self.batch_size if self.drop_last else -(-per_rank // self.batch_size)

    def __iter__(self) -> EpochIterator:
        self._close_active(supersede=True)
        if _pipelines_fingerprint(self._pipelines) != self._fingerprint:
            self._compile_pipelines()  # an operation changed since (FFCV's progressive resizing): replan
        epoch, first = self._next_epoch, self._next_position
        batches = self.epoch_batches(epoch)[first:]
        self.memory.start_epoch(batches, self._columns, self._read_pieces())  # may raise: the file changed
        self._next_epoch, self._next_position = epoch + 1, 0
        progress = self._progress = _Progress(epoch, first, first + len(batches))
        keys = {(s.output, s.position): operation_key(self.seed, epoch, s.output, s.position)
                for stage in self.plan.stages for s in stage.steps}
        iterator = EpochIterator(
            batches=batches, epoch=epoch, first_batch=first, num_workers=self.num_workers,
            num_slots=self.num_slots,
            make_job=lambda index, samples, slot: self._make_job(index - first, index, samples, epoch, keys, slot),
            run_job=self._run_job, finish=self._finish, delivered=progress.advance,
        )
        self._active = weakref.ref(iterator)
        return iterator

    def _resolve_order(self, order: Any, quasi_random_window: int | None, order_kwargs: Mapping[str, Any]) -> Order:
        if isinstance(order, Order):
            if order_kwargs:
                raise ValueError("order_kwargs apply to an order given as an OrderOption or a class, not an instance")
            return order
        if isinstance(order, type) and issubclass(order, TraversalOrder):
            return TraversalOrderAdapter(order(self, **order_kwargs))  # FFCV's contract: built with the loader
        if isinstance(order, type) and issubclass(order, Order):
            cls = order
        else:
            try:
                cls = ORDERS[OrderOption(order)]
            except (KeyError, ValueError):
                raise ValueError(f"order must be an OrderOption, an Order or a TraversalOrder class, got {order!r}") \
                    from None
        if cls in _WINDOWED_ORDERS:
            order_kwargs = {"window_pages": quasi_random_window, **order_kwargs}
        return cls(**order_kwargs)

    def filter(self, field_name: str, condition: Callable[[Any], bool]) -> Loader:
        """A new Loader, configured as this one (same seed), over the selected samples whose stored value of
        ``field_name`` satisfies ``condition`` (FFCV's ``Loader.filter``); e.g. ``loader.filter("label",
        lambda y: y < 5)``. Reads each selected sample's value of that field once."""
        if field_name not in self.reader.fields:
            raise PipelineError(f"filter: no field {field_name!r}; fields are {list(self.reader.fields)}")
        field, column = self.reader.fields[field_name], self.reader.data_table[field_name]
        kept = [int(i) for i in self.indices
                if condition(field.to_python(column[i], self.reader.payload(int(i), field_name)))]
        return Loader(**{**self._arguments, "indices": np.asarray(kept, dtype=np.int64), "seed": self.seed})

    def set_fidelity(self, scans: int | None) -> None:
        """Read only the first ``scans`` scans of progressive JPEGs from the next batch on (None: all of them).

        Changes between epochs (a fidelity schedule) need no rewrite; it overrides the decoders' ``fidelity``.
        With the process cache and scan-grouped images, the cache reads the scans the fidelity set when an epoch
        starts: a higher fidelity set mid-epoch applies from the next epoch on.
        """
        if scans is not None and scans < 1:
            raise ValueError(f"fidelity must be at least 1 scan, got {scans}")
        self.fidelity = scans

    def _read_pieces(self) -> dict[int, Pieces]:
        """Per payload column whose decoders read only parts of each allocation (the first scans of scan-grouped
        JPEGs at this epoch's fidelity), the parts they read; several decoders of one column read the most."""
        settings: dict[int, int | None] = {}
        for stage in self.plan.stages:
            for step in stage.steps:
                column = self._columns[step.output]
                if step.position != 0 or column < 0:
                    continue
                wanted = scans_to_read(self.fidelity, getattr(step.operation, "fidelity", None))
                known = settings.get(column, 0)
                settings[column] = None if wanted is None or known is None else max(wanted, known)
        pieces = {}
        for output, column in enumerate(self._columns):
            if column in settings and column not in pieces:
                field = self.reader.fields[self.plan.field_names[output]]
                found = field.read_pieces(self._metadata[output], settings[column])
                if found is not None:
                    pieces[column] = found
        return pieces

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration run this epoch from its start (as DistributedSampler.set_epoch)."""
        self._next_epoch, self._next_position = int(epoch), 0
        self._progress = None  # state_dict() now names this epoch's start, not an interrupted one

    def _make_job(self, local: int, index: int, samples: np.ndarray, epoch: int, keys: dict, slot: int) -> BatchJob:
        sources = [self.memory.source(metadata, column, samples, local, slot)
                   for metadata, column in zip(self._metadata, self._columns)]
        return BatchJob(index, local, samples, epoch, keys, sources, self.seed, self._scratch[slot], self.fidelity)

    def _run_job(self, job: BatchJob, slot: int) -> tuple:
        try:
            if not self.overwrite_kept:
                self._release_kept(slot)
            return run_batch(self.plan, self._kernel_arguments, self._slots[slot], job)
        finally:
            self.memory.batch_done(job.position)

    def _check_slot_memory(self) -> None:
        # A file's image records may claim large sizes (up to the pixel cap each): what the slots need follows
        # from them, and is refused when it exceeds the machine's memory rather than failing in numpy.
        if _slot_bytes(self.plan, self.batch_size) * self.num_slots > _physical_memory():
            raise LoaderError(f"{self._slot_memory_text()}, more than this machine's "
                              f"{_physical_memory() / 2**30:.1f} GiB of memory")

    def _slot_memory_text(self) -> str:
        largest = max(range(len(self.plan.buffers)), key=lambda b: _buffer_bytes(self.plan.buffers[b], 1))
        owner = next((self.plan.output_names[step.output] for stage in self.plan.stages for step in stage.steps
                      if step.buffer == largest), "?")
        spec = self.plan.buffers[largest]
        return (f"the batch slots would need {_slot_bytes(self.plan, self.batch_size) * self.num_slots / 2**30:.1f} "
                f"GiB ({self.num_slots} slots of batch_size={self.batch_size}; the largest buffer is pipeline "
                f"{owner!r}'s {spec.shape} {spec.dtype} per sample: the largest image in the file, for a decoder "
                "that keeps sizes; a crop decoder, a smaller batch_size or max_image_pixels= bound it)")

    def _new_buffers(self) -> list[np.ndarray]:
        return [np.empty((self.batch_size,) + spec.shape, spec.dtype) for spec in self.plan.buffers]

    def _release_kept(self, slot: int) -> None:
        # Views handed out for the slot's previous batch (numpy views, tensors from torch.from_numpy) each
        # hold a reference to the slot's buffer. The consumer no longer holds that batch unless it kept it
        # (see beton.loader.epoch), so a count above the baseline means a kept batch: leave it its memory.
        buffers = self._slots[slot]
        for index, count in enumerate(_reference_counts(buffers)):
            if count > self._unreferenced:
                buffers[index] = np.empty_like(buffers[index])

    def _finish(self, outputs: tuple) -> tuple:
        if self.pin_memory:
            return tuple(map_parts(_pinned, value) for value in outputs)  # both parts of Padded/Packed batches
        if not self.copy:
            return outputs
        return tuple(map_parts(_copy, value) for value in outputs)

    # ---- resume -------------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, int]:
        """(seed, epoch, position): enough to resume exactly where the training loop is.

        While an epoch is unfinished - running, or left by ``break``, an exception or Ctrl-C - the position is
        the one after the last batch the loop received, so a checkpoint saved on interrupt resumes the
        interrupted epoch. Otherwise it is the start of the next epoch.
        """
        progress = self._progress
        if progress is not None and progress.position < progress.end:
            return {"seed": self.seed, "epoch": progress.epoch, "position": progress.position}
        return {"seed": self.seed, "epoch": self._next_epoch, "position": self._next_position}

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        """The next iteration yields exactly the batches an uninterrupted run would have yielded next."""
        self._close_active(supersede=True)
        self.seed = int(state["seed"])
        self._next_epoch, self._next_position = int(state["epoch"]), int(state["position"])
        self._progress = None

    # ---- inspection and teardown ---------------------------------------------------------------------------

    def __repr__(self) -> str:
        pipelines = ", ".join(
            f"{name!r}: [{', '.join(repr(step.operation) for step in steps)}]"
            for name, steps in zip(self.plan.output_names, self._steps_by_output())
        )
        shard = f", rank={self.rank}/{self.world_size}" if self.world_size > 1 else ""
        return (f"Loader({os.fspath(self.reader.path)!r}, samples={len(self.indices)}, batches={len(self)}, "
                f"batch_size={self.batch_size}, order={type(self.order).__name__}, num_workers={self.num_workers}{shard}, "
                f"pipelines={{{pipelines}}})")

    def _steps_by_output(self) -> list[list[Any]]:
        steps: list[list[Any]] = [[] for _ in self.plan.output_names]
        for stage in self.plan.stages:
            for step in stage.steps:
                steps[step.output].append(step)
        return [sorted(output_steps, key=lambda step: step.position) for output_steps in steps]

    def explain(self) -> str:
        """The stages, their generated source and the output states."""
        return self.plan.explain()

    @property
    def memory_counters(self) -> dict[str, int]:
        """Pages and bytes read in the current (or last) epoch."""
        return self.memory.counters.snapshot()

    def _close_active(self, supersede: bool = False) -> None:
        active = self._active() if self._active else None
        if active is not None:
            active.supersede() if supersede else active.close()
        self._active = None

    def close(self) -> None:
        self._close_active()
        self.memory.close()

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - never raise from a finaliser
            pass


class _Progress:
    """Where the latest epoch stands: updated by its iterator, read by ``state_dict``."""

    def __init__(self, epoch: int, first: int, end: int) -> None:
        self.epoch, self.position, self.end = epoch, first, end

    def advance(self, position: int) -> None:
        self.position = position


def _buffer_bytes(spec: Any, batch_size: int) -> int:
    return batch_size * int(np.prod(spec.shape, dtype=np.int64)) * np.dtype(spec.dtype).itemsize


def _slot_bytes(plan: Plan, batch_size: int) -> int:
    return sum(_buffer_bytes(spec, batch_size) for spec in plan.buffers)


def _physical_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not POSIX: no bound known
        return 1 << 62


def _pipelines_fingerprint(pipelines: Mapping[str, Sequence[Any] | None] | None) -> tuple:
    """What the user's pipelines hold now, to notice between epochs an operation changed in place (ffcv-imagenet
    sets ``decoder.output_size`` before each epoch)."""
    return tuple(
        (name, None if operations is None else tuple((id(op), _operation_values(op)) for op in operations))
        for name, operations in (pipelines or {}).items()
    )


def _operation_values(operation: Any) -> str:
    if dataclasses.is_dataclass(operation):
        return repr([getattr(operation, field.name) for field in dataclasses.fields(operation)])
    return repr(sorted(vars(operation).items())) if hasattr(operation, "__dict__") else repr(operation)


def _reference_counts(buffers: list[np.ndarray]) -> list[int]:
    """Reference counts of the buffers, as seen from here (compared with those of fresh buffers)."""
    return [sys.getrefcount(buffer) for buffer in buffers]


def _agree_seed(seed: int | None, world_size: int, collective: bool) -> int:
    """The seed every rank uses: the given one; else one drawn (one rank), broadcast from rank 0 when the shard
    comes from the process group (``collective``: every rank builds its Loader), else 0."""
    if seed is not None:
        return int(seed)
    if world_size == 1:
        return secrets.randbits(63)
    if collective:
        drawn = [secrets.randbits(63) if torch.distributed.get_rank() == 0 else None]
        torch.distributed.broadcast_object_list(drawn, src=0)
        return int(drawn[0])
    return 0


def _pinned(value: Any) -> Any:
    return value.pin_memory() if isinstance(value, torch.Tensor) and value.device.type == "cpu" else value


def _copy(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, np.ndarray):
        return value.copy()
    return value


def _resolve_indices(indices: Any, num_samples: int) -> np.ndarray:
    if indices is None:
        return np.arange(num_samples, dtype=np.int64)
    selected = np.array(indices, dtype=np.int64).reshape(-1)
    if len(selected) and (selected.min() < 0 or selected.max() >= num_samples):
        raise IndexError(f"indices must lie in [0, {num_samples}), got values from {selected.min()} to {selected.max()}")
    return selected


def _resolve_shard(distributed: bool, rank: int | None, world_size: int | None) -> tuple[int, int]:
    if rank is None and world_size is None and distributed:
        if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
            raise PipelineError("distributed=True needs torch.distributed initialised, or rank= and world_size=")
        rank, world_size = torch.distributed.get_rank(), torch.distributed.get_world_size()
    rank, world_size = rank or 0, world_size or 1
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must lie in [0, world_size={world_size}), got {rank}")
    return rank, world_size


def _resolve_batches_ahead(batches_ahead: int | None, prefetch_factor: int | None, num_workers: int) -> int:
    if batches_ahead is not None and prefetch_factor is not None:
        raise ValueError("give batches_ahead or prefetch_factor (torch's name, per worker), not both")
    if prefetch_factor is not None:
        if prefetch_factor < 1:
            raise ValueError(f"prefetch_factor must be at least 1, got {prefetch_factor}")
        return prefetch_factor * max(1, num_workers)
    if batches_ahead is None:
        return 2
    if batches_ahead < 1:
        raise ValueError(f"batches_ahead must be at least 1, got {batches_ahead}")
    return batches_ahead


def _resolve_pin_memory(pin_memory: bool) -> bool:
    if pin_memory and not torch.cuda.is_available():
        warnings.warn("pin_memory=True is ignored: CUDA is not available", UserWarning, stacklevel=3)
        return False
    return bool(pin_memory)


def _order_or_shuffle(order: Any, shuffle: bool | None) -> Any:
    if shuffle is None:
        return OrderOption.SEQUENTIAL if order is None else order
    if order is None:
        return OrderOption.RANDOM if shuffle else OrderOption.SEQUENTIAL
    if _shuffles(order) != shuffle:
        raise ValueError(f"shuffle={shuffle} contradicts order={order!r}; give one of them")
    return order


def _shuffles(order: Any) -> bool:
    if isinstance(order, OrderOption):
        return order is not OrderOption.SEQUENTIAL
    kind = order if isinstance(order, type) else type(order)
    return not issubclass(kind, SequentialOrder)


def _image_modes(reader: Reader) -> dict[str, np.ndarray]:
    # copies: the orders read them every epoch, and the memory layer never reads the file's map after opening
    return {name: np.array(reader.data_table[name]["mode"]) for name, field in reader.fields.items()
            if isinstance(field, RGBImageField)}


def _sample_lengths(reader: Reader) -> dict[str, np.ndarray]:
    """Per field with lengths (ragged arrays, byte strings), each sample's length: copies, as _image_modes."""
    lengths = {}
    for name, field in reader.fields.items():
        column = reader.descriptors[name].payload_column
        sizes = reader.allocation_table[:, column]["size"] if column >= 0 else None
        found = field.lengths(reader.data_table[name], sizes)
        if found is not None:
            lengths[name] = np.array(found, dtype=np.int64)
    return lengths


def _sample_pages(reader: Reader) -> np.ndarray:
    """Page of each sample's first payload; files without payloads get pseudo-pages of 1024 samples."""
    if reader.allocation_table.shape[1] == 0 or reader.num_samples == 0:
        return np.arange(reader.num_samples, dtype=np.int64) // 1024
    offsets = reader.allocation_table[:, 0]["offset"].astype(np.int64)
    return (offsets - reader.heap_offset) // reader.page_size
