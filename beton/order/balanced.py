"""BALANCED: every batch holds the same number of raw images (Liquid, Baek et al., APSys 2023).

A file that mixes raw images (cheap to decode, many bytes) and JPEGs (few bytes, costly to decode) keeps both
the CPU and the storage busy only if every batch has the mix the file was tuned for (see :mod:`beton.tools.tune`);
FFCV's ``proportion`` mode mixes at random, so some batches are decode-bound and others read-bound.

Plan: with R raw among N selected samples and batch size B, every full batch gets k = round(R * B / N) raw
samples and the last, partial batch the rest, when the rest is within one of that batch's share (it is for
files written by ``beton tune`` for this batch size); otherwise the raw samples are spread so that every
batch's count is within one of its share R * size / N (cumulative rounding).

Which samples: the raw and the JPEG samples are each shuffled page-aware, as QUASI_RANDOM does, with one
page ranking for both, so the two streams walk the pages together and a process cache reads each page about
once per epoch. A pure function of (seed, epoch), like every order.

Sharding: ranks get contiguous parts of this order, so a rank's batches keep the composition when each
rank's part is a whole number of batches (``drop_last=True`` and N divisible by world_size * B).
"""

from __future__ import annotations

import numpy as np

from beton.errors import PipelineError
from beton.order.base import Order, OrderContext
from beton.order.quasi_random import page_window_walk
from beton.random import order_rng

__all__ = ["BalancedOrder", "batch_composition"]

RAW_MODE = 0


class BalancedOrder(Order):
    def __init__(self, field: str | None = None, window_pages: int | None = None) -> None:
        if window_pages is not None and window_pages < 1:
            raise ValueError(f"window_pages must be at least 1, got {window_pages}")
        self.field, self.window_pages = field, window_pages

    def permutation(self, indices: np.ndarray, seed: int, epoch: int, context: OrderContext) -> np.ndarray:
        indices = np.asarray(indices, dtype=np.int64)
        if len(indices) == 0:
            return indices
        is_raw = self._modes(context)[indices] == RAW_MODE
        rng = order_rng(seed, epoch)
        walk = page_window_walk(context.sample_pages[indices], rng, self.window_pages, context.batch_size)
        raw_walk, jpeg_walk = indices[walk[is_raw[walk]]], indices[walk[~is_raw[walk]]]
        order = np.empty_like(indices)
        raw_used = jpeg_used = 0
        start = 0
        for raw_count, size in batch_composition(len(raw_walk), len(indices), context.batch_size):
            batch = np.concatenate([raw_walk[raw_used : raw_used + raw_count],
                                    jpeg_walk[jpeg_used : jpeg_used + size - raw_count]])
            order[start : start + size] = batch[rng.permutation(size)]
            raw_used, jpeg_used, start = raw_used + raw_count, jpeg_used + size - raw_count, start + size
        return order

    def _modes(self, context: OrderContext) -> np.ndarray:
        modes = context.image_modes
        if self.field is not None:
            if self.field not in modes:
                raise PipelineError(f"BALANCED order: {self.field!r} is not an image field; image fields: "
                                    f"{sorted(modes)}")
            return modes[self.field]
        if not modes:
            raise PipelineError("BALANCED order balances the raw and JPEG images of an RGBImageField; this file "
                                "has no image field")
        mixed = [name for name, values in modes.items() if len(np.unique(values)) > 1]
        if len(mixed) != 1:
            candidates = mixed or sorted(modes)
            if len(candidates) != 1:
                raise PipelineError("BALANCED order: name the image field to balance with "
                                    f"BalancedOrder(field=...); candidates: {candidates}")
            return modes[candidates[0]]
        return modes[mixed[0]]


def batch_composition(raw: int, total: int, batch_size: int) -> list[tuple[int, int]]:
    """(raw samples, batch size) of every batch; see the module docstring for the plan."""
    if total == 0:
        return []
    sizes = [batch_size] * (total // batch_size) + ([total % batch_size] if total % batch_size else [])
    full = total // batch_size
    per_batch = round(raw * batch_size / total)
    rest = raw - per_batch * full
    last = sizes[full] if len(sizes) > full else 0
    if (last or rest == 0) and 0 <= rest <= last and abs(rest - raw * last / total) < 1:
        return [(per_batch, batch_size)] * full + ([(rest, last)] if last else [])
    ends = np.cumsum(sizes)
    targets = np.rint(raw * ends / total).astype(np.int64)
    counts = np.diff(np.concatenate([[0], targets]))
    return list(zip(counts.tolist(), sizes))
