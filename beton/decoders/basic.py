"""Decoders: the first operation of a loader pipeline, reading one stored field into a batch.

Scalar and array decoders are compiled (numba) and fuse with the operations after them, and so does
``BytesDecoder`` (FFCV's padded rows, or a Padded batch); ``BytesDecoder(exact=True)`` and ``JSONDecoder`` give
Python objects of their exact stored length.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import numba
import numpy as np
from numba.core.errors import NumbaError
from numba.np.numpy_support import from_dtype as numba_type_of_dtype

from beton import bounded_json
from beton.decoders.field_check import is_field, require_field
from beton.decoders.ragged import WINDOWS, check_max_length, check_window, fill_padded, pad_row, window_start
from beton.errors import DecodeError, PipelineError, error_context
from beton.pipeline.memcopy import copy_bytes
from beton.pipeline.operation import BatchContext, BatchOperation, JitOperation, Source, State

__all__ = ["BasicDecoder", "IntDecoder", "FloatDecoder", "NDArrayDecoder", "TorchTensorDecoder", "BytesDecoder",
           "JSONDecoder"]


@numba.njit(nogil=True, cache=True)
def _scalar_kernel(src, dst, i, sample, key, args):
    dst[i] = src[0][sample]["value"]


@numba.njit(nogil=True, cache=True)
def _copy_payload_kernel(src, dst, i, sample, key, args):
    # dst[i : i + 1], not dst[i]: for a 0-d field (shape ()) dst[i] is a number, not memory to copy into.
    copy_bytes(dst[i : i + 1], src[1], src[2][i], src[3][i])  # memory, offsets, sizes; DecodeError if they do not fit


@dataclasses.dataclass(frozen=True)
class BasicDecoder(JitOperation):
    """The decoders of one number per sample (FFCV's ``BasicDecoder``, the base of its int and float decoders):
    each sample's stored value, as the subclass's dtype. A subclass names the field it reads and that dtype."""

    is_decoder = True
    field_class: ClassVar[str] = ""  # the stored field's class path, for the check in output_state
    dtype: ClassVar[np.dtype] = np.dtype(np.int64)

    def output_state(self, previous: Any) -> State:
        if not self.field_class:
            raise TypeError(f"{type(self).__name__} is abstract: use IntDecoder or FloatDecoder")
        require_field(self, previous, self.field_class)
        return State((), self.dtype)

    def kernel(self) -> Any:
        return _scalar_kernel


@dataclasses.dataclass(frozen=True)
class IntDecoder(BasicDecoder):
    """IntField -> int64 per sample."""

    field_class: ClassVar[str] = "beton.fields.scalar.IntField"
    dtype: ClassVar[np.dtype] = np.dtype(np.int64)


@dataclasses.dataclass(frozen=True)
class FloatDecoder(BasicDecoder):
    """FloatField -> float64 per sample."""

    field_class: ClassVar[str] = "beton.fields.scalar.FloatField"
    dtype: ClassVar[np.dtype] = np.dtype(np.float64)


@dataclasses.dataclass(frozen=True)
class NDArrayDecoder(JitOperation):
    """NDArrayField -> the stored dtype and shape per sample (a copy of the payload bytes).

    Also reads a TorchTensorField as FFCV's does (its tensors as numpy arrays of the same dtype), except
    bfloat16, which numpy has no dtype for: ``TorchTensorDecoder`` (its default pipeline) reads that.

    dtypes numba cannot compile (float16, long double, complex256, datetimes, strings, raw bytes, records,
    big-endian numbers) are decoded by numpy, sample by sample, instead of in a compiled stage: the same values,
    without fusion with the operations after it (ToTensor turns big-endian numbers into native ones and takes
    float16; torch has no dtype for the rest).
    """

    is_decoder = True

    def output_state(self, previous: Any) -> State:
        field = require_field(self, previous, _NDARRAY_FIELD, _TORCH_TENSOR_FIELD).field
        return State(field.shape, _stored_dtype(self, field))

    def stage_kind(self, previous: Any) -> str | None:
        return None if _compiles(_stored_dtype(self, previous.field)) else "sample"

    def kernel(self) -> Any:
        return _copy_payload_kernel

    def apply(self, src: Source, dst: np.ndarray, i: int, sample: int, context: BatchContext) -> None:
        _copy_by_numpy(src, dst, i)


_NDARRAY_FIELD = "beton.fields.ndarray.NDArrayField"
_TORCH_TENSOR_FIELD = "beton.fields.ndarray.TorchTensorField"


def _stored_dtype(decoder: NDArrayDecoder, field: Any) -> np.dtype:
    """The numpy dtype NDArrayDecoder gives for ``field``: an array field's own, a tensor field's twin."""
    if not is_field(field, _TORCH_TENSOR_FIELD):
        return field.dtype
    if field.dtype == "bfloat16":
        raise PipelineError(f"{decoder!r}: numpy has no bfloat16 to read {field.describe()} as; decode it with "
                            "TorchTensorDecoder() (its default pipeline: TorchTensorDecoder(), ToTensor(), "
                            "ViewAs('bfloat16'))")
    return field.storage_dtype


def _copy_by_numpy(src: Source, dst: np.ndarray, i: int) -> None:
    """One sample of a dtype numba cannot compile: the stored bytes viewed as the stored dtype."""
    offset, size = int(src.offsets[i]), int(src.sizes[i])
    row = dst[i : i + 1]  # not dst[i]: for a 0-d field that is a scalar, whose nbytes a string's length sets
    if size != row.nbytes or offset < 0 or offset + size > src.memory.size:
        raise DecodeError(f"payload of {size} bytes at {offset} does not hold the field's {row.nbytes} "
                          f"bytes inside the readable memory")
    row[...] = src.memory[offset : offset + size].view(dst.dtype).reshape(row.shape)


def _compiles(dtype: np.dtype) -> bool:
    """Whether numba compiles arrays of this dtype: native-order booleans, integers, floats and complex numbers
    that numba has a type for (not float16, nor long double / complex256, which numba refuses to type)."""
    if not (dtype.isnative and dtype.kind in "biufc") or dtype == np.dtype(np.float16):
        return False
    try:
        numba_type_of_dtype(dtype)
    except NumbaError:  # numba's answer for dtypes it has no type of (float128, complex256)
        return False
    return True


@dataclasses.dataclass(frozen=True)
class TorchTensorDecoder(JitOperation):
    """TorchTensorField -> numpy array of the storage dtype (bfloat16 as uint16 bits); ToTensor restores it."""

    is_decoder = True

    def output_state(self, previous: Any) -> State:
        field = require_field(self, previous, "beton.fields.ndarray.TorchTensorField").field
        return State(field.shape, field.storage_dtype)

    def stage_kind(self, previous: Any) -> str | None:
        return None if _compiles(previous.field.storage_dtype) else "sample"  # float16: numba has none

    def kernel(self) -> Any:
        return _copy_payload_kernel

    def apply(self, src: Source, dst: np.ndarray, i: int, sample: int, context: BatchContext) -> None:
        _copy_by_numpy(src, dst, i)


@numba.njit(nogil=True, cache=True)
def _padded_bytes_kernel(src, dst, i, sample, key, args):
    capacity, pad, window = args
    length = np.int64(src[3][i])  # a byte string's length is its payload's size
    take = min(length, capacity)
    start = window_start(key, sample, length, take, window)
    fill_padded(dst[0][i], src[1], np.int64(src[2][i]), length, length, start, take, 1, pad, pad[0] == 0)
    dst[1][i] = take


@numba.njit(nogil=True, cache=True)
def _rows_of_bytes_kernel(src, dst, i, sample, key, args):
    size = np.int64(src[3][i])
    row = dst[i]
    if size > row.size:
        raise DecodeError("a payload is longer than the file's longest, which sized the rows")
    copy_bytes(row[:size], src[1], np.int64(src[2][i]), size)
    row[size:] = 0


#: The classes BytesDecoder reads: JSON documents are UTF-8 bytes too (FFCV decodes JSONField with it).
_BYTES_FIELDS = ("beton.fields.bytes.BytesField", "beton.fields.bytes.JSONField")


@dataclasses.dataclass(frozen=True)
class BytesDecoder(BatchOperation):
    """BytesField (or JSONField: its UTF-8 text) -> each sample's bytes, in one of three forms:

    * ``BytesDecoder()``, FFCV's: a uint8 batch ``(batch, longest)``, ``longest`` the file's longest payload,
      each row the sample's bytes and then zeros (lengths are not kept: trailing zero bytes of a payload look
      like padding). On a JSONField each row holds one more byte, so every document ends with a NUL as FFCV
      stores it: :meth:`beton.fields.JSONField.unpack` parses the batch. Compiled; ``ToTensor`` makes it a
      tensor.
    * ``BytesDecoder(max_length=n)``: a Padded uint8 batch for torch, ``(batch, n)`` bytes and ``(batch,)``
      lengths, compiled. Longer byte strings keep ``n`` bytes (``window`` "start", "center" or "random", as
      :class:`~beton.decoders.RaggedDecoder`) and shorter ones are padded with ``pad_value`` (0..255).
    * ``BytesDecoder(exact=True)``: a list of ``bytes`` per batch, each of its exact stored length (a
      BytesField's default pipeline).
    """

    max_length: int | None = None
    pad_value: int = 0
    window: str = "start"
    exact: bool = False

    is_decoder = True

    def __post_init__(self) -> None:
        if self.max_length is not None:
            check_max_length(self, self.max_length)
            if self.exact:
                raise PipelineError(f"{self!r}: exact=True gives each byte string whole, max_length cuts them: "
                                    "choose one")
        check_window(self, self.window)

    def stage_kind(self, previous: Any) -> str | None:
        return None if self.exact else "jit"

    def output_state(self, previous: Any) -> State:
        source = require_field(self, previous, *_BYTES_FIELDS)
        if self.exact:
            return State((), object, kind="python")
        if self.max_length is None:
            if source.lengths is None:
                raise PipelineError(f"{self!r} sizes its rows by the file's longest payload, but the plan was "
                                    f"built without the lengths of field {source.field_name!r}")
            longest = int(source.lengths.max()) if source.lengths.size else 0
            terminator = is_field(source.field, "beton.fields.bytes.JSONField")  # FFCV stores a NUL after each
            return State((longest + terminator,), np.dtype(np.uint8))
        pad_row(self.pad_value, np.dtype(np.uint8), (), self)
        return State((self.max_length,), np.dtype(np.uint8), layout="padded")

    def kernel(self) -> Any:
        return _rows_of_bytes_kernel if self.max_length is None else _padded_bytes_kernel

    def kernel_arguments(self, previous: Any) -> tuple:
        if self.max_length is None:
            return ()
        return np.int64(self.max_length), pad_row(self.pad_value, np.dtype(np.uint8), (), self), \
            np.int64(WINDOWS[self.window])

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
                values.append(bounded_json.decode_payload(batch.memory[o : o + s].tobytes()))
        return values

