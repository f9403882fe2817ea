"""Arrays whose first dimension varies per sample: token sequences, audio clips, boxes, frames of features.

``RaggedArrayField(np.int32, (None,))`` stores token sequences, ``(None, 4)`` boxes, ``(None, 80)`` frames of
80 features. Each sample's length (its number of rows) is stored in the data table, so orders, statistics and
``beton info`` see every length without reading a payload; the payload is the rows' raw bytes, C order.

Reading back: :class:`beton.Reader` gives each sample as an array of its own length. In a Loader, a decoder
bounds what a batch holds (``batch_size x max_length`` rows, never the longest sample of the file):
:class:`beton.decoders.RaggedDecoder` pads or crops each sample to ``max_length`` rows and returns a
:class:`beton.pipeline.ragged.Padded` batch (values and lengths); see docs/ragged.md for packing and boxes.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from beton.errors import DecodeError, EncodeError, FieldError, FormatError, PipelineError, first_bad_record
from beton.fields.base import Encoded, EncodeContext, Field
from beton.fields.ndarray import array_dtype
from beton.limits import ReadLimits
from beton.pipeline.operation import Operation

__all__ = ["RaggedArrayField"]

_RECORD = np.dtype([("length", "<i8")])
_MAX_DIMS = 32  # numpy's limit on array dimensions


def _row_shape(shape: Sequence[Any]) -> tuple[int, ...]:
    """The fixed dimensions after the varying first one, from ``(None, ...)`` (or ``(-1, ...)``)."""
    try:
        dims = list(shape)
    except TypeError:
        raise FieldError(f"shape must be a sequence like (None,) or (None, 4), got {shape!r}") from None
    if not dims or not (dims[0] is None or (isinstance(dims[0], (int, np.integer)) and dims[0] == -1)):
        raise FieldError(f"RaggedArrayField's shape starts with None, the varying length: (None,) for sequences, "
                         f"(None, 4) for boxes; got {shape!r} (a fixed shape is NDArrayField's)")
    if len(dims) > _MAX_DIMS:
        raise FieldError(f"shape has {len(dims)} dimensions, numpy allows {_MAX_DIMS}")
    row = []
    for dim in dims[1:]:
        if dim is None or not isinstance(dim, (int, np.integer)) or isinstance(dim, bool) or dim < 0:
            raise FieldError(f"only the first dimension may vary; the others must be sizes >= 0, got {shape!r}")
        row.append(int(dim))
    return tuple(row)


@dataclasses.dataclass(frozen=True, init=False)
class RaggedArrayField(Field):
    """A numpy array per sample whose first dimension (the length) varies: shape ``(None, *row)``.

    Values must have exactly the field's dtype and row shape, and any number of rows (zero included); a
    value with no elements at all (``np.array([], dtype)``) is a sample of length 0. Nothing is cast.
    """

    dtype: np.dtype
    shape: tuple[int | None, ...]

    type_name = "beton.RaggedArrayField"
    metadata_dtype = _RECORD
    has_payload = True

    def __init__(self, dtype: Any, shape: Sequence[Any] = (None,)) -> None:
        resolved, trailing = array_dtype(dtype)
        row = _row_shape(shape) + trailing
        if len(row) + 1 > _MAX_DIMS:
            raise FieldError(f"shape (None, *{row}) has {len(row) + 1} dimensions, numpy allows {_MAX_DIMS}")
        if math.prod(row) == 0:
            raise FieldError(f"rows of shape {row} hold no bytes, so the payload could not tell a sample's length; "
                             "give every fixed dimension a size of at least 1")
        object.__setattr__(self, "dtype", resolved)
        object.__setattr__(self, "shape", (None, *row))

    @property
    def row_shape(self) -> tuple[int, ...]:
        """The fixed dimensions of one row (``()`` for sequences of scalars)."""
        return self.shape[1:]  # type: ignore[return-value]

    @property
    def row_bytes(self) -> int:
        return math.prod(self.row_shape) * self.dtype.itemsize  # Python integers: no overflow

    def encode(self, value: Any, context: EncodeContext) -> Encoded:
        if not isinstance(value, np.ndarray):
            raise EncodeError(f"expected a numpy array of dtype {self.dtype.str} and shape (length, "
                              f"{', '.join(map(str, self.row_shape))}), got {type(value).__name__}")
        if value.dtype == self.dtype and value.shape == (0,):
            value = value.reshape((0, *self.row_shape))  # np.array([], dtype): no rows, whatever their shape
        if value.dtype != self.dtype or value.ndim != len(self.shape) or value.shape[1:] != self.row_shape:
            raise EncodeError(f"expected an array of dtype {self.dtype.str} and shape (length, *{self.row_shape}), "
                              f"got dtype {value.dtype.str} and shape {value.shape}")
        return Encoded(metadata=(len(value),), payload=np.ascontiguousarray(value).tobytes())

    def to_python(self, metadata: np.void, payload: np.ndarray | None) -> np.ndarray:
        length = int(metadata["length"])
        if length < 0 or payload is None or payload.size != length * self.row_bytes:
            raise DecodeError(f"payload has {None if payload is None else payload.size} bytes, {length} rows of "
                              f"{self.row_bytes} bytes need {length * self.row_bytes}")
        return np.array(payload.view(self.dtype).reshape((length, *self.row_shape)))

    def lengths(self, records: np.ndarray, sizes: np.ndarray | None) -> np.ndarray:
        return np.asarray(records["length"], dtype=np.int64)

    def summary(self, records: np.ndarray) -> list[str]:
        lengths = records["length"]
        return [f"lengths (rows): min {int(lengths.min())}, median {float(np.median(lengths)):g}, "
                f"99th percentile {float(np.percentile(lengths, 99)):g}, max {int(lengths.max())}"]

    def check_records(self, records: np.ndarray, sizes: np.ndarray | None, limits: ReadLimits) -> None:
        # Decoders copy length x row_bytes bytes from each payload: a length that claims more than the payload
        # holds would read past it. Checked here once, vectorised, so compiled kernels may trust every length.
        row_bytes = self.row_bytes
        largest = min(limits.max_payload_bytes or 2**62, 2**62)
        if row_bytes > largest:
            raise FormatError(f"{self.describe()} has rows of {row_bytes} bytes, more than the "
                              f"{largest}-byte file holds")
        lengths = np.asarray(records["length"])
        stored = np.zeros(len(lengths), np.uint64) if sizes is None else np.asarray(sizes, dtype=np.uint64)
        first_bad_record(lengths < 0, lambda s: f"stored length {int(lengths[s])} is negative")
        rows = lengths.astype(np.uint64)
        step = np.uint64(row_bytes)
        # where rows <= stored // row_bytes, rows * row_bytes cannot overflow; elsewhere the record is bad anyway
        bad = (rows > stored // step) | (rows * step != stored)
        first_bad_record(bad, lambda s: f"stored length {int(lengths[s])} rows of {row_bytes} bytes does not match "
                                        f"the payload's {int(stored[s])} bytes")

    def default_pipeline(self) -> list[Operation]:
        raise PipelineError("samples of different lengths need a bound: give a pipeline such as "
                            "[RaggedDecoder(max_length=...), ToTensor()] (beton.decoders; see docs/ragged.md)")

    def arguments(self) -> dict[str, Any]:
        return {"dtype": np.lib.format.dtype_to_descr(self.dtype), "shape": list(self.shape)}
