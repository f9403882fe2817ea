"""QUASI_RANDOM: a page-aware shuffle, so each batch reads a bounded set of pages.

The pages holding the selected samples are shuffled and cut into consecutive windows of ``window_pages``
pages; the samples of each window are shuffled together; windows follow each other. A batch therefore draws
from at most two consecutive windows (at most ``2 * window_pages`` pages) when a window holds at least a
batch of samples, and each page is needed by one contiguous run of batches: a process cache holding two
windows reads every page once per epoch.

Default window: the number of distinct pages a uniformly random batch would touch (expected value), so a
quasi-random batch mixes about as many pages as a uniform one while reading each page once per epoch.
Everything is a pure function of (seed, epoch): deterministic, and identical on every rank.
"""

from __future__ import annotations

import math

import numpy as np

from beton.order.base import Order, OrderContext
from beton.random import order_rng

__all__ = ["QuasiRandomOrder", "page_window_walk", "expected_uniform_pages"]


class QuasiRandomOrder(Order):
    def __init__(self, window_pages: int | None = None) -> None:
        if window_pages is not None and window_pages < 1:
            raise ValueError(f"window_pages must be at least 1, got {window_pages}")
        self.window_pages = window_pages

    def permutation(self, indices: np.ndarray, seed: int, epoch: int, context: OrderContext) -> np.ndarray:
        indices = np.asarray(indices, dtype=np.int64)
        if len(indices) == 0:
            return indices
        rng = order_rng(seed, epoch)
        return indices[page_window_walk(context.sample_pages[indices], rng, self.window_pages, context.batch_size)]


def page_window_walk(pages: np.ndarray, rng: np.random.Generator, window_pages: int | None,
                     batch_size: int) -> np.ndarray:
    """Positions into ``pages`` (each sample's page) in page-window order (see the module docstring).

    Draws from ``rng`` in a fixed order (the page ranking, then one tie-breaker per sample), so an order that
    goes on drawing from the same generator stays a pure function of (seed, epoch).
    """
    unique_pages, page_of_sample = np.unique(pages, return_inverse=True)
    page_rank = rng.permutation(len(unique_pages))
    window = window_pages or expected_uniform_pages(pages, batch_size)
    window_of_sample = page_rank[page_of_sample] // window
    tie_breaker = rng.random(len(pages))
    return np.lexsort((tie_breaker, window_of_sample))


def expected_uniform_pages(pages: np.ndarray, batch_size: int) -> int:
    """Expected number of distinct pages among ``batch_size`` samples drawn uniformly from ``pages``."""
    _, counts = np.unique(pages, return_counts=True)
    total = counts.sum()
    expected = float(np.sum(1.0 - (1.0 - counts / total) ** min(batch_size, total)))
    return max(1, math.ceil(expected))
