"""What is left of an epoch that stopped mid-way, so that it can go on under another world size or batch size.

A plan cuts an epoch's global order as :func:`~beton.order.base.shard` does: rank ``r`` of ``W`` takes the
``r``-th contiguous part of ``P`` samples, batched by ``B``; the parts' real samples are the order itself, and
padding (repeats, without ``drop_last``) follows them at the end of the last ranks' parts; with ``drop_last``
each rank's final partial batch is not delivered. The ranks of a job move in step, so a job that stopped after
``position`` batches has delivered, on every rank, the first ``position * B`` samples of its part. What is left
(:func:`remainder`) is every real sample the plan had yet to deliver, each once, rank by rank in the plan's order
(so each rank's page locality survives): the global order of the rest of the epoch, which the Loader then
shards again under the new world size and batch size, padding or dropping by its own ``drop_last``.

Everything here is a function of the order's length and the :class:`Interruption`: no sample is read.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from beton.order.base import rank_size

__all__ = ["Interruption", "remainder", "consumed_and_left"]


@dataclasses.dataclass(frozen=True)
class Interruption:
    """A plan of an epoch and how far it went: every rank had received ``position`` batches of ``batch_size``
    samples, the order cut into ``world_size`` parts (padded, or cut with ``drop_last``)."""

    world_size: int
    batch_size: int
    drop_last: bool
    position: int


def _delivered_spans(count: int, cut: Interruption) -> list[tuple[int, int, int]]:
    """Per rank holding any of the order: where its real delivered samples lie in it, ``[start, end)``, and how many
    it received (the ranks after them hold none)."""
    per_rank = rank_size(count, cut.world_size, cut.drop_last)
    delivered = per_rank // cut.batch_size * cut.batch_size if cut.drop_last else per_rank
    spans = []
    # ranks past the order's end received nothing real: a state's world size bounds no loop (states are untrusted)
    for rank in range(min(cut.world_size, -(-count // per_rank) if per_rank else 0)):
        start = rank * per_rank
        end = max(start, min(start + delivered, count))
        spans.append((start, end, min(cut.position * cut.batch_size, end - start)))
    return spans


def consumed_and_left(count: int, cut: Interruption) -> tuple[int, int]:
    """Of an order of ``count`` samples under ``cut``: the real samples the ranks received, and the real ones
    they had yet to receive (padding and what ``drop_last`` drops count in neither)."""
    spans = _delivered_spans(count, cut)
    received = sum(taken for _, _, taken in spans)
    return received, sum(end - start for start, end, _ in spans) - received


def remainder(order: np.ndarray, cut: Interruption) -> np.ndarray:
    """The samples of ``order`` the ranks had yet to receive under ``cut``, each once, rank by rank."""
    spans = _delivered_spans(len(order), cut)
    return np.concatenate([order[start + taken : end] for start, end, taken in spans]
                          + [np.empty(0, np.asarray(order).dtype)])
