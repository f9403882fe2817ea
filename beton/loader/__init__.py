"""The Loader and the per-epoch iterator behind it."""

from beton.loader.loader import Loader

__all__ = ["Loader"]
