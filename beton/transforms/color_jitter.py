"""FFCV's import path ``ffcv.transforms.color_jitter``."""

from beton.transforms.color import RandomBrightness, RandomContrast, RandomSaturation

__all__ = ["RandomBrightness", "RandomContrast", "RandomSaturation"]
