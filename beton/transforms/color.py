"""Photometric augmentations on uint8 HxWxC images, compiled and in place.

Each applies with probability ``p`` and draws its factor uniformly from [max(0, 1 - magnitude), 1 + magnitude]
(FFCV's and torchvision's convention). Results are rounded half up and clipped to 0..255. Grey levels use
ITU-R 601 luma weights (0.299, 0.587, 0.114), as torchvision does.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numba
import numpy as np

from beton.random import uniform
from beton.transforms._image import InPlaceUint8ImageOperation

__all__ = ["RandomBrightness", "RandomContrast", "RandomSaturation", "RandomSolarization", "Solarization"]


@numba.njit(nogil=True, cache=True, inline="always")
def _to_uint8(value):
    return min(255, max(0, int(value + 0.5)))


# The kernels walk each image as one flat run of values with unsigned indices: numba checks signed indices
# for wrap-around, which keeps LLVM from vectorising (see beton.transforms.flip).
_ONE, _TWO = np.uint64(1), np.uint64(2)


@numba.njit(nogil=True, cache=True, inline="always")
def _luma(values, start, channels):
    """Grey level of the pixel whose first value is ``values[start]`` (its only value when grey)."""
    if channels < 3:
        return float(values[start])
    return 0.299 * values[start] + 0.587 * values[start + _ONE] + 0.114 * values[start + _TWO]


@numba.njit(nogil=True, cache=True)
def _draw_factor(key, sample, probability, magnitude):
    """The factor to apply, or -1.0 when this sample is left alone."""
    if uniform(key, sample, 0) >= probability:
        return -1.0
    low = max(0.0, 1.0 - magnitude)
    return low + (1.0 + magnitude - low) * uniform(key, sample, 1)


@numba.njit(nogil=True, cache=True)
def _blend(values, factor, grey):
    """Every value to factor * value + (1 - factor) * grey, rounded half up and clipped."""
    offset = (1.0 - factor) * grey
    for k in range(np.uint64(values.size)):
        values[k] = _to_uint8(factor * values[k] + offset)


@numba.njit(nogil=True, cache=True)
def _brightness_kernel(src, dst, i, sample, key, args):
    probability, magnitude = args
    factor = _draw_factor(key, sample, probability, magnitude)
    if factor < 0:
        return
    _blend(dst[i].reshape(-1), factor, 0.0)


@numba.njit(nogil=True, cache=True)
def _contrast_kernel(src, dst, i, sample, key, args):
    probability, magnitude = args
    factor = _draw_factor(key, sample, probability, magnitude)
    if factor < 0:
        return
    height, width, channels = dst[i].shape
    values = dst[i].reshape(-1)
    step, total = np.uint64(channels), 0.0
    for pixel in range(np.uint64(height * width)):
        total += _luma(values, pixel * step, channels)
    _blend(values, factor, total / (height * width))


@numba.njit(nogil=True, cache=True)
def _saturation_kernel(src, dst, i, sample, key, args):
    probability, magnitude = args
    factor = _draw_factor(key, sample, probability, magnitude)
    if factor < 0:
        return
    height, width, channels = dst[i].shape
    values = dst[i].reshape(-1)
    step = np.uint64(channels)
    for pixel in range(np.uint64(height * width)):
        start = pixel * step
        offset = (1.0 - factor) * _luma(values, start, channels)
        for c in range(step):
            values[start + c] = _to_uint8(factor * values[start + c] + offset)


@numba.njit(nogil=True, cache=True)
def _solarization_kernel(src, dst, i, sample, key, args):
    probability, threshold = args
    if uniform(key, sample, 0) >= probability:
        return
    values = dst[i].reshape(-1)
    for k in range(np.uint64(values.size)):  # unsigned: no wrap-around check, so it vectorises
        value = values[k]
        values[k] = 255 - value if value >= threshold else value


@dataclasses.dataclass(frozen=True)
class _RandomFactor(InPlaceUint8ImageOperation):
    """Shared fields of the factor-drawing operations; subclasses name their kernel."""

    magnitude: float
    p: float = 0.5

    def kernel_arguments(self, previous: Any) -> tuple:
        return (np.float64(self.p), np.float64(self.magnitude))


@dataclasses.dataclass(frozen=True)
class RandomBrightness(_RandomFactor):
    """Scale pixel values by the factor."""

    def kernel(self) -> Any:
        return _brightness_kernel


@dataclasses.dataclass(frozen=True)
class RandomContrast(_RandomFactor):
    """Blend each image with its mean grey level."""

    def kernel(self) -> Any:
        return _contrast_kernel


@dataclasses.dataclass(frozen=True)
class RandomSaturation(_RandomFactor):
    """Blend each pixel with its own grey level."""

    def kernel(self) -> Any:
        return _saturation_kernel


@dataclasses.dataclass(frozen=True)
class RandomSolarization(InPlaceUint8ImageOperation):
    """Invert every value at or above ``threshold``, with probability ``solarization_prob``."""

    solarization_prob: float = 0.5
    threshold: int = 128

    def kernel(self) -> Any:
        return _solarization_kernel

    def kernel_arguments(self, previous: Any) -> tuple:
        return (np.float64(self.solarization_prob), np.int64(self.threshold))


#: Another name for the same operation.
Solarization = RandomSolarization
