"""FFCV's import path ``ffcv.traversal_order.base``: its custom-order base (:mod:`beton.ffcv.traversal_order`)."""

from beton.ffcv.traversal_order import TraversalOrder

__all__ = ["TraversalOrder"]
