"""Poison (FFCV's ``ffcv.transforms.Poison``): blend a fixed mask into chosen samples, e.g. for data-poisoning
and backdoor experiments."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numba
import numpy as np

from beton.pipeline.operation import JitOperation, State
from beton.transforms._image import require_uint8_images
from beton.transforms._selection import chosen_indices, is_chosen

__all__ = ["Poison"]


@numba.njit(nogil=True, cache=True)
def _poison_kernel(src, dst, i, sample, key, args):
    chosen, mask, alpha, low, high = args  # mask and alpha: float32 per pixel
    if is_chosen(chosen, sample):
        image, out = src[i], dst[i]
        for y in range(image.shape[0]):
            for x in range(image.shape[1]):
                for c in range(image.shape[2]):
                    blended = (1 - alpha[y, x, c]) * image[y, x, c] + alpha[y, x, c] * mask[y, x, c]
                    out[y, x, c] = min(high, max(low, blended))


@dataclasses.dataclass(frozen=True, eq=False)
class Poison(JitOperation):
    """Samples whose dataset index is in ``indices`` become ``(1 - alpha) * image + alpha * mask``, clamped to
    ``clamp`` and truncated to uint8; the others pass unchanged. ``mask`` has the images' HxWxC shape or one
    numpy broadcasts to it (HxWx1, a colour of C values, a number), or is a grayscale HxW mask, the same for every
    channel (where W equals C, an HxW mask is grayscale, not per-channel); ``alpha`` is a number or an array taken
    likewise: FFCV's is an HxW opacity per pixel, the same for every channel."""

    mask: np.ndarray
    alpha: float | np.ndarray
    indices: Sequence[int]
    clamp: tuple[float, float] = (0, 255)

    def output_state(self, previous: Any) -> State:
        state = require_uint8_images(self, previous)
        shape = tuple(state.shape)
        state.require(_fits(np.shape(self.mask), shape) and _fits(np.shape(self.alpha), shape), self,
                      f"images the mask {np.shape(self.mask)} and alpha {np.shape(self.alpha)} broadcast to")
        return state

    def in_place(self, previous: State) -> bool:
        return True

    def kernel(self) -> Any:
        return _poison_kernel

    def __repr__(self) -> str:
        alpha = self.alpha if np.ndim(self.alpha) == 0 else f"array{np.shape(self.alpha)}"
        return (f"Poison(mask=array{np.shape(self.mask)}, alpha={alpha}, indices=<{len(self.indices)} samples>, "
                f"clamp={self.clamp})")

    def kernel_arguments(self, previous: Any) -> tuple:
        shape = tuple(previous.shape)
        mask = np.ascontiguousarray(_per_pixel(np.asarray(self.mask, np.float32), shape))
        alpha = np.ascontiguousarray(_per_pixel(np.asarray(self.alpha, np.float32), shape))
        return (chosen_indices(self.indices), mask, alpha,
                np.float32(self.clamp[0]), np.float32(self.clamp[1]))


def _per_pixel(values: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """``values`` for every pixel and channel of an HxWxC image: a grayscale HxW array is given a channel axis,
    anything else broadcasts as numpy does."""
    if values.ndim == 2 and values.shape == shape[:2]:
        values = values[:, :, None]
    return np.broadcast_to(values, shape)


def _fits(values_shape: tuple[int, ...], shape: tuple[int, ...]) -> bool:
    try:
        _per_pixel(np.empty(values_shape, np.float32), shape)
    except ValueError:
        return False
    return True
