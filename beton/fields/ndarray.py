"""Fixed-shape array fields: numpy arrays and torch tensors, stored as raw bytes in the heap."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from beton.errors import DecodeError, EncodeError, FieldError, FormatError, first_bad_record
from beton.decoders.basic import NDArrayDecoder, TorchTensorDecoder
from beton.fields.base import Encoded, EncodeContext, Field, answers_ffcv_encode
from beton.pipeline.operation import Operation, torch_dtype
from beton.transforms.torch_ops import ToTensor, ViewAs
from beton.dtypes import dtype_from_descr
from beton.limits import ReadLimits

# FFCV's import path ``ffcv.fields.ndarray`` also holds its decoders.
__all__ = ["NDArrayField", "TorchTensorField", "TORCH_DTYPES", "NDArrayDecoder", "TorchTensorDecoder"]

#: torch dtype name -> numpy dtype of the stored bytes. bfloat16 has no numpy twin: its bits are stored as
#: little-endian uint16 and viewed back as bfloat16.
TORCH_DTYPES: dict[str, str] = {
    "bool": "|b1",
    "uint8": "|u1",
    "int8": "|i1",
    "int16": "<i2",
    "int32": "<i4",
    "int64": "<i8",
    "float16": "<f2",
    "bfloat16": "<u2",
    "float32": "<f4",
    "float64": "<f8",
    "complex64": "<c8",
    "complex128": "<c16",
}


def array_dtype(dtype: Any) -> tuple[np.dtype, tuple[int, ...]]:
    """The numpy dtype an array field stores (a list is a structured dtype's stored description), and the
    trailing dimensions a subarray dtype adds to each value's shape.

    A subarray dtype (``"(2,)<i4"``) is no dtype an array can have: numpy turns ``np.zeros(3, "(2,)<i4")``
    into int32 of shape ``(3, 2)``. The field does the same (dtype ``<i4``, the ``(2,)`` appended to its
    shape), so the values numpy makes of that dtype are the values the field stores.
    """
    try:
        resolved = dtype_from_descr(dtype) if isinstance(dtype, list) else np.dtype(dtype)
    except (TypeError, ValueError):
        raise FieldError(f"not a numpy dtype: {dtype!r}") from None
    trailing: tuple[int, ...] = ()
    while resolved.subdtype is not None:  # nested subarrays: the outer dimensions come first, as numpy's
        resolved, dims = resolved.subdtype
        trailing += dims
    if resolved.hasobject:
        raise FieldError(f"dtype {resolved} holds Python objects, which cannot be stored as raw bytes; store "
                         "them with JSONField or BytesField")
    if resolved.itemsize == 0:
        raise FieldError(f"dtype {resolved.str} has no size: give strings and raw bytes a length ('S16', 'U8', "
                         "'V4'), or store values of varying length with BytesField, JSONField or "
                         "RaggedArrayField")
    return resolved, trailing


def _normalise_shape(shape: Sequence[int], field: str = "NDArrayField") -> tuple[int, ...]:
    if isinstance(shape, Sequence) and len(shape) and (shape[0] is None or shape[0] == -1):
        raise FieldError(f"{field} stores one fixed shape per sample; for samples whose first dimension varies "
                         f"(tokens, audio, boxes) use RaggedArrayField(dtype, {tuple(shape)!r}) from beton.fields")
    try:
        dims = tuple(int(dim) for dim in shape)
    except TypeError:
        raise FieldError(f"shape must be a sequence of integers, got {shape!r}") from None
    if any(dim < 0 for dim in dims):
        raise FieldError(f"shape must not have negative dimensions, got {dims}")
    if len(dims) > _MAX_DIMS:
        raise FieldError(f"shape has {len(dims)} dimensions, numpy allows {_MAX_DIMS}")
    return dims


_MAX_DIMS = 32  # numpy's limit on array dimensions


def _check_fixed_size(field: Field, num_bytes: int, limits: ReadLimits) -> None:
    """A fixed-size payload cannot be larger than the file: the loader allocates batches of this size."""
    if limits.max_payload_bytes is not None and num_bytes > limits.max_payload_bytes:
        raise FormatError(f"{field.describe()} needs {num_bytes} bytes per sample, more than the "
                          f"{limits.max_payload_bytes}-byte file holds")


def _check_sizes(num_bytes: int, sizes: np.ndarray | None) -> None:
    if sizes is not None:
        first_bad_record(sizes != num_bytes, lambda s: f"payload has {sizes[s]} bytes, the field's dtype and shape "
                                                       f"need {num_bytes}")


def _as_array(payload: np.ndarray, dtype: np.dtype, shape: tuple[int, ...], num_bytes: int) -> np.ndarray:
    if payload.size != num_bytes:
        raise DecodeError(f"payload has {payload.size} bytes, the field's dtype and shape need {num_bytes}")
    return np.array(payload.view(dtype).reshape(shape))


@dataclasses.dataclass(frozen=True, init=False)
class NDArrayField(Field):
    """A numpy array of one fixed dtype and shape per sample.

    Values must have exactly that dtype and shape: a silent cast (float64 -> float32) or reshape is exactly
    the kind of bug a dataset file should not hide.
    """

    dtype: np.dtype
    shape: tuple[int, ...]

    type_name = "beton.NDArrayField"
    has_payload = True

    def __init__(self, dtype: Any, shape: Sequence[int]) -> None:
        resolved, trailing = array_dtype(dtype)
        object.__setattr__(self, "dtype", resolved)
        object.__setattr__(self, "shape", _normalise_shape(_normalise_shape(shape) + trailing))

    @property
    def num_bytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize  # Python integers: no overflow on stored shapes

    @answers_ffcv_encode
    def encode(self, value: Any, context: EncodeContext) -> Encoded:
        if not isinstance(value, (np.ndarray, np.generic)):
            raise EncodeError(f"expected a numpy array, got {type(value).__name__}")
        value = np.asarray(value)
        # Shapes that differ only in dimensions of size 1 hold the same values in the same order (a scalar for
        # shape (1,), as FFCV's examples write): reshaped, never cast or truncated.
        if value.dtype != self.dtype or _without_ones(value.shape) != _without_ones(self.shape):
            raise EncodeError(
                f"expected an array of dtype {self.dtype.str} and shape {self.shape}, "
                f"got dtype {value.dtype.str} and shape {value.shape}"
            )
        return Encoded(payload=np.ascontiguousarray(value).reshape(self.shape).tobytes())

    def default_pipeline(self) -> list[Operation]:
        """Decoded as torch tensors; as numpy batches for dtypes torch has no equivalent of (long double,
        complex256, datetimes, strings, raw bytes, records): the exact values, never cast to a dtype torch has."""
        try:
            torch_dtype(self.dtype.newbyteorder("="))
        except TypeError:
            return [NDArrayDecoder()]
        return [NDArrayDecoder(), ToTensor()]

    def to_python(self, metadata: np.void, payload: np.ndarray | None) -> np.ndarray:
        return _as_array(payload, self.dtype, self.shape, self.num_bytes)

    def check_records(self, records: np.ndarray, sizes: np.ndarray | None, limits: ReadLimits) -> None:
        _check_fixed_size(self, self.num_bytes, limits)

    def check_payloads(self, records: np.ndarray, sizes: np.ndarray | None) -> None:
        _check_sizes(self.num_bytes, sizes)

    def arguments(self) -> dict[str, Any]:
        return {"dtype": np.lib.format.dtype_to_descr(self.dtype), "shape": list(self.shape)}


@dataclasses.dataclass(frozen=True, init=False)
class TorchTensorField(Field):
    """A torch tensor of one fixed dtype and shape per sample (read back as a CPU tensor)."""

    dtype: str
    shape: tuple[int, ...]

    type_name = "beton.TorchTensorField"
    has_payload = True

    def __init__(self, dtype: Any, shape: Sequence[int]) -> None:
        name = str(dtype).removeprefix("torch.")
        if name not in TORCH_DTYPES:
            raise FieldError(f"unsupported torch dtype {dtype!r}; supported: {', '.join(TORCH_DTYPES)}")
        object.__setattr__(self, "dtype", name)
        object.__setattr__(self, "shape", _normalise_shape(shape, "TorchTensorField"))

    @property
    def storage_dtype(self) -> np.dtype:
        return np.dtype(TORCH_DTYPES[self.dtype])

    @property
    def num_bytes(self) -> int:
        return math.prod(self.shape) * self.storage_dtype.itemsize

    @answers_ffcv_encode
    def encode(self, value: Any, context: EncodeContext) -> Encoded:
        import torch

        if not isinstance(value, torch.Tensor):
            raise EncodeError(f"expected a torch.Tensor, got {type(value).__name__}")
        if value.dtype != getattr(torch, self.dtype) or tuple(value.shape) != self.shape:
            raise EncodeError(
                f"expected a tensor of dtype torch.{self.dtype} and shape {self.shape}, "
                f"got {value.dtype} and shape {tuple(value.shape)}"
            )
        tensor = value.detach().to("cpu")
        if tensor.dtype == torch.bfloat16:  # numpy has no bfloat16: take its bits, same element size
            tensor = tensor.view(torch.int16)
        return Encoded(payload=tensor.resolve_conj().numpy().tobytes())

    def default_pipeline(self) -> list[Operation]:
        return [TorchTensorDecoder(), ToTensor(), ViewAs(self.dtype)]

    def to_python(self, metadata: np.void, payload: np.ndarray | None) -> Any:
        import torch

        array = _as_array(payload, self.storage_dtype, self.shape, self.num_bytes)
        return torch.from_numpy(array).view(getattr(torch, self.dtype))

    def check_records(self, records: np.ndarray, sizes: np.ndarray | None, limits: ReadLimits) -> None:
        _check_fixed_size(self, self.num_bytes, limits)

    def check_payloads(self, records: np.ndarray, sizes: np.ndarray | None) -> None:
        _check_sizes(self.num_bytes, sizes)

    def arguments(self) -> dict[str, Any]:
        return {"dtype": self.dtype, "shape": list(self.shape)}


def _without_ones(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(size for size in shape if size != 1)
