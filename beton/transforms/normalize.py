"""NormalizeImage: (x - mean) / std per channel, uint8 -> float32 or float16.

On numpy HxWxC images (before ToTensor) it is a compiled operation fused with its neighbours (float32; numba
has no float16, so float16 output is one vectorised numpy expression per batch). On torch tensors (after
ToTensor / ToTorchImage / ToDevice, e.g. on the GPU) it runs as one torch expression per batch, on whatever
device the batch is.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numba
import numpy as np

from beton.pipeline.operation import BatchContext, JitOperation, State, torch_dtype
from beton.user_warnings import warn_at_user_code

__all__ = ["NormalizeImage"]


# Row by row against the per-channel scale and shift laid out along a row: every loop is contiguous with
# unsigned indices, which LLVM vectorises; one loop over all values with a per-value `k % channels` does not.
@numba.njit(nogil=True, cache=True)
def _normalize_kernel(src, dst, i, sample, key, args):
    scale, shift = args  # per channel: x * scale + shift == (x - mean) / std
    image, out = src[i], dst[i]
    height, width, channels = image.shape
    row_length = np.uint64(width * channels)
    row_scale, row_shift = np.empty(row_length, scale.dtype), np.empty(row_length, shift.dtype)
    for j in range(row_length):
        row_scale[j], row_shift[j] = scale[j % np.uint64(channels)], shift[j % np.uint64(channels)]
    rows_in, rows_out = image.reshape(height, -1), out.reshape(height, -1)
    for y in range(height):
        row_in, row_out = rows_in[y], rows_out[y]
        for j in range(row_length):
            row_out[j] = row_in[j] * row_scale[j] + row_shift[j]


@dataclasses.dataclass(frozen=True)
class NormalizeImage(JitOperation):
    """Per-channel normalisation of uint8 images; ``mean`` and ``std`` in pixel units (0..255), as FFCV's.

    torchvision's statistics are on the 0..1 scale: multiply them by 255 (``mean=[0.485 * 255, ...]``). Given
    0..1 statistics for uint8 images, the operation warns: outputs would reach about 1000 instead of about 2.
    ``type``: the output dtype (FFCV's name for it), float16 included.
    """

    mean: Sequence[float]
    std: Sequence[float]
    type: Any = np.float32

    def output_state(self, previous: Any) -> State:
        channels = len(self.mean)
        previous.require(isinstance(previous, State) and previous.kind in ("numpy", "torch")
                         and len(previous.shape) == 3 and channels == len(self.std)
                         and channels in (previous.shape[0], previous.shape[2]),
                         self, f"images with {channels} channels (HxWxC numpy, or torch CxHxW / HxWxC)")
        if str(previous.dtype) in ("uint8", "torch.uint8") and max(map(abs, (*self.mean, *self.std))) <= 1:
            warn_at_user_code(f"NormalizeImage(mean={[float(v) for v in self.mean]}, std="
                              f"{[float(v) for v in self.std]}) looks like statistics on the 0..1 scale, but the "
                              "images are uint8 (0..255): multiply mean and std by 255")
        if previous.kind == "numpy":
            previous.require(previous.shape[2] == channels, self, f"numpy HxWx{channels} images")
            return dataclasses.replace(previous, dtype=np.dtype(self.type))
        # apply() takes a tensor whose first per-sample dimension holds the channels for CxHxW: where the last one
        # does too, HxWxC images of height C would be normalised across their rows, so that is refused
        previous.require(previous.shape[0] != previous.shape[2], self,
                         f"tensors whose channel axis can be told apart (first or last, not both {channels}): put "
                         "it before ToTensor, on numpy HxWxC images, or after ToTorchImage")
        return dataclasses.replace(previous, dtype=torch_dtype(self.type))

    def stage_kind(self, previous: Any) -> str | None:
        torch_input = isinstance(previous, State) and previous.kind == "torch"
        return "batch" if torch_input or np.dtype(self.type) == np.float16 else None

    def kernel(self) -> Any:
        return _normalize_kernel

    def kernel_arguments(self, previous: Any) -> tuple:
        work = np.promote_types(self.type, np.float32)  # float64 output is computed in float64, not float32
        std = np.asarray(self.std, work)
        return (1.0 / std, -np.asarray(self.mean, work) / std)

    def apply(self, batch: Any, context: BatchContext) -> Any:
        if isinstance(batch, np.ndarray):
            scale, shift = self.kernel_arguments(None)
            return (batch * scale + shift).astype(self.type)
        import torch

        dtype = torch_dtype(self.type)
        # in float32 at least, rounded to a narrower dtype once at the end (as the numpy path): in float16 itself
        # the rounded mean cancels, leaving values near 0 up to 138 float16 steps off
        work = torch.promote_types(dtype, torch.float32)
        channels_first = batch.shape[1] == len(self.mean)
        shape = (1, -1, 1, 1) if channels_first else (1, 1, 1, -1)
        mean = torch.tensor(self.mean, dtype=work, device=batch.device).view(shape)
        std = torch.tensor(self.std, dtype=work, device=batch.device).view(shape)
        return ((batch.to(work) - mean) / std).to(dtype)
