"""Cutout and RandomErasing: blank a rectangle of each image, in place."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numba
import numpy as np

from beton.random import integer, uniform
from beton.transforms._image import InPlaceUint8ImageOperation, fill_array

__all__ = ["Cutout", "RandomErasing"]


@numba.njit(nogil=True, cache=True)
def _fill_rectangle(image, top, left, bottom, right, fill):
    for y in range(top, bottom):
        for x in range(left, right):
            for c in range(image.shape[2]):
                image[y, x, c] = fill[c]


@numba.njit(nogil=True, cache=True)
def _cutout_kernel(src, dst, i, sample, key, args):
    size, fill = args
    image = dst[i]
    height, width = image.shape[0], image.shape[1]
    center_y = integer(key, sample, 0, 0, height)
    center_x = integer(key, sample, 1, 0, width)
    top, left = max(0, center_y - size // 2), max(0, center_x - size // 2)
    _fill_rectangle(image, top, left, min(height, center_y - size // 2 + size),
                    min(width, center_x - size // 2 + size), fill)


@dataclasses.dataclass(frozen=True)
class Cutout(InPlaceUint8ImageOperation):
    """Blank a ``crop_size`` square centred on a uniformly random pixel (clipped at the borders)."""

    crop_size: int
    fill: Any = 0

    def kernel(self) -> Any:
        return _cutout_kernel

    def kernel_arguments(self, previous: Any) -> tuple:
        return (np.int64(self.crop_size), fill_array(self.fill, previous.shape[2]))


@numba.njit(nogil=True, cache=True)
def _erasing_kernel(src, dst, i, sample, key, args):
    probability, scale_low, scale_high, log_ratio_low, log_ratio_high, fill = args
    if uniform(key, sample, 0) >= probability:
        return
    image = dst[i]
    height, width = image.shape[0], image.shape[1]
    area = height * width
    for attempt in range(10):  # torchvision's RandomErasing: up to 10 tries, else leave the image alone
        erase_area = area * (scale_low + (scale_high - scale_low) * uniform(key, sample, 1 + 4 * attempt))
        aspect = math.exp(log_ratio_low + (log_ratio_high - log_ratio_low) * uniform(key, sample, 2 + 4 * attempt))
        erase_height = int(round(math.sqrt(erase_area * aspect)))
        erase_width = int(round(math.sqrt(erase_area / aspect)))
        if erase_height < height and erase_width < width:
            top = integer(key, sample, 3 + 4 * attempt, 0, height - erase_height + 1)
            left = integer(key, sample, 4 + 4 * attempt, 0, width - erase_width + 1)
            _fill_rectangle(image, top, left, top + erase_height, left + erase_width, fill)
            return


@dataclasses.dataclass(frozen=True)
class RandomErasing(InPlaceUint8ImageOperation):
    """torchvision's RandomErasing on uint8 HWC images: with probability ``p`` blank a random rectangle of
    area fraction in ``scale`` and aspect ratio (h/w) in ``ratio``, filled with ``fill``."""

    p: float = 0.5
    scale: tuple[float, float] = (0.02, 0.33)
    ratio: tuple[float, float] = (0.3, 3.3)
    fill: Any = 0

    def kernel(self) -> Any:
        return _erasing_kernel

    def kernel_arguments(self, previous: Any) -> tuple:
        return (np.float64(self.p), np.float64(self.scale[0]), np.float64(self.scale[1]),
                np.float64(math.log(self.ratio[0])), np.float64(math.log(self.ratio[1])),
                fill_array(self.fill, previous.shape[2]))
