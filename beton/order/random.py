"""RANDOM: a uniform permutation per epoch, from a generator keyed by (seed, epoch)."""

from __future__ import annotations

import numpy as np

from beton.order.base import Order, OrderContext
from beton.random import order_rng


class RandomOrder(Order):
    def permutation(self, indices: np.ndarray, seed: int, epoch: int, context: OrderContext) -> np.ndarray:
        return order_rng(seed, epoch).permutation(np.asarray(indices, dtype=np.int64))
