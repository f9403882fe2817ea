"""FFCV's import path ``ffcv.reader``; the reader lives in :mod:`beton.storage.reader`."""

from beton.storage.reader import Reader

__all__ = ["Reader"]
