"""The Loader, its option objects, and the per-epoch iterator behind it."""

from beton.loader.loader import Loader
from beton.loader.options import CompileOptions
from beton.loader.torch_data import BatchDataset
from beton.memory import OSCache, ProcessCache
from beton.order import OrderOption

__all__ = ["Loader", "OrderOption", "BatchDataset", "CompileOptions", "OSCache", "ProcessCache"]
