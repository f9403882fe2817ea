"""Loader: the torch DataLoader replacement. Reads a .beton file (or several as one) through compiled per-field
pipelines.

The Loader is configuration plus resume state: it resolves its options (memory strategy, order, shard, seed,
pipelines), plans and compiles the pipelines, and hands each epoch to the epoch engine
(:mod:`beton.loader.epoch`), which owns the batch slots and the threads.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import sys
import warnings
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, Union

import numpy as np
import torch

from beton._cores import resolve_workers
from beton.errors import LoaderError, PipelineError, ResumeError, locate
from beton.fields.base import Field
from beton.fields.scalar import FloatField, IntField
from beton.loader.epoch import Delivery, EpochEngine, EpochIterator, Progress
from beton.loader.options import CompileOptions, resolve_memory
from beton.loader.pipelines import check_pipelines, resolve_pipelines
from beton.loader.resume import Identity, ResumeState, describe_order, indices_digest
from beton.memory import OSCache
from beton.memory.base import MemoryStrategy, StoredField
from beton.order import ORDERS, Order, OrderContext, OrderOption, shard
from beton.order.base import checked_permutation
from beton.order.contracts import build_order, is_order_class
from beton.order.remainder import Interruption, consumed_and_left, remainder
from beton.pipeline.compiler import Plan, build_plan, default_cache_dir
from beton.pipeline.spec import PipelineSpec
from beton.dataset.union import OpenedDataset, content_digest, open_dataset
from beton.storage.remote import RemoteOptions, is_url
from beton.dataset.shards import Source, names_one_file
from beton.threading_layer import ensure_thread_safe_layer

__all__ = ["Loader", "ORDER_TYPE"]

#: What ``Loader(order=...)`` takes (FFCV's ``ORDER_TYPE``): an :class:`OrderOption`, an :class:`Order` instance, or
#: a class - an Order subclass or a subclass of FFCV's ``TraversalOrder`` (:mod:`beton.traversal_order`; named as
#: ``type`` here because the loader sits below the FFCV layer and never imports it).
ORDER_TYPE = Union[OrderOption, Order, type]


def _fixed(name: str, what: str) -> property:
    """A Loader attribute set once, when it is built: assigning it raises instead of being silently ignored."""

    def get(loader: Loader) -> Any:
        return getattr(loader, f"_{name}")

    def refuse(loader: Loader, value: Any) -> None:
        raise AttributeError(f"Loader.{name} ({what}) is fixed when the Loader is built: build another Loader "
                             f"with {name}={value!r}")

    return property(get, refuse, doc=f"{what[0].upper()}{what[1:]}, fixed when the Loader is built.")


class Loader:
    """Iterate over batches of a .beton file, or of several files as one dataset, one tuple of outputs per batch (in
    field order).

    Args:
        path: the .beton file (a path or URL); or several as one dataset: a list of paths and URLs, a glob
            (``"data/train-*.beton"``, sorted by name), a manifest file (``"train.json"``, from ``beton index``) or a
            :class:`~beton.dataset.Manifest`. Global sample indices run across the files in order (``indices=``,
            orders, sharding, ``state_dict`` use them), and the files' fields must match (see
            :mod:`beton.dataset.union` and docs/loader.md).
        batch_size: samples per batch.
        num_workers: worker threads; -1 uses every usable core; 0 computes each batch in the calling thread
            when the loop asks for it (for debugging: breakpoints and profilers see the pipeline).
        os_cache: FFCV's shorthand for ``memory=``: True is ``OSCache()``, False is ``ProcessCache()`` (default:
            as ``memory=`` says, else the OS cache). Contradicting ``memory=`` is an error.
            A URL, and several files as one, are always read through the process cache (there is no memory map of
            a remote file, nor one of several files); ``remote=`` sets how URLs are read.
        order: an :class:`OrderOption`, an :class:`~beton.order.Order` instance or subclass, or a subclass of
            FFCV's :class:`~beton.traversal_order.TraversalOrder` (default SEQUENTIAL, or RANDOM with
            ``shuffle=True``).
        distributed: shard by ``torch.distributed`` rank and world size (or by ``rank``/``world_size``). Building
            the Loader is then a collective call (every rank builds it, as DDP code does): the ranks compare their
            dataset (by content), ``indices``, order and seed, and a LoaderError on every rank names what differs.
        seed: a whole number of at least 0; seeds the order and every random augmentation; None draws one,
            recorded in ``state_dict()``.
            Under ``distributed=True`` every rank must use the same seed, or the ranks' shares overlap: with
            None, rank 0 draws one and broadcasts it through the process group; with ``rank=``/``world_size=``
            given by hand, the seed is 0 (as FFCV's).
        indices: the subset of samples to load (in this order for SEQUENTIAL): whole sample numbers; a boolean
            mask or floats are refused (``np.flatnonzero(mask)`` gives a mask's numbers).
        pipelines: field name -> list of operations; a missing field gets its default decoder and
            ToTensor; ``None`` drops the field.
        custom_fields: field classes for stored types that cannot be imported (see :class:`~beton.Reader`); an
            instance, as FFCV programs pass, stands for its class (the file's stored arguments build the field).
        drop_last: drop the last partial batch (default False: partial batches are delivered).
        batches_ahead: batches prepared ahead of the training loop.
        recompile: accepted for FFCV compatibility: an operation changed between epochs (``decoder.output_size =
            ...``) is noticed at the next ``iter(loader)``, which plans and allocates again. Changes are found by
            comparing the operations' attributes as their repr shows them: edit a large array inside an
            operation in place and the change goes unseen; replace the operation (or the array) instead.

    beton's own options:

        memory: where payloads are read from, a declared strategy (:mod:`beton.memory`):
            ``OSCache(readahead=True)`` reads through a memory map (the OS page cache; ``readahead=False`` reads
            only the touched pages); ``ProcessCache(pages=None, read_bandwidth=None)`` reads whole pages ahead in
            the epoch's known order into a bounded pool (see :mod:`beton.memory.process_cache`). One strategy
            object may serve several Loaders.
        rank, world_size: this process's shard, given by hand (instead of ``distributed=True``).
        copy: return copies of every batch (costs a copy per batch; rarely needed, see ``overwrite_kept``).
        overwrite_kept: False (default): a batch the loop keeps (``outputs.append(y)``) stays valid, like a
            torch DataLoader's: before refilling a slot, the Loader checks whether anything still references
            its memory and, if so, gives the slot fresh memory. True: FFCV's zero-copy ring, in which a batch
            is overwritten a few batches later whether or not it was kept (valid only until the next batch
            is requested; for loops that never keep a batch, saving the check's rare allocations).
        compile_options: :class:`~beton.loader.CompileOptions` (``kernel_cache_dir``, ``fuse_stages``).
        order_kwargs: keyword arguments for the order's class (e.g. ``{"window_pages": 4}`` for QUASI_RANDOM and
            BALANCED, see :mod:`beton.order.quasi_random`; or those of a TraversalOrder subclass).
        max_image_pixels: refuse files holding an image of more decoded pixels (see :class:`~beton.Reader`);
            by default ``$BETON_MAX_IMAGE_PIXELS`` or 2**27; None lifts the cap.
        remote: how files at URLs (and manifests listing them) are read, a :class:`~beton.RemoteOptions`: fsspec's
            ``storage_options``, the page cache on disk (``cache_dir``, ``cache_limit``), requests in flight,
            retries (docs/remote.md); local paths ignore it.
        verify_content: check every page against the file's SHA-256 content digest the first time it is loaded
            (``CorruptDataError`` naming file and page), as ``Reader(verify_content=True)``; an FFCV file, which
            has no digests, is refused. The shards of a manifest file are always checked so. Costs a hash of
            each page once (docs/format.md, "Digest table").

    The torch DataLoader's names are accepted where they mean something:

        shuffle: True is ``order=OrderOption.RANDOM``, False is SEQUENTIAL (an ``order`` that disagrees is an
            error).
        pin_memory: copy every output tensor into page-locked memory, for faster and asynchronous copies to
            a GPU; only where CUDA is available (elsewhere a warning says it is ignored, as torch's does).
        prefetch_factor: batches prepared ahead per worker, as torch's: ``batches_ahead = prefetch_factor *
            max(1, num_workers)`` (give one or the other).
        persistent_workers: accepted and changes nothing: compiled stages and the batch slots already persist
            across epochs, and starting worker threads costs microseconds.

    ``loader.memory_strategy`` is the declared strategy and ``loader.memory`` the running layer built from it
    (``loader.memory_counters``: what the current epoch read); ``loader.compile_options`` and ``loader.order``
    are the resolved compile options and order.
    """

    def __init__(
        self,
        path: Source,
        batch_size: int,
        num_workers: int = -1,
        os_cache: bool | None = None,
        order: ORDER_TYPE | None = None,
        distributed: bool = False,
        seed: int | None = None,
        indices: Sequence[int] | np.ndarray | None = None,
        pipelines: Mapping[str, Sequence[Any] | None] | None = None,
        custom_fields: Mapping[str, type[Field]] | None = None,
        drop_last: bool = False,
        batches_ahead: int | None = None,
        *,
        recompile: bool = False,
        memory: MemoryStrategy | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        copy: bool = False,
        overwrite_kept: bool = False,
        compile_options: CompileOptions | None = None,
        order_kwargs: Mapping[str, Any] | None = None,
        max_image_pixels: int | None | Literal["environment"] = "environment",
        remote: RemoteOptions | None = None,
        verify_content: bool = False,
        shuffle: bool | None = None,
        pin_memory: bool = False,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
    ) -> None:
        self._active: weakref.ref[EpochIterator] | None = None  # first: close() must work if __init__ fails
        batch_size = _whole("batch_size", batch_size, 1)
        one_file = names_one_file(path)
        unmapped = not one_file or is_url(path)  # several files, or a URL: no memory map can hold them
        if unmapped and memory is None and os_cache is None:
            os_cache = False  # the process cache reads them
        memory = resolve_memory(os_cache, memory)
        if one_file and unmapped and isinstance(memory, OSCache):
            raise ValueError(f"{_describe(path)} is read through the process cache (a remote file has no memory "
                             "map): leave os_cache and memory out, or pass memory=ProcessCache(...)")
        compile_options = compile_options if compile_options is not None else CompileOptions()
        check_pipelines(pipelines)  # before anything reads them, so a slip is named with its fix
        order = _order_or_shuffle(order, shuffle)
        order_kwargs = dict(order_kwargs or {})
        # what filter() builds another Loader from: the options as resolved, in their current spelling
        self._arguments = dict(
            path=path, batch_size=batch_size, num_workers=num_workers, order=order, distributed=distributed,
            seed=seed, indices=indices, pipelines=pipelines, custom_fields=custom_fields, drop_last=drop_last,
            batches_ahead=batches_ahead, memory=memory, rank=rank, world_size=world_size, copy=copy,
            overwrite_kept=overwrite_kept, compile_options=compile_options, order_kwargs=order_kwargs,
            max_image_pixels=max_image_pixels, remote=remote, pin_memory=pin_memory, prefetch_factor=prefetch_factor,
            verify_content=verify_content)
        ensure_thread_safe_layer()
        # one file (a Reader) or several as one (a ShardedDataset): the rest reads both alike
        self.reader: OpenedDataset = open_dataset(path, custom_fields=custom_fields, max_image_pixels=max_image_pixels,
                                                  remote=remote, verify_content=verify_content)
        self._batch_size = batch_size
        self._num_workers = resolve_workers(num_workers, minimum=0)
        batches_ahead = _resolve_batches_ahead(batches_ahead, prefetch_factor, self.num_workers)
        self.pin_memory = _resolve_pin_memory(pin_memory)
        self._drop_last = drop_last
        self.copy = copy
        self.overwrite_kept = overwrite_kept
        self._indices = _resolve_indices(indices, self.reader.num_samples)
        self._rank, self._world_size = _resolve_shard(distributed, rank, world_size)
        collective = distributed and rank is None and world_size is None  # the shard comes from the process group
        self.seed = _agree_seed(seed, self.world_size, collective)
        self.order = self._resolve_order(order, order_kwargs)
        self._order_context = OrderContext(_sample_pages(self.reader), batch_size, _storage_modes(self.reader),
                                           _sample_lengths(self.reader), self.world_size, drop_last)
        # One slot per batch ahead and one per worker, plus the batch the loop holds and the one it held
        # while asking for the next (see beton.memory.slots).
        self.num_slots = max(batches_ahead + 1, self.num_workers) + 2
        self.memory_strategy = memory
        self.memory = memory.build(self.reader, self.num_slots)
        self.compile_options = compile_options
        self._pipelines = pipelines  # the user's own operations, read (never changed) at every epoch's start
        self._engine: EpochEngine | None = None  # per plan: built by _compile_pipelines, again after a change
        self._compile_pipelines()
        self._next_epoch = 0
        self._next_batch = 0
        # earlier plans of the next epoch: a state saved under another world size or batch size (beton.order.remainder)
        self._resumed: tuple[Interruption, ...] = ()
        self._progress: Progress | None = None  # the latest epoch's, kept after its iterator is gone
        self._progress_resumed: tuple[Interruption, ...] = ()  # and the earlier plans it went on from
        self._progress_plan: Interruption | None = None  # and its own plan (batch_size may change after it)
        self._order_cache: tuple[Order, tuple, np.ndarray] | None = None  # (order, what for, the global order)
        self._identity_cache: Identity | None = None
        if collective and self.world_size > 1:
            self._check_the_ranks_agree()

    def _check_the_ranks_agree(self) -> None:
        """Every rank of the process group reads the same samples in the same order, or their shares overlap and
        leave samples out, and they get different numbers of batches (a job hangs at the epoch's end): each rank's
        dataset (by content), selection, order and seed, gathered and compared (a collective call, as the seed's
        broadcast is). A LoaderError on every rank names the first rank that differs from rank 0, and how."""
        names = (*(field.name for field in dataclasses.fields(Identity)), "seed")
        mine = (*dataclasses.astuple(self._identity()), self.seed)
        everyone: list[Any] = [None] * self.world_size
        torch.distributed.all_gather_object(everyone, mine)
        other = next((rank for rank, theirs in enumerate(everyone) if theirs != everyone[0]), None)
        if other is not None:
            differences = ", ".join(f"{name} {theirs!r} (rank 0: {first!r})" for name, first, theirs
                                    in zip(names, everyone[0], everyone[other]) if first != theirs)
            self.close()
            raise locate(LoaderError(
                f"the ranks did not open the same data: rank {other} has {differences}. Every rank must name the same "
                "files (a glob listed while a writer still added shards sees fewer), indices, order and seed"),
                path=self.reader.path)

    def _compile_pipelines(self) -> None:
        """Plan the pipelines as their operations are now, compile them, and build the engine (with its slots)."""
        self._fingerprint = _pipelines_fingerprint(self._pipelines)
        outputs = resolve_pipelines(self.reader.fields, self._pipelines)
        stored = {name: StoredField.of(self.reader, name) for _, name, _, _ in outputs}
        options = self.compile_options
        self.plan: Plan = build_plan(outputs, options.kernel_cache_dir or default_cache_dir(), options.fuse_stages,
                                     {name: field.metadata for name, field in stored.items()},
                                     self._order_context.lengths)
        previous = self._engine
        self._engine = EpochEngine(
            self.plan, [stored[name] for name in self.plan.field_names], self.memory, batch_size=self.batch_size,
            num_slots=self.num_slots, num_workers=self.num_workers,
            delivery=Delivery(self.pin_memory, self.copy, self.overwrite_kept),
            fidelity=previous.fidelity if previous is not None else None)

    # ---- settings -----------------------------------------------------------------------------------------
    # FFCV programs assign some of a Loader's attributes between epochs. Those that can change are properties
    # whose setters keep what was derived from them in step (a stale order, resume identity or batch slots
    # would give other samples, or write past a slot); the rest refuse assignment, rather than be ignored.

    @property
    def batch_size(self) -> int:
        """Samples per batch. Assignable between epochs, as FFCV's: the next ``iter(loader)`` plans its batches
        and allocates the batch slots for the new size; an epoch already running keeps its own."""
        return self._batch_size

    @batch_size.setter
    def batch_size(self, value: int) -> None:
        self._change_plan(batch_size=_whole("batch_size", value, 1))

    @property
    def drop_last(self) -> bool:
        """Whether the last partial batch (and with several ranks, the samples no rank gets as many of) is dropped;
        assignable between epochs."""
        return self._drop_last

    @drop_last.setter
    def drop_last(self, value: bool) -> None:
        self._change_plan(drop_last=bool(value))

    @property
    def indices(self) -> np.ndarray:
        """The samples loaded, in the Loader's own read-only array; assigning a new selection (validated as
        ``indices=`` is) takes effect at the next epoch."""
        return self._indices

    @indices.setter
    def indices(self, value: Any) -> None:
        if self._next_batch or self._resumed:
            raise ResumeError("indices cannot change while a resumed epoch is pending: its remaining samples are "
                              "those of the selection it was saved with (set indices before load_state_dict)")
        self._indices = _resolve_indices(value, self.reader.num_samples)
        self._settings_changed()

    @property
    def next_epoch(self) -> int:
        """The epoch the next ``iter(loader)`` runs (FFCV's attribute); assigning it is :meth:`set_epoch`."""
        return self._next_epoch

    @next_epoch.setter
    def next_epoch(self, epoch: int) -> None:
        self.set_epoch(epoch)

    num_workers = _fixed("num_workers", "worker threads")
    rank = _fixed("rank", "this process's shard")
    world_size = _fixed("world_size", "the number of shards")

    def _plan(self) -> Interruption:
        """This Loader's plan as it stands (at position 0)."""
        return Interruption(self.world_size, self.batch_size, self.drop_last, 0)

    def _change_plan(self, **change: Any) -> None:
        """A new batch size or drop_last. A resume position pending in the current plan becomes an interruption
        of it, and the rest of its epoch is planned anew with the new setting (as a state loaded from another
        plan is)."""
        if all(getattr(self, f"_{name}") == value for name, value in change.items()):
            return
        if self._next_batch:
            self._resumed += (dataclasses.replace(self._plan(), position=self._next_batch),)
            self._next_batch = 0
        for name, value in change.items():
            setattr(self, f"_{name}", value)
        self._settings_changed()

    def _settings_changed(self) -> None:
        """What is derived from batch_size, drop_last and indices follows them."""
        self._order_context = dataclasses.replace(self._order_context, batch_size=self.batch_size,
                                                  drop_last=self.drop_last)
        self._order_cache = self._identity_cache = None
        self._arguments.update(batch_size=self.batch_size, drop_last=self.drop_last, indices=self.indices)
        self._rebuild_ffcv_order()

    def _rebuild_ffcv_order(self) -> None:
        """FFCV's orders read the Loader's settings and seed when built: one is built anew after they change."""
        if self.order.reads_loader:
            self.order = self._resolve_order(self._arguments["order"], self._arguments["order_kwargs"])

    # ---- epochs -------------------------------------------------------------------------------------------

    def epoch_batches(self, epoch: int) -> list[np.ndarray]:
        """This rank's batches of an epoch, as arrays of sample indices (a pure function of seed and epoch)."""
        return self._batches(epoch, ())

    def _batches(self, epoch: int, resumed: tuple[Interruption, ...]) -> list[np.ndarray]:
        """This rank's batches of the epoch's order after the earlier plans ``resumed`` (all of it if none)."""
        mine = shard(self._epoch_order(epoch, resumed), self.rank, self.world_size, self.drop_last,
                     pad=lambda order, total: self.order.pad(order, total, self._order_context))
        count = len(mine) // self.batch_size if self.drop_last else -(-len(mine) // self.batch_size)
        return [mine[b * self.batch_size : (b + 1) * self.batch_size] for b in range(count)]

    def _epoch_order(self, epoch: int, resumed: tuple[Interruption, ...]) -> np.ndarray:
        """The epoch's global order, less what the earlier plans ``resumed`` delivered of it."""
        order = self._permutation(epoch, resumed[0] if resumed else None)
        for cut in resumed:
            order = remainder(order, cut)
        return order

    def _permutation(self, epoch: int, first: Interruption | None) -> np.ndarray:
        """The epoch's global order as its first plan (``first``, else this Loader's own) made it: an order may
        depend on the world size, batch size and drop_last. The latest is kept: state_dict() asks again."""
        context = self._order_context
        if first is not None:
            context = dataclasses.replace(context, world_size=first.world_size, batch_size=first.batch_size,
                                          drop_last=first.drop_last)
        key = (self.seed, epoch, context.world_size, context.batch_size, context.drop_last)
        cached = self._order_cache
        if cached is None or cached[0] is not self.order or cached[1] != key:  # ``is``: an order may hold arrays
            # a writable copy: an order may shuffle what it is given in place (and numpy's permutation of an empty
            # read-only array raises on some versions), and the Loader's own array must stay as it is
            permutation = checked_permutation(self.order, self.order.permutation(np.array(self.indices), self.seed,
                                                                                 epoch, context),
                                              self.indices, self.reader.num_samples, epoch)
            cached = self._order_cache = (self.order, key, permutation)
        return cached[2]

    @property
    def metadata(self) -> dict[str, Any]:
        """The file's metadata (class names, source, ...; see ``Reader.metadata``), a new dict on each access."""
        return self.reader.metadata

    def __len__(self) -> int:
        if not self.order.permutes:  # an order that may repeat or leave out samples (FFCV's): count what it gives
            return len(self.epoch_batches(self._next_epoch))
        per_rank = len(shard(self.indices, self.rank, self.world_size, self.drop_last))
        return per_rank // self.batch_size if self.drop_last else -(-per_rank // self.batch_size)

    def __iter__(self) -> EpochIterator:
        self._close_active("iter(loader) started another epoch; a Loader runs one epoch at a time")
        if _pipelines_fingerprint(self._pipelines) != self._fingerprint or self._engine.batch_size != self.batch_size:
            self._compile_pipelines()  # an operation or the batch size changed since (FFCV's progressive resizing)
        epoch, resumed = self._next_epoch, self._resumed
        batches = self._batches(epoch, resumed)
        if self._next_batch > len(batches):
            raise ResumeError(f"the state's position {self._next_batch} lies past the {len(batches)} batches of "
                              f"epoch {epoch} on this rank")
        iterator = self._engine.start(epoch, batches, self._next_batch, self.seed, owner=self)
        self._next_epoch, self._next_batch, self._resumed = epoch + 1, 0, ()
        self._progress, self._progress_resumed = iterator.progress, resumed
        self._progress_plan = self._plan()
        self._active = weakref.ref(iterator)
        return iterator

    def _resolve_order(self, order: Any, order_kwargs: Mapping[str, Any]) -> Order:
        if isinstance(order, Order):
            if order_kwargs:
                raise ValueError("order_kwargs apply to an order given as an OrderOption or a class, not an instance")
            return order
        cls = _order_class(order)
        if cls is None:
            raise ValueError(f"order must be an OrderOption, an Order or a TraversalOrder class, got {order!r}")
        return build_order(cls, self, order_kwargs)  # FFCV's TraversalOrder is built with the loader

    def filter(self, field_name: str, condition: Callable[[Any], bool]) -> Loader:
        """A new Loader, configured as this one (same seed), over the selected samples whose stored value of
        ``field_name`` satisfies ``condition`` (FFCV's ``Loader.filter``); e.g. ``loader.filter("label",
        lambda y: y < 5)``. Reads each selected sample's value of that field once.

        The condition gets what FFCV's gives it: for an int or float field, a numpy array of shape (1,) (int64,
        float64), so that both ``lambda y: y[0] < 5`` (FFCV's spelling) and ``lambda y: y < 5`` work; for
        any other field, the field's Python value (``Reader[i]``'s)."""
        if field_name not in self.reader.fields:
            raise PipelineError(f"filter: no field {field_name!r}; fields are {list(self.reader.fields)}")
        field, column = self.reader.fields[field_name], self.reader.data_table[field_name]
        kept = [int(i) for i in self.indices
                if condition(_filter_value(field, column[i], self.reader.payload(int(i), field_name)))]
        return Loader(**{**self._arguments, "indices": np.asarray(kept, dtype=np.int64), "seed": self.seed})

    def set_fidelity(self, scans: int | None) -> None:
        """Read only the first ``scans`` scans of progressive JPEGs from the next batch on (None: all of them).

        Changes between epochs (a fidelity schedule) need no rewrite; it overrides the decoders' ``fidelity``.
        With the process cache and scan-grouped images, the cache reads the scans the fidelity set when an epoch
        starts: a higher fidelity set mid-epoch applies from the next epoch on.
        """
        if scans is not None and scans < 1:
            raise ValueError(f"fidelity must be at least 1 scan, got {scans}")
        self._engine.fidelity = scans

    @property
    def fidelity(self) -> int | None:
        """The fidelity ``set_fidelity`` set (None: the decoders' own); assigning it is ``set_fidelity``."""
        return self._engine.fidelity

    @fidelity.setter
    def fidelity(self, scans: int | None) -> None:
        self.set_fidelity(scans)

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration run this epoch (as DistributedSampler.set_epoch): from its start, unless the
        Loader is to resume this very epoch (``load_state_dict``, or a batch size changed mid-epoch), which it then
        still does. Loops call ``set_epoch(epoch)`` at the top of every epoch, the resumed one included: resetting
        it there replayed the samples trained before the checkpoint."""
        epoch = _whole("epoch", epoch, 0)
        if epoch == self._next_epoch and (self._next_batch or self._resumed):
            return
        self._next_epoch, self._next_batch, self._resumed = epoch, 0, ()
        self._progress = None  # state_dict() now names this epoch's start, not an interrupted one

    # ---- resume -------------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Where the training loop is, and what that means something for: enough to resume exactly, on this many
        ranks or another (see :mod:`beton.loader.resume` for the keys).

        ``epoch`` and ``position`` (the number of the next batch of the epoch the loop would receive) say where;
        ``samples`` how many samples of the epoch every rank together received. While an epoch is unfinished -
        running, or left by ``break``, an exception or Ctrl-C - the position is the one after the last batch the
        loop received, so a checkpoint saved on interrupt resumes the interrupted epoch. Otherwise it is the start
        of the next epoch. The ranks of a distributed job move in step, so every rank's state is the same: save
        any one (usually rank 0's).
        """
        progress = self._progress
        if progress is not None and not progress.finished:  # in the plan it ran under, whatever was set since
            epoch, position, resumed, own = progress.epoch, progress.next_batch, self._progress_resumed, \
                self._progress_plan
        else:
            epoch, position, resumed, own = self._next_epoch, self._next_batch, self._resumed, self._plan()
        plan = dataclasses.replace(own, position=position)
        return ResumeState(self.seed, epoch, position, self._received(epoch, resumed, plan), plan, resumed,
                           self._identity()).to_dict()

    def _received(self, epoch: int, resumed: tuple[Interruption, ...], plan: Interruption) -> int:
        """Real samples of the epoch every rank together received under the plans ``resumed``, then ``plan``."""
        if not resumed and not plan.position:
            return 0
        count, total = len(self._permutation(epoch, resumed[0] if resumed else plan)), 0
        for cut in (*resumed, plan):
            received, count = consumed_and_left(count, cut)
            total += received
        return total

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Go on from ``state`` (from ``state_dict()``): the next iteration yields exactly what the interrupted run
        would have yielded next.

        Under another world size, batch size or ``drop_last`` than the state's, the interrupted epoch goes on with
        every sample it had yet to deliver, each once across the new ranks (padded or cut as ``drop_last`` says;
        see :mod:`beton.order.remainder`), and the next epochs are those a fresh run of this Loader gives. A state
        saved over another dataset (by content), selection of samples, order, or another seed than the one this
        Loader was given raises :class:`~beton.errors.ResumeError` naming what differs; a Loader built with
        ``seed=None`` takes the state's seed.
        """
        parsed = ResumeState.parse(state)
        parsed.check(self._identity(), self._arguments["seed"])
        seed, order = self.seed, self.order
        if parsed.seed != self.seed:
            self.seed = parsed.seed
            self._rebuild_ffcv_order()
        try:  # a state is untrusted input: its count must be the one its plans give (they say what is left)
            received = self._received(parsed.epoch, parsed.resumed, parsed.plan)
            if received != parsed.samples:
                raise ResumeError(f"the state does not hold together: its 'samples' is {parsed.samples}, but its "
                                  f"plans ('world_size', 'batch_size', 'drop_last', 'position' and 'resumed') "
                                  f"delivered {received} samples of epoch {parsed.epoch}: resume from a state "
                                  f"state_dict() wrote, unedited")
        except BaseException:
            self.seed, self.order = seed, order
            raise
        self._close_active("load_state_dict() moved the Loader elsewhere")
        if (parsed.plan.world_size, parsed.plan.batch_size, parsed.plan.drop_last) == (
                self.world_size, self.batch_size, self.drop_last):
            resumed, position = parsed.resumed, parsed.position  # the same plan: its next batch
        else:  # another plan: the rest of the epoch, planned anew
            resumed, position = parsed.resumed + ((parsed.plan,) if parsed.position else ()), 0
        self._next_epoch, self._next_batch, self._resumed = parsed.epoch, position, resumed
        self._progress = None

    def _identity(self) -> Identity:
        if self._identity_cache is None:
            self._identity_cache = Identity(content_digest(self.reader), indices_digest(self.indices),
                                            describe_order(self.order))
        return self._identity_cache

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
    def code(self) -> Plan:
        """FFCV's ``loader.code``: what the epochs run, here the compiled plan (its source: :meth:`explain`). The
        same object from epoch to epoch until an operation changes; ``recompile=True`` replans nothing more."""
        return self.plan

    @property
    def memory_counters(self) -> dict[str, int]:
        """Pages and bytes read in the current (or last) epoch."""
        return self.memory.counters.snapshot()

    def _close_active(self, reason: str) -> None:
        active = self._active() if self._active else None
        if active is not None:
            active.interrupt(reason)
        self._active = None

    def close(self) -> None:
        """End the running epoch, stop its threads and release every file: the memory layer's and the dataset's
        (for several files, every shard still open). Batches already handed out stay valid."""
        self._close_active("the Loader was closed")
        self.memory.close()
        self.reader.close()  # not in __del__: whoever still holds loader.reader reads it on

    def __reduce__(self) -> tuple:
        """``pickle``, ``copy.copy`` and ``copy.deepcopy`` give a new Loader configured as this one, at this one's
        ``state_dict()`` (files are opened and threads started anew: nothing running is shared)."""
        return _rebuilt, (self._arguments, self.state_dict())

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:
        if sys.is_finalizing():
            return  # see EpochIterator.__del__: the process's end releases what a close would
        try:
            self._close_active("the Loader was closed")
            self.memory.close()
        except Exception:  # noqa: BLE001 - never raise from a finaliser
            pass


def _filter_value(field: Field, record: np.void, payload: np.ndarray | None) -> Any:
    """One sample's value as ``Loader.filter`` hands it to the condition: FFCV's decoders give a scalar field's
    samples the shape (1,), and FFCV's filter passes them so."""
    value = field.to_python(record, payload)
    if isinstance(field, (IntField, FloatField)):
        return np.array([value], dtype=field.metadata_dtype["value"].newbyteorder("="))
    return value


def _rebuilt(arguments: Mapping[str, Any], state: Mapping[str, Any]) -> Loader:
    loader = Loader(**{**arguments, "seed": state["seed"]})
    loader.load_state_dict(state)
    return loader


def _pipelines_fingerprint(pipelines: Mapping[str, Sequence[Any] | None] | None) -> tuple:
    """What the user's pipelines hold now, to notice between epochs an operation changed in place (ffcv-imagenet
    sets ``decoder.output_size`` before each epoch)."""
    return tuple(
        (name, None if operations is None else tuple(
            (id(op), _operation_values(op))
            for op in (operations.operations() if isinstance(operations, PipelineSpec) else operations)))
        for name, operations in (pipelines or {}).items()
    )


def _operation_values(operation: Any) -> str:
    if dataclasses.is_dataclass(operation):
        return repr([getattr(operation, field.name) for field in dataclasses.fields(operation)])
    return repr(sorted(vars(operation).items())) if hasattr(operation, "__dict__") else repr(operation)


def _agree_seed(seed: int | None, world_size: int, collective: bool) -> int:
    """The seed every rank uses: the given one; else one drawn (one rank), broadcast from rank 0 when the shard
    comes from the process group (``collective``: every rank builds its Loader), else 0."""
    if seed is not None:
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ValueError(f"seed must be a whole number of at least 0 (or None to draw one), got {seed!r}")
        return int(seed)
    if world_size == 1:
        return secrets.randbits(63)
    if collective:
        drawn = [secrets.randbits(63) if torch.distributed.get_rank() == 0 else None]
        torch.distributed.broadcast_object_list(drawn, src=0)
        return int(drawn[0])
    return 0


def _resolve_indices(indices: Any, num_samples: int) -> np.ndarray:
    if indices is None:
        selected = np.arange(num_samples, dtype=np.int64)
        selected.flags.writeable = False
        return selected
    given = np.asarray(indices)
    if given.ndim > 1:
        raise ValueError(f"indices must be a flat sequence of sample numbers, got an array of shape {given.shape}")
    if given.dtype == bool:
        raise ValueError("indices is a boolean mask: pass the sample numbers it selects, np.flatnonzero(mask) "
                         "(a mask read as numbers would select samples 0 and 1)")
    if given.size and not np.issubdtype(given.dtype, np.integer):
        raise ValueError(f"indices must be whole sample numbers, got an array of {given.dtype} (values such as 1.7 "
                         "are not rounded to a sample: convert them yourself)")
    selected = given.astype(np.int64).reshape(-1)  # a copy: the Loader's own, never the caller's array
    if len(selected) and (selected.min() < 0 or selected.max() >= num_samples):
        raise IndexError(f"indices must lie in [0, {num_samples}), got values from {selected.min()} to {selected.max()}")
    selected.flags.writeable = False  # changed in place, it would not match the order and identity derived from it
    return selected


def _resolve_shard(distributed: bool, rank: int | None, world_size: int | None) -> tuple[int, int]:
    if rank is None and world_size is None and distributed:
        if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
            raise PipelineError("distributed=True needs torch.distributed initialised, or rank= and world_size=")
        rank, world_size = torch.distributed.get_rank(), torch.distributed.get_world_size()
    rank = 0 if rank is None else _whole("rank", rank, 0)
    world_size = 1 if world_size is None else _whole("world_size", world_size, 1)
    if rank >= world_size:
        raise ValueError(f"rank must lie in [0, world_size={world_size}), got {rank}")
    return rank, world_size


def _whole(name: str, value: Any, least: int) -> int:
    """``value`` as an int, or a ValueError naming it: a whole number (not a bool, nor a float such as 1.0) of at
    least ``least``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least:
        raise ValueError(f"{name} must be a whole number of at least {least}, got {value!r}")
    return int(value)


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
    kind = _order_class(order) if not isinstance(order, Order) else type(order)
    return kind is None or not issubclass(kind, ORDERS[OrderOption.SEQUENTIAL])


def _order_class(order: Any) -> type | None:
    """The class an order option or class stands for (every OrderOption through the ORDERS mapping); None for
    an Order instance or anything else."""
    if is_order_class(order):
        return order
    try:
        return ORDERS[OrderOption(order)]
    except (KeyError, ValueError, TypeError):
        return None


def _describe(path: Source) -> str:
    return os.fspath(path) if isinstance(path, (str, os.PathLike)) else f"a dataset of several files ({path!r:.200})"


def _storage_modes(dataset: OpenedDataset) -> dict[str, np.ndarray]:
    """Per field stored in several modes (``Field.modes``: raw or JPEG images), each sample's mode."""
    # copies: the orders read them every epoch, and the memory layer never reads the file's map after opening
    modes = {name: field.modes(dataset.data_table[name]) for name, field in dataset.fields.items()}
    return {name: np.array(found) for name, found in modes.items() if found is not None}


def _sample_lengths(dataset: OpenedDataset) -> dict[str, np.ndarray]:
    """Per field with lengths (ragged arrays, byte strings), each sample's length: copies, as _storage_modes."""
    lengths = {}
    for name, field in dataset.fields.items():
        column = dataset.descriptors[name].payload_column
        sizes = dataset.allocation_table[:, column]["size"] if column >= 0 else None
        found = field.lengths(dataset.data_table[name], sizes)
        if found is not None:
            lengths[name] = np.array(found, dtype=np.int64)
    return lengths


def _sample_pages(dataset: OpenedDataset) -> np.ndarray:
    """Page of each sample's first payload; files without payloads get pseudo-pages of 1024 samples."""
    if dataset.allocation_table.shape[1] == 0 or dataset.num_samples == 0:
        return np.arange(dataset.num_samples, dtype=np.int64) // 1024
    offsets = dataset.allocation_table[:, 0]["offset"].astype(np.int64)
    return (offsets - dataset.heap_offset) // dataset.page_size
