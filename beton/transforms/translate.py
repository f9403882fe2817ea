"""RandomTranslate: shift each image by up to ``padding`` pixels in each direction, filling the gap."""

from __future__ import annotations

import dataclasses
from typing import Any

import numba
import numpy as np

from beton.pipeline.operation import JitOperation, State
from beton.random import integer
from beton.transforms._image import fill_array, require_uint8_images

__all__ = ["RandomTranslate"]


@numba.njit(nogil=True, cache=True)
def _translate_kernel(src, dst, i, sample, key, args):
    padding, fill = args
    image, out = src[i], dst[i]
    height, width, channels = image.shape
    shift_y = integer(key, sample, 0, -padding, padding + 1)
    shift_x = integer(key, sample, 1, -padding, padding + 1)
    # Row by row: the columns that come from the image are one contiguous run, the rest is fill, so no value
    # needs a bounds test of its own (such a test kept the loop from vectorising)
    first, last = min(max(shift_x, 0), width), max(min(width + shift_x, width), 0)  # output columns from the image
    for y in range(height):
        source_y = y - shift_y
        row = out[y].reshape(-1)
        if 0 <= source_y < height:
            _fill_pixels(row, fill, 0, first)
            _copy_values(image[source_y].reshape(-1), (first - shift_x) * channels, row, first * channels,
                         (last - first) * channels)
            _fill_pixels(row, fill, max(last, first), width)
        else:
            _fill_pixels(row, fill, 0, width)


@numba.njit(nogil=True, cache=True)
def _copy_values(source, source_start, target, target_start, count):
    source_start, target_start = np.uint64(source_start), np.uint64(target_start)
    for k in range(np.uint64(max(count, 0))):  # unsigned: vectorised (see beton.transforms.flip)
        target[target_start + k] = source[source_start + k]


@numba.njit(nogil=True, cache=True)
def _fill_pixels(row, fill, start, stop):
    channels = np.uint64(fill.size)
    for x in range(np.uint64(start), np.uint64(max(stop, start))):
        for c in range(channels):
            row[x * channels + c] = fill[c]


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
