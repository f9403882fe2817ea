"""SEQUENTIAL: the selected indices in the order given (for validation and evaluation)."""

from __future__ import annotations

import numpy as np

from beton.order.base import Order, OrderContext


class SequentialOrder(Order):
    def permutation(self, indices: np.ndarray, seed: int, epoch: int, context: OrderContext) -> np.ndarray:
        return np.asarray(indices, dtype=np.int64)
