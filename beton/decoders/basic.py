"""Decoders: the first operation of a loader pipeline, reading one stored field into a batch.

Scalar and array decoders are compiled (numba) and fuse with the operations after them; bytes and JSON
decoders give Python objects of their exact stored length.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numba
import numpy as np

from beton import _json
from beton.decoders.field_check import require_field
from beton.errors import error_context
from beton.pipeline.memcopy import copy_bytes
from beton.pipeline.operation import BatchContext, BatchOperation, JitOperation, Source, State

__all__ = ["IntDecoder", "FloatDecoder", "NDArrayDecoder", "TorchTensorDecoder", "BytesDecoder", "JSONDecoder"]


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
        require_field(self, previous, "beton.fields.scalar.IntField")
        return State((), np.dtype(np.int64))

    def kernel(self) -> Any:
        return _scalar_kernel


@dataclasses.dataclass(frozen=True)
class FloatDecoder(JitOperation):
    """FloatField -> float64 per sample."""

    is_decoder = True

    def output_state(self, previous: Any) -> State:
        require_field(self, previous, "beton.fields.scalar.FloatField")
        return State((), np.dtype(np.float64))

    def kernel(self) -> Any:
        return _scalar_kernel


@dataclasses.dataclass(frozen=True)
class NDArrayDecoder(JitOperation):
    """NDArrayField -> the stored dtype and shape per sample (a copy of the payload bytes)."""

    is_decoder = True

    def output_state(self, previous: Any) -> State:
        field = require_field(self, previous, "beton.fields.ndarray.NDArrayField").field
        return State(field.shape, field.dtype)

    def kernel(self) -> Any:
        return _copy_payload_kernel


@dataclasses.dataclass(frozen=True)
class TorchTensorDecoder(JitOperation):
    """TorchTensorField -> numpy array of the storage dtype (bfloat16 as uint16 bits); ToTensor restores it."""

    is_decoder = True

    def output_state(self, previous: Any) -> State:
        field = require_field(self, previous, "beton.fields.ndarray.TorchTensorField").field
        return State(field.shape, field.storage_dtype)

    def kernel(self) -> Any:
        return _copy_payload_kernel


@dataclasses.dataclass(frozen=True)
class BytesDecoder(BatchOperation):
    """BytesField -> a list of ``bytes`` per batch, each of its exact stored length."""

    is_decoder = True

    def output_state(self, previous: Any) -> State:
        require_field(self, previous, "beton.fields.bytes.BytesField")
        return State((), object, kind="python")

    def apply(self, batch: Source, context: BatchContext) -> list[bytes]:
        return [batch.memory[o : o + s].tobytes() for o, s in zip(batch.offsets.tolist(), batch.sizes.tolist())]


@dataclasses.dataclass(frozen=True)
class JSONDecoder(BatchOperation):
    """JSONField -> a list of decoded JSON values per batch."""

    is_decoder = True

    def output_state(self, previous: Any) -> State:
        require_field(self, previous, "beton.fields.bytes.JSONField")
        return State((), object, kind="python")

    def apply(self, batch: Source, context: BatchContext) -> list[Any]:
        values = []
        for i, (o, s) in enumerate(zip(batch.offsets.tolist(), batch.sizes.tolist())):
            with error_context(sample=int(context.samples[i])):
                values.append(_json.decode_payload(batch.memory[o : o + s].tobytes()))
        return values

