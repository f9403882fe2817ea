"""Random flips of HxWxC images, compiled, one draw per sample."""

from __future__ import annotations

import dataclasses
from typing import Any

import numba
import numpy as np

from beton.decoders.image_crops import flips
from beton.pipeline.memcopy import copy_array
from beton.pipeline.operation import JitOperation, State
from beton.transforms._image import require_images

__all__ = ["RandomHorizontalFlip", "RandomVerticalFlip"]


# Both flips work in place (dst is src): an image that is not flipped costs nothing. Each row goes through a
# spare row, with unsigned indices: numba checks signed indices for wrap-around (a negative index counts from
# the end), which kept LLVM from vectorising the reversed loop (docs/images.md, "Transforms", has the timings).
_ONE, _TWO, _THREE = np.uint64(1), np.uint64(2), np.uint64(3)


@numba.njit(nogil=True, cache=True)
def _mirror_row(source, target, width, channels):
    """target's pixels = source's in reverse order (flat rows of ``width`` pixels of ``channels`` values)."""
    last = np.uint64(width) - _ONE
    if channels == 1:
        for x in range(np.uint64(width)):
            target[x] = source[last - x]
    elif channels == 3:  # the usual case, spelled out so the group of three vectorises
        for x in range(np.uint64(width)):
            to, fro = x * _THREE, (last - x) * _THREE
            target[to] = source[fro]
            target[to + _ONE] = source[fro + _ONE]
            target[to + _TWO] = source[fro + _TWO]
    else:
        step = np.uint64(channels)
        for x in range(np.uint64(width)):
            to, fro = x * step, (last - x) * step
            for c in range(step):
                target[to + c] = source[fro + c]


@numba.njit(nogil=True, cache=True)
def _horizontal_flip_kernel(src, dst, i, sample, key, args):
    (probability,) = args
    if not flips(key, sample, probability):  # the draw boxes that follow this flip repeat
        return
    height, width, channels = dst[i].shape
    rows = dst[i].reshape(height, width * channels)
    spare = np.empty(width * channels, rows.dtype)
    for y in range(height):
        copy_array(rows[y], spare)
        _mirror_row(spare, rows[y], width, channels)


@numba.njit(nogil=True, cache=True)
def _vertical_flip_kernel(src, dst, i, sample, key, args):
    (probability,) = args
    if not flips(key, sample, probability):  # the draw boxes that follow this flip repeat
        return
    height, width, channels = dst[i].shape
    rows = dst[i].reshape(height, width * channels)
    spare = np.empty(width * channels, rows.dtype)
    for y in range(height // 2):
        mirror = height - 1 - y
        copy_array(rows[y], spare)
        copy_array(rows[mirror], rows[y])
        copy_array(spare, rows[mirror])


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
