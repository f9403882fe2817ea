"""BUCKETED: batches of samples of similar length, so padded batches waste little (length bucketing).

Plan, for batch size B and world size W (a *step* is the W batches the ranks train on at the same time):

1. Shuffle the selected samples (a generator keyed by (seed, epoch)), cut them into pools of ``pool_batches``
   steps and sort each pool by length (stable, so equal lengths stay shuffled).
2. Cut the sorted pools into steps of W x B samples and shuffle the steps: every batch holds neighbours in
   length, and the batch order is random. Within a step, rank r gets the r-th B samples: the ranks of a
   distributed job train on batches of similar length at each step, so none waits long for another.
3. Lay the batches out rank by rank, as :func:`~beton.order.base.shard` cuts the order into contiguous parts
   (``OrderContext.world_size`` and ``drop_last`` say where): each rank's part starts with its whole steps'
   batches, then its share of the samples that fill no whole step (sorted by length too, so each batch cut from
   them holds neighbours in length).

Uneven counts (a sample count that ``world_size x batch_size`` does not divide). Every rank gets the same
number of samples and batches, by the rule every order follows (:func:`~beton.order.base.shard`): with
``drop_last`` the last ``count % world_size`` samples of the order (the longest of the rest) are dropped and
every rank's final partial batch too; without it the last ranks' parts are padded with fewer than
``world_size`` repeated samples, and every sample comes at least once. There are only as many whole steps as
the rank with the fewest real samples fills, and :meth:`BucketedOrder.pad` repeats samples *of the batch
being padded* (a batch of padding only repeats its rank's batch before it) instead of the order's first
samples, so padding never puts a sample of another length into a batch. Using every sample exactly once and
giving every rank the same number of batches cannot both hold in general (10 samples on 4 ranks in batches
of 2: two ranks would get 2 samples, one batch, unless 2 samples are repeated), hence the padding.

A larger pool gives batches of closer lengths and less randomness in what shares a batch. Everything is a pure
function of (seed, epoch): resuming and distributed ranks need no communication.
"""

from __future__ import annotations

import numpy as np

from beton.errors import PipelineError
from beton.order.base import Order, OrderContext, shard_sizes
from beton.random import order_rng

__all__ = ["BucketedOrder"]


class BucketedOrder(Order):
    """Length bucketing over the lengths of ``field`` (default: the file's only field with lengths: a
    RaggedArrayField or a BytesField); ``pool_batches`` steps are sorted together (see the module docstring)."""

    def __init__(self, field: str | None = None, pool_batches: int = 64) -> None:
        if isinstance(pool_batches, bool) or not isinstance(pool_batches, int) or pool_batches < 1:
            raise ValueError(f"pool_batches must be a positive integer, got {pool_batches!r}")
        self.field, self.pool_batches = field, pool_batches

    def permutation(self, indices: np.ndarray, seed: int, epoch: int, context: OrderContext) -> np.ndarray:
        indices = np.asarray(indices, dtype=np.int64)
        lengths = self._lengths(context)[indices]
        count, batch, ranks = len(indices), context.batch_size, max(1, context.world_size)
        step = batch * ranks
        rng = order_rng(seed, epoch)
        walk = rng.permutation(count)
        pool = step * self.pool_batches
        for start in range(0, count, pool):  # sort each pool by length, keeping the shuffled order among equals
            chunk = walk[start : start + pool]
            walk[start : start + pool] = chunk[np.argsort(lengths[chunk], kind="stable")]
        # as many whole steps as the rank with the fewest real samples fills (shard() pads the last ranks)
        _, reals = shard_sizes(count, ranks, context.drop_last)
        steps = min(reals) // batch
        whole = walk[: steps * step].reshape(steps, ranks, batch)[rng.permutation(steps)]
        rest = walk[steps * step :]
        rest = rest[np.argsort(lengths[rest], kind="stable")]
        # rank r's part: its batch of every step, then the next reals[r] - steps * batch samples of the sorted
        # rest; with drop_last, what no rank takes ends the order, where shard() drops it
        pieces, taken = [], 0
        for r in range(ranks):
            extra = reals[r] - steps * batch
            pieces += [whole[:, r].reshape(-1), rest[taken : taken + extra]]
            taken += extra
        pieces.append(rest[taken:])
        return indices[np.concatenate(pieces)]

    def pad(self, order: np.ndarray, total: int, context: OrderContext) -> np.ndarray:
        """Padding that keeps every batch one bucket: a padded batch repeats its own samples, a batch of padding
        only repeats its rank's batch before it (or, on a rank without any sample, rank 0's batch)."""
        count, batch = len(order), context.batch_size
        if not count or total <= count:
            return order
        per_rank = total // max(1, context.world_size)
        padded = np.empty(total, order.dtype)
        padded[:count] = order
        for position in range(count, total):
            rank_start = position - position % per_rank
            batch_start = rank_start + (position - rank_start) // batch * batch
            if batch_start < count:
                padded[position] = padded[batch_start + (position - batch_start) % (count - batch_start)]
            elif batch_start > rank_start:
                padded[position] = padded[position - batch]
            else:
                padded[position] = padded[position - rank_start]
        return padded

    def _lengths(self, context: OrderContext) -> np.ndarray:
        available = context.lengths
        if self.field is not None:
            if self.field not in available:
                raise PipelineError(f"BUCKETED order: field {self.field!r} has no lengths; fields with lengths: "
                                    f"{sorted(available)}")
            return available[self.field]
        if len(available) != 1:
            raise PipelineError("BUCKETED order groups samples by the length of a RaggedArrayField or BytesField; "
                                + ("this file has none" if not available else
                                   f"name one with BucketedOrder(field=...) (order_kwargs={{'field': ...}}): "
                                   f"{sorted(available)}"))
        return next(iter(available.values()))
