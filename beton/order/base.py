"""The Order extension point and the sharding policy shared by every order.

An order is a pure function of (seed, epoch) over the selected sample indices: the same arguments always give
the same permutation, so resuming needs only (seed, epoch, position) and every rank of a distributed job
computes the same global permutation without communicating. :func:`shard` then gives each rank its part.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Mapping

import numpy as np

__all__ = ["Order", "OrderContext", "shard"]


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

    @abc.abstractmethod
    def permutation(self, indices: np.ndarray, seed: int, epoch: int, context: OrderContext) -> np.ndarray:
        """The global order of ``indices`` (int64) for this epoch, before sharding."""


def shard(order: np.ndarray, rank: int, world_size: int, drop_last: bool) -> np.ndarray:
    """Rank ``rank``'s contiguous part of the global order; every rank gets the same number of samples.

    With ``drop_last`` the last ``len(order) % world_size`` samples of the global order are dropped; otherwise
    the order is padded by repeating its first samples, as torch's DistributedSampler does. Contiguous parts
    (not every world_size-th sample) keep the page locality of QUASI_RANDOM within each rank.
    """
    if world_size == 1:
        return order
    if drop_last:
        per_rank = len(order) // world_size
    else:
        per_rank = -(-len(order) // world_size)
        if len(order) and per_rank * world_size > len(order):
            repeats = -(-per_rank * world_size // len(order))
            order = np.tile(order, repeats)[: per_rank * world_size]
    return order[rank * per_rank : (rank + 1) * per_rank]
