"""FFCV's import path ``ffcv.traversal_order``: sample orders under FFCV's names, and its custom-order base.

``Loader(order=Random)`` (a class, as FFCV takes it) works like ``order=OrderOption.RANDOM``. A subclass of
:class:`TraversalOrder` written to FFCV's contract runs too; see :mod:`beton.traversal_order.base`.
"""

from beton.order.quasi_random import QuasiRandomOrder as QuasiRandom
from beton.order.random import RandomOrder as Random
from beton.order.sequential import SequentialOrder as Sequential
from beton.traversal_order.base import TraversalOrder

__all__ = ["TraversalOrder", "Random", "Sequential", "QuasiRandom"]
