"""FFCV's import path ``ffcv.writer``; the writer lives in :mod:`beton.storage.writer`."""

from beton.storage.writer import DatasetWriter

__all__ = ["DatasetWriter"]
