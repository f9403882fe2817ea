"""FFCV's custom-order contract (``ffcv.traversal_order.base.TraversalOrder``), run as a beton order.

FFCV's import paths are faces: :mod:`beton.traversal_order` and :mod:`beton.traversal_order.base`.

FFCV's contract: ``Loader(order=MyOrder)`` with ``class MyOrder(TraversalOrder)`` whose ``__init__(loader)``
may read ``loader.indices``, ``loader.seed``, ``loader.distributed`` and ``loader.drop_last``, and whose
``sample_order(epoch)`` returns the epoch's order of dataset indices. In beton that order is the *global* one:
the Loader shards it by rank afterwards (every rank must return the same order, as with any beton order), and
checks that it holds only selected indices.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from beton.errors import PipelineError
from beton.order.base import Order, OrderContext
from beton.order.contracts import OrderContract

__all__ = ["TraversalOrder", "TraversalOrderAdapter", "CONTRACT"]


class TraversalOrder(abc.ABC):
    """FFCV's base class of custom orders; see the module docstring."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader
        self.indices = np.array(loader.indices)  # its own: FFCV's orders may shuffle it in place
        self.seed = loader.seed
        self.distributed = loader.world_size > 1
        self.drop_last = loader.drop_last

    @abc.abstractmethod
    def sample_order(self, epoch: int) -> Sequence[int]:
        """The dataset indices of the epoch, in order."""


class TraversalOrderAdapter(Order):
    """A :class:`TraversalOrder` instance as a beton :class:`~beton.order.Order`."""

    reads_loader = True
    permutes = False  # FFCV's sample_order may repeat samples or leave some out

    def __init__(self, traversal: TraversalOrder) -> None:
        self.traversal = traversal

    def permutation(self, indices: np.ndarray, seed: int, epoch: int, context: OrderContext) -> np.ndarray:
        given = np.asarray(self.traversal.sample_order(epoch))
        if given.size and not np.issubdtype(given.dtype, np.integer):  # as FFCV, which indexes with it, refuses
            raise PipelineError(f"{type(self.traversal).__name__}.sample_order({epoch}) must return whole sample "
                                f"numbers, got an array of {given.dtype}")
        order = given.astype(np.int64, copy=False).reshape(-1)
        if not np.isin(order, indices).all():
            raise PipelineError(f"{type(self.traversal).__name__}.sample_order({epoch}) returned indices outside the "
                                "Loader's selected samples")
        return order


def _build(cls: type[TraversalOrder], loader: Any, kwargs: Mapping[str, Any]) -> Order:
    return TraversalOrderAdapter(cls(loader, **kwargs))  # FFCV's contract: built with the loader


#: FFCV's order contract, as the Loader's order resolution adapts it (registered by :mod:`beton.ffcv`).
CONTRACT = OrderContract("ffcv", lambda cls: issubclass(cls, TraversalOrder), _build)
