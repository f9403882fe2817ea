"""Shared checks for image operations."""

from __future__ import annotations

from typing import Any

import numpy as np

from beton.errors import PipelineError
from beton.pipeline.operation import JitOperation, State


def require_images(operation: Any, previous: Any, dtype: Any = None) -> State:
    """The State of a numpy batch of HxWxC images (of ``dtype`` if given), or a PipelineError naming the operation."""
    if not isinstance(previous, State):
        previous = State((), None, kind="python")  # a decoder's SourceState: describe as not-an-image
    wanted = "" if dtype is None else f" {np.dtype(dtype)}"
    previous.require(previous.kind == "numpy" and len(previous.shape) == 3
                     and (dtype is None or previous.dtype == dtype),
                     operation, f"numpy HxWxC{wanted} images (put it before ToTensor)")
    return previous


def require_uint8_images(operation: Any, previous: Any) -> State:
    return require_images(operation, previous, np.uint8)


def fill_array(fill: Any, channels: int) -> np.ndarray:
    """A per-channel uint8 fill value from a scalar or a sequence of one value per channel."""
    try:
        values = np.broadcast_to(np.asarray(fill, dtype=np.int64), (channels,))
    except ValueError:
        raise PipelineError(f"fill {fill!r} does not match images of {channels} channels") from None
    if (values < 0).any() or (values > 255).any():
        raise PipelineError(f"fill values must lie in 0..255, got {fill!r}")
    return values.astype(np.uint8).copy()


class InPlaceUint8ImageOperation(JitOperation):
    """Base of compiled operations that modify uint8 HxWxC images in place (their kernels write into ``dst``)."""

    def output_state(self, previous: Any) -> State:
        return require_uint8_images(self, previous)

    def in_place(self, previous: State) -> bool:
        return True
