"""The Loader and the per-epoch iterator behind it."""

from beton.loader.loader import Loader
from beton.loader.torch_data import BatchDataset
from beton.order import OrderOption

__all__ = ["Loader", "OrderOption", "BatchDataset"]
