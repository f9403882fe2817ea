"""NormalizeImage: uint8 HxWxC -> (x - mean) / std as float32 or float16, compiled on CPU."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numba
import numpy as np

from beton.pipeline.operation import JitOperation, State

__all__ = ["NormalizeImage"]


@numba.njit(nogil=True, cache=True)
def _normalize_kernel(src, dst, i, sample, key, args):
    scale, shift = args  # per channel: x * scale + shift == (x - mean) / std
    image, out = src[i], dst[i]
    height, width, channels = image.shape
    for y in range(height):
        for x in range(width):
            for c in range(channels):
                out[y, x, c] = image[y, x, c] * scale[c] + shift[c]


@dataclasses.dataclass(frozen=True)
class NormalizeImage(JitOperation):
    """Per-channel normalisation of uint8 images; ``mean`` and ``std`` in pixel units (0..255)."""

    mean: Sequence[float]
    std: Sequence[float]
    dtype: Any = np.float32

    def output_state(self, previous: Any) -> State:
        previous.require(isinstance(previous, State) and previous.kind == "numpy" and len(previous.shape) == 3
                         and previous.shape[2] == len(self.mean) == len(self.std),
                         self, f"numpy HxWx{len(self.mean)} images")
        return dataclasses.replace(previous, dtype=np.dtype(self.dtype))

    def kernel(self) -> Any:
        return _normalize_kernel

    def kernel_arguments(self, previous: Any) -> tuple:
        std = np.asarray(self.std, np.float32)
        return (1.0 / std, -np.asarray(self.mean, np.float32) / std)
