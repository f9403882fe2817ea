"""BUCKETED: batches of samples of similar length, so padded batches waste little (length bucketing).

Plan, for batch size B and world size W (a *step* is the W batches the ranks train on at the same time):

1. Shuffle the selected samples (a generator keyed by (seed, epoch)), cut them into pools of ``pool_batches``
   steps and sort each pool by length (stable, so equal lengths stay shuffled).
2. Cut the sorted pools into steps of W x B samples and shuffle the steps: every batch holds neighbours in
   length, and the batch order is random. Within a step, rank r gets the r-th B samples: the ranks of a
   distributed job train on batches of similar length at each step, so none waits long for another.
3. Lay the batches out rank by rank, as :func:`~beton.order.base.shard` cuts the order into contiguous parts
   (``OrderContext.world_size`` and ``drop_last`` say where): each rank's part starts with its whole steps'
   batches, then its share of the samples that fill no whole step (sorted by length too).

A larger pool gives batches of closer lengths and less randomness in what shares a batch. Everything is a pure
function of (seed, epoch): resuming and distributed ranks need no communication.
"""

from __future__ import annotations

import numpy as np

from beton.errors import PipelineError
from beton.order.base import Order, OrderContext
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
        per_rank = count // ranks if context.drop_last else -(-count // ranks)  # as shard() cuts
        steps = min(per_rank // batch, count // step)
        whole = walk[: steps * step].reshape(steps, ranks, batch)[rng.permutation(steps)]
        rest = walk[steps * step :]
        rest = rest[np.argsort(lengths[rest], kind="stable")]
        # rank r's part: its batch of every step, then per_rank - steps * batch samples of the rest; when the
        # rest is short (sample counts that do not divide), the last rank's part gives up its final samples,
        # which shard() replaces by padding anyway
        parts = [whole[:, r].reshape(-1) for r in range(ranks)]
        fill = per_rank - steps * batch
        shortfall = (ranks - 1) * fill - len(rest)
        if shortfall > 0:
            kept = max(0, len(parts[-1]) - shortfall)
            rest, parts[-1] = np.concatenate([rest, parts[-1][kept:]]), parts[-1][:kept]
        pieces = []
        for r in range(ranks):
            taken = rest[:fill] if r < ranks - 1 else rest
            pieces += [parts[r], taken]
            rest = rest[len(taken) :]
        return indices[np.concatenate(pieces)] if pieces else indices

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
