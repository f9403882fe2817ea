"""The Order extension point and the sharding policy shared by every order.

An order is a pure function of (seed, epoch) over the selected sample indices: the same arguments always give
the same permutation, so resuming needs only (seed, epoch, position) and every rank of a distributed job
computes the same global permutation without communicating. :func:`shard` then gives each rank its part,
padded (:meth:`Order.pad`) or cut (``drop_last``) so that every rank gets as many samples, hence batches.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import numpy as np

from beton.errors import LoaderError

__all__ = ["Order", "OrderContext", "checked_permutation", "shard", "rank_size", "shard_sizes", "repeat_first"]


@dataclasses.dataclass(frozen=True)
class OrderContext:
    """What an order may know about the file and the job: each sample's heap page, stored image modes and
    lengths, the batch size, and how :func:`shard` will split the order (world size, drop_last)."""

    sample_pages: np.ndarray  # int64, page of each sample's first payload (see Loader)
    batch_size: int
    #: per image field, each sample's stored mode (beton.fields.rgb_image.IMAGE_MODES: 0 raw, 1 JPEG, ...)
    image_modes: Mapping[str, np.ndarray] = dataclasses.field(default_factory=dict)
    #: per field that has lengths (Field.lengths: rows of ragged arrays, bytes of byte strings), int64 per sample
    lengths: Mapping[str, np.ndarray] = dataclasses.field(default_factory=dict)
    world_size: int = 1
    drop_last: bool = False


class Order(abc.ABC):
    """Base class of sample orders. Subclass and pass an instance as ``Loader(order=...)``.

    :meth:`permutation` must return every one of ``indices`` exactly once, and depend only on its arguments.
    """

    #: True for an order built from the Loader (FFCV's ``TraversalOrder`` reads its seed when built): the Loader
    #: builds it again when its seed changes.
    reads_loader: ClassVar[bool] = False
    #: True when :meth:`permutation` returns every one of ``indices`` exactly once, as the Loader checks each
    #: epoch (:func:`checked_permutation`). FFCV's ``TraversalOrder`` may repeat or leave out samples: its adapter
    #: says False, and the Loader then checks only that each index names a sample of the file.
    permutes: ClassVar[bool] = True

    @abc.abstractmethod
    def permutation(self, indices: np.ndarray, seed: int, epoch: int, context: OrderContext) -> np.ndarray:
        """The global order of ``indices`` (int64) for this epoch, before sharding."""

    def pad(self, order: np.ndarray, total: int, context: OrderContext) -> np.ndarray:
        """The global order lengthened to ``total`` samples, so that :func:`shard` gives every rank as many (a
        sample count the world size does not divide, without ``drop_last``); the samples added land at the end
        of the last ranks' parts. By default the order's first samples again, as torch's DistributedSampler
        pads; an order whose batches must stay alike (BUCKETED) repeats samples of the batch being padded."""
        return repeat_first(order, total)


def checked_permutation(order: Order, result: Any, indices: np.ndarray, num_samples: int, epoch: int) -> np.ndarray:
    """``result``, what ``order.permutation(indices, ..., epoch, ...)`` returned, as int64, once it is an order the
    Loader may follow: whole numbers naming samples of the file (of ``num_samples``), and, for an order that
    :attr:`~Order.permutes`, each of ``indices`` exactly once. Compiled decoders index the file's tables with
    these numbers unchecked, so a number past them would read other memory: wrong values, or a crash; a sample
    repeated or left out would change the epoch silently (and what a resume counts as delivered)."""
    name = f"{type(order).__name__}.permutation(epoch={epoch})"
    given = np.asarray(result)
    if given.ndim != 1 or (given.size and not np.issubdtype(given.dtype, np.integer)):
        raise LoaderError(f"{name} must return a 1-D array of whole sample numbers, got an array of {given.dtype} "
                          f"and shape {given.shape}")
    permutation = np.asarray(given, dtype=np.int64)
    if len(permutation) and (permutation.min() < 0 or permutation.max() >= num_samples):
        bad = permutation[(permutation < 0) | (permutation >= num_samples)][0]
        raise LoaderError(f"{name} returned sample {bad}, outside the file's samples [0, {num_samples})")
    if order.permutes:
        _check_each_once(name, permutation, indices, num_samples)
    return permutation


def _check_each_once(name: str, permutation: np.ndarray, indices: np.ndarray, num_samples: int) -> None:
    once = "it must return every one of the selected samples exactly once"
    if len(permutation) != len(indices):
        raise LoaderError(f"{name} returned {len(permutation)} samples; {once} ({len(indices)})")
    # Where every sample is selected once (the Loader without indices=), a byte per sample marked by a scatter
    # shows it, at a fraction of the cost of sorting both every epoch.
    if len(indices) == num_samples:
        selected = np.zeros(num_samples, bool)
        selected[indices] = True
        if selected.all():
            returned = np.zeros(num_samples, bool)
            returned[permutation] = True
            if not returned.all():
                raise LoaderError(f"{name} left out sample {int(np.argmin(returned))} (and so returned another more "
                                  f"than once); {once}")
            return
    returned, selected = np.sort(permutation), np.sort(indices)
    differ = np.flatnonzero(returned != selected)
    if len(differ):
        sample = min(returned[differ[0]], selected[differ[0]])
        raise LoaderError(f"{name} returned sample {sample} {np.count_nonzero(permutation == sample)} time(s), "
                          f"selected {np.count_nonzero(indices == sample)} time(s); {once}")


def repeat_first(order: np.ndarray, total: int) -> np.ndarray:
    """``order`` followed by its first samples again (cyclically) up to ``total`` samples."""
    if not len(order) or total <= len(order):
        return order
    return np.tile(order, -(-total // len(order)))[:total]


def rank_size(count: int, world_size: int, drop_last: bool) -> int:
    """The samples each rank gets of a global order of ``count`` (see :func:`shard`)."""
    return count // world_size if drop_last else -(-count // world_size)


def shard_sizes(count: int, world_size: int, drop_last: bool) -> tuple[int, list[int]]:
    """How :func:`shard` cuts a global order of ``count`` samples: the samples per rank, and how many of each
    rank's are real samples of the order (the rest is padding; with ``drop_last`` all are, and the last
    ``count % world_size`` samples of the order are dropped)."""
    per_rank = rank_size(count, world_size, drop_last)
    return per_rank, [min(per_rank, max(0, count - rank * per_rank)) for rank in range(world_size)]


def shard(order: np.ndarray, rank: int, world_size: int, drop_last: bool,
          pad: Callable[[np.ndarray, int], np.ndarray] = repeat_first) -> np.ndarray:
    """Rank ``rank``'s contiguous part of the global order; every rank gets the same number of samples.

    With ``drop_last`` the last ``len(order) % world_size`` samples of the global order are dropped; otherwise
    the order is padded to a multiple of ``world_size`` by ``pad(order, total)`` (the Loader passes its order's
    :meth:`Order.pad`; by default the first samples again, as torch's DistributedSampler does). Contiguous
    parts (not every world_size-th sample) keep the page locality of QUASI_RANDOM within each rank.
    """
    if world_size == 1:
        return order
    per_rank = rank_size(len(order), world_size, drop_last)
    if len(order) and per_rank * world_size > len(order):
        padded = np.asarray(pad(order, per_rank * world_size))
        if len(padded) != per_rank * world_size:
            raise LoaderError(f"the order's padding (Order.pad) gave {len(padded)} samples; {world_size} ranks of "
                              f"{per_rank} need {per_rank * world_size}")
        # what Order.pad promises, checked because the samples are read unchecked (checked_permutation says why)
        if not np.array_equal(padded[: len(order)], order) or not np.isin(padded[len(order) :], order).all():
            raise LoaderError("the order's padding (Order.pad) must return the order followed by samples of it "
                              "again")
        order = padded
    return order[rank * per_rank : (rank + 1) * per_rank]
