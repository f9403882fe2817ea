"""FFCV's import path ``ffcv.transforms.replace_label``."""

from beton.transforms.labels import ReplaceLabel

__all__ = ["ReplaceLabel"]
