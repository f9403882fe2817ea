"""Random flips of HxWxC images, compiled, one draw per sample."""

from __future__ import annotations

import dataclasses
from typing import Any

import numba
import numpy as np

from beton.pipeline.operation import JitOperation, State
from beton.pipeline.random import uniform
from beton.transforms._image import require_images

__all__ = ["RandomHorizontalFlip", "RandomVerticalFlip"]


# Both flips work in place (dst is src): an image that is not flipped costs nothing, and explicit loops
# avoid the temporary copy numba's negative-stride slice assignment makes.


@numba.njit(nogil=True, cache=True)
def _horizontal_flip_kernel(src, dst, i, sample, key, args):
    (probability,) = args
    if uniform(key, sample, 0) >= probability:
        return
    image = dst[i]
    height, width, channels = image.shape
    for y in range(height):
        for x in range(width // 2):
            mirror = width - 1 - x
            for c in range(channels):
                image[y, x, c], image[y, mirror, c] = image[y, mirror, c], image[y, x, c]


@numba.njit(nogil=True, cache=True)
def _vertical_flip_kernel(src, dst, i, sample, key, args):
    (probability,) = args
    if uniform(key, sample, 0) >= probability:
        return
    image = dst[i]
    height, width, channels = image.shape
    for y in range(height // 2):
        mirror = height - 1 - y
        for x in range(width):
            for c in range(channels):
                image[y, x, c], image[mirror, x, c] = image[mirror, x, c], image[y, x, c]


@dataclasses.dataclass(frozen=True)
class _RandomFlip(JitOperation):
    flip_prob: float = 0.5

    def output_state(self, previous: Any) -> State:
        return require_images(self, previous)  # any dtype: flips only move values

    def in_place(self, previous: State) -> bool:
        return True

    def kernel_arguments(self, previous: Any) -> tuple:
        return (np.float64(self.flip_prob),)


@dataclasses.dataclass(frozen=True)
class RandomHorizontalFlip(_RandomFlip):
    """Mirror left-right with probability ``flip_prob``."""

    def kernel(self) -> Any:
        return _horizontal_flip_kernel


@dataclasses.dataclass(frozen=True)
class RandomVerticalFlip(_RandomFlip):
    """Mirror top-bottom with probability ``flip_prob``."""

    def kernel(self) -> Any:
        return _vertical_flip_kernel
