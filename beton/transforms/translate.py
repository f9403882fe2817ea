"""RandomTranslate: shift each image by up to ``padding`` pixels in each direction, filling the gap."""

from __future__ import annotations

import dataclasses
from typing import Any

import numba
import numpy as np

from beton.pipeline.operation import JitOperation, State
from beton.pipeline.random import integer
from beton.transforms._image import fill_array, require_uint8_images

__all__ = ["RandomTranslate"]


@numba.njit(nogil=True, cache=True)
def _translate_kernel(src, dst, i, sample, key, args):
    padding, fill = args
    image, out = src[i], dst[i]
    height, width, channels = image.shape
    shift_y = integer(key, sample, 0, -padding, padding + 1)
    shift_x = integer(key, sample, 1, -padding, padding + 1)
    for y in range(height):
        source_y = y - shift_y
        for x in range(width):
            source_x = x - shift_x
            inside = 0 <= source_y < height and 0 <= source_x < width
            for c in range(channels):
                out[y, x, c] = image[source_y, source_x, c] if inside else fill[c]


@dataclasses.dataclass(frozen=True)
class RandomTranslate(JitOperation):
    """Pad by ``padding`` with ``fill`` and take a random same-size window (FFCV's RandomTranslate)."""

    padding: int
    fill: Any = 0

    def output_state(self, previous: Any) -> State:
        return require_uint8_images(self, previous)

    def kernel(self) -> Any:
        return _translate_kernel

    def kernel_arguments(self, previous: Any) -> tuple:
        return (np.int64(self.padding), fill_array(self.fill, previous.shape[2]))
