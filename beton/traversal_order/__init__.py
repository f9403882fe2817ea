"""FFCV's import path ``ffcv.traversal_order``: sample orders under FFCV's names, and its custom-order base.

``Loader(order=Random)`` (a class, as FFCV takes it) works like ``order=OrderOption.RANDOM``. A subclass of
:class:`TraversalOrder` written to FFCV's contract runs too; see :mod:`beton.ffcv.traversal_order`.
"""

from beton.ffcv.traversal_order import TraversalOrder
from beton.order.quasi_random import QuasiRandomOrder as QuasiRandom
from beton.order.random import RandomOrder as Random
from beton.order.sequential import SequentialOrder as Sequential

__all__ = ["TraversalOrder", "Random", "Sequential", "QuasiRandom"]
