"""FFCV's import path ``ffcv.transforms.module``."""

from beton.transforms.torch_ops import ModuleWrapper

__all__ = ["ModuleWrapper"]
