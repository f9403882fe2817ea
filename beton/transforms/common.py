"""FFCV's import path ``ffcv.transforms.common``."""

from beton.transforms.torch_ops import Squeeze

__all__ = ["Squeeze"]
