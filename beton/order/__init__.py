"""Sample orders, picked by name from a mapping; each a pure function of (seed, epoch)."""

from __future__ import annotations

import enum

from beton.order.balanced import BalancedOrder
from beton.order.base import Order, OrderContext, shard
from beton.order.bucketed import BucketedOrder
from beton.order.quasi_random import QuasiRandomOrder
from beton.order.random import RandomOrder
from beton.order.sequential import SequentialOrder

__all__ = ["OrderOption", "Order", "OrderContext", "shard", "SequentialOrder", "RandomOrder", "QuasiRandomOrder",
           "BalancedOrder", "BucketedOrder"]


class OrderOption(enum.Enum):
    SEQUENTIAL = "sequential"
    RANDOM = "random"
    QUASI_RANDOM = "quasi_random"
    BALANCED = "balanced"  # a fixed raw/JPEG mix in every batch: see beton.order.balanced
    BUCKETED = "bucketed"  # batches of samples of similar length: see beton.order.bucketed


ORDERS = {
    OrderOption.SEQUENTIAL: SequentialOrder,
    OrderOption.RANDOM: RandomOrder,
    OrderOption.QUASI_RANDOM: QuasiRandomOrder,
    OrderOption.BALANCED: BalancedOrder,
    OrderOption.BUCKETED: BucketedOrder,
}
