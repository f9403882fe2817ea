"""Sample orders, picked by name from a mapping; each a pure function of (seed, epoch)."""

from __future__ import annotations

import enum

from beton.order.base import Order, OrderContext, shard
from beton.order.quasi_random import QuasiRandomOrder
from beton.order.random import RandomOrder
from beton.order.sequential import SequentialOrder

__all__ = ["OrderOption", "Order", "OrderContext", "shard", "SequentialOrder", "RandomOrder", "QuasiRandomOrder"]


class OrderOption(enum.Enum):
    SEQUENTIAL = "sequential"
    RANDOM = "random"
    QUASI_RANDOM = "quasi_random"


ORDERS = {
    OrderOption.SEQUENTIAL: SequentialOrder,
    OrderOption.RANDOM: RandomOrder,
    OrderOption.QUASI_RANDOM: QuasiRandomOrder,
}
