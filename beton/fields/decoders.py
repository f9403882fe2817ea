"""Decoders: the first operation of a loader pipeline, reading one stored field into a batch.

Scalar and array decoders are compiled (numba) and fuse with the operations after them; bytes and JSON
decoders give Python objects of their exact stored length.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numba
import numpy as np

from beton.errors import DecodeError, PipelineError
from beton.fields.bytes import BytesField, JSONField, decode_json
from beton.fields.ndarray import NDArrayField, TorchTensorField
from beton.fields.scalar import FloatField, IntField
from beton.pipeline.memcopy import copy_bytes
from beton.pipeline.operation import BatchContext, BatchOperation, JitOperation, Source, SourceState, State

__all__ = ["IntDecoder", "FloatDecoder", "NDArrayDecoder", "TorchTensorDecoder", "BytesDecoder", "JSONDecoder",
           "SimpleRGBImageDecoder", "RandomResizedCropRGBImageDecoder", "CenterCropRGBImageDecoder"]


def _require_field(operation: Any, previous: Any, *field_types: type) -> SourceState:
    if not isinstance(previous, SourceState):
        raise PipelineError(f"{operation!r} must be the first operation of a pipeline, not after {previous.describe()}")
    if not isinstance(previous.field, field_types):
        names = " or ".join(t.__name__ for t in field_types)
        raise PipelineError(f"{operation!r} decodes {names}, but field {previous.field_name!r} is "
                            f"{previous.field.describe()}")
    return previous


@numba.njit(nogil=True, cache=True)
def _scalar_kernel(src, dst, i, sample, key, args):
    dst[i] = src[0][sample]["value"]


@numba.njit(nogil=True, cache=True)
def _copy_payload_kernel(src, dst, i, sample, key, args):
    copy_bytes(dst[i], src[1], src[2][i], src[3][i])  # memory, offsets, sizes; a DecodeError when they do not fit


@dataclasses.dataclass(frozen=True)
class IntDecoder(JitOperation):
    """IntField -> int64 per sample."""

    is_decoder = True

    def output_state(self, previous: Any) -> State:
        _require_field(self, previous, IntField)
        return State((), np.dtype(np.int64))

    def kernel(self) -> Any:
        return _scalar_kernel


@dataclasses.dataclass(frozen=True)
class FloatDecoder(JitOperation):
    """FloatField -> float64 per sample."""

    is_decoder = True

    def output_state(self, previous: Any) -> State:
        _require_field(self, previous, FloatField)
        return State((), np.dtype(np.float64))

    def kernel(self) -> Any:
        return _scalar_kernel


@dataclasses.dataclass(frozen=True)
class NDArrayDecoder(JitOperation):
    """NDArrayField -> the stored dtype and shape per sample (a copy of the payload bytes)."""

    is_decoder = True

    def output_state(self, previous: Any) -> State:
        field = _require_field(self, previous, NDArrayField).field
        return State(field.shape, field.dtype)

    def kernel(self) -> Any:
        return _copy_payload_kernel


@dataclasses.dataclass(frozen=True)
class TorchTensorDecoder(JitOperation):
    """TorchTensorField -> numpy array of the storage dtype (bfloat16 as uint16 bits); ToTensor restores it."""

    is_decoder = True

    def output_state(self, previous: Any) -> State:
        field = _require_field(self, previous, TorchTensorField).field
        return State(field.shape, field.storage_dtype)

    def kernel(self) -> Any:
        return _copy_payload_kernel


@dataclasses.dataclass(frozen=True)
class BytesDecoder(BatchOperation):
    """BytesField -> a list of ``bytes`` per batch, each of its exact stored length."""

    is_decoder = True

    def output_state(self, previous: Any) -> State:
        _require_field(self, previous, BytesField)
        return State((), object, kind="python")

    def apply(self, batch: Source, context: BatchContext) -> list[bytes]:
        return [batch.memory[o : o + s].tobytes() for o, s in zip(batch.offsets.tolist(), batch.sizes.tolist())]


@dataclasses.dataclass(frozen=True)
class JSONDecoder(BatchOperation):
    """JSONField -> a list of decoded JSON values per batch."""

    is_decoder = True

    def output_state(self, previous: Any) -> State:
        _require_field(self, previous, JSONField)
        return State((), object, kind="python")

    def apply(self, batch: Source, context: BatchContext) -> list[Any]:
        values = []
        for i, (o, s) in enumerate(zip(batch.offsets.tolist(), batch.sizes.tolist())):
            try:
                values.append(decode_json(batch.memory[o : o + s].tobytes()))
            except DecodeError as error:
                error.sample = int(context.samples[i])
                raise
        return values


# Image decoders live in their own module; re-exported here so that every decoder has one import path.
from beton.fields.rgb_image_decoders import (  # noqa: E402
    CenterCropRGBImageDecoder,
    RandomResizedCropRGBImageDecoder,
    SimpleRGBImageDecoder,
)
