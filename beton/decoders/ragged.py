"""Decoding variable-length samples into bounded, padded batches: ``batch_size x max_length`` rows at most.

:class:`RaggedDecoder` reads a :class:`~beton.fields.RaggedArrayField`: each sample gives at most
``max_length`` rows, chosen by ``window`` (its first rows, its middle, or a random window drawn from the keyed
generator of :mod:`beton.random`, so the same for any number of workers), padded with ``pad_value``. The batch
is a :class:`~beton.pipeline.ragged.Padded` (values and lengths): the slot buffers hold ``max_length`` rows per
sample whatever the longest sample in the file, and only the window's bytes are read from the payload. The
decoder declares those bytes (:meth:`RaggedDecoder.payload_pieces`, the same window draws as its kernel's),
so the process cache reads and stages only the pages and rows of each window, not whole long samples.

The kernels copy bytes (:func:`beton.pipeline.memcopy.copy_bytes`), so every dtype a field stores works, also
those numba cannot compute with (float16, big-endian).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import numba
import numpy as np

from beton.decoders.field_check import require_field
from beton.errors import DecodeError, PipelineError
from beton.pieces import Pieces
from beton.pipeline.memcopy import copy_bytes
from beton.pipeline.operation import JitOperation, State
from beton.random import integer

__all__ = ["RaggedDecoder", "WINDOWS", "pad_row", "window_start", "window_starts", "fill_padded"]

#: Where a sample longer than ``max_length`` is cut: its first rows, its middle rows, or a random window.
WINDOWS: dict[str, int] = {"start": 0, "center": 1, "random": 2}


@numba.njit(nogil=True, cache=True)
def window_start(key, sample, length, take, window):
    """First row of the ``take`` rows kept from a sample of ``length`` rows (see WINDOWS)."""
    if window == 0 or take >= length:
        return 0
    if window == 1:
        return (length - take) // 2
    return integer(key, sample, 0, 0, length - take + 1)


@numba.njit(nogil=True, cache=True)
def fill_padded(values, memory, offset, size, length, start, take, row_bytes, pad, pad_is_zero):
    """Copy rows [start, start + take) of a payload of ``length`` rows into the byte row ``values``, then pad.

    Raises DecodeError when the payload's size does not hold ``length`` rows (the reader checked every stored
    length on open; this keeps a kernel from ever reading past a payload it was handed)."""
    if length < 0 or length * row_bytes != size:
        raise DecodeError("payload size does not match the stored length")
    used = take * row_bytes
    copy_bytes(values[:used], memory, offset + start * row_bytes, used)
    if pad_is_zero:
        values[used:] = 0
    else:
        for position in range(used, values.size, row_bytes):
            for b in range(row_bytes):
                values[position + b] = pad[b]


@numba.njit(nogil=True, cache=True)
def window_starts(key, lengths, capacity, window):
    """``window_start`` of every sample of a file (sample i of ``lengths[i]`` rows), as the kernel draws it."""
    starts = np.empty(lengths.size, np.int64)
    for sample in range(lengths.size):
        length = np.int64(lengths[sample])
        starts[sample] = window_start(key, np.int64(sample), length, min(length, capacity), window)
    return starts


@numba.njit(nogil=True, cache=True)
def _window_held_at(offset, size, skipped, i, first, used):
    """Where a payload would start in memory that holds ``size`` bytes of it, at ``offset``, from byte
    ``skipped[i]`` on (a Source of parts); DecodeError unless that is exactly the window [first, first + used)."""
    if skipped.size == 0:
        raise DecodeError("payload size does not match the stored length")
    if skipped[i] != first or size != used:
        raise DecodeError("the memory layer holds other rows of this payload than the decoder's window")
    return offset - skipped[i]


@numba.njit(nogil=True, cache=True)
def _ragged_kernel(src, dst, i, sample, key, args):
    row_bytes, capacity, pad, pad_is_zero, window = args
    length = np.int64(src[0][sample]["length"])
    take = min(length, capacity)
    start = window_start(key, sample, length, take, window)
    offset, size, whole = np.int64(src[2][i]), np.int64(src[3][i]), length * row_bytes
    if size != whole:  # the memory layer holds part of the payload: the window declared in payload_pieces
        offset = _window_held_at(offset, size, src[4], i, start * row_bytes, take * row_bytes)
    fill_padded(dst[0][i], src[1], offset, whole, length, start, take, row_bytes, pad, pad_is_zero)
    dst[1][i] = take


def pad_row(pad_value: Any, dtype: np.dtype, row_shape: tuple[int, ...], operation: Any) -> np.ndarray:
    """One row of ``pad_value`` as bytes; PipelineError when the value is not exactly a value of the dtype."""
    if isinstance(pad_value, (int, np.integer)) and not isinstance(pad_value, bool) and pad_value == 0:
        return np.zeros(int(np.prod(row_shape, dtype=np.int64)) * dtype.itemsize, np.uint8)  # 0 of any dtype
    try:
        converted = np.asarray(pad_value, dtype=dtype)
        exact = converted.shape == () and bool(converted == pad_value)
        if not exact and isinstance(pad_value, float) and np.isnan(pad_value):
            exact = bool(np.isnan(converted))
    except (TypeError, ValueError, OverflowError):
        exact = False
    if not exact:
        raise PipelineError(f"{operation!r}: pad_value {pad_value!r} is not a value of dtype {dtype}")
    return np.full(row_shape, converted, dtype).reshape(-1).view(np.uint8).copy()


def check_max_length(operation: Any, max_length: Any) -> int:
    if isinstance(max_length, bool) or not isinstance(max_length, (int, np.integer)) or max_length < 1:
        raise PipelineError(f"{operation!r}: max_length must be a positive integer, got {max_length!r}")
    return int(max_length)


def check_window(operation: Any, window: str) -> int:
    if window not in WINDOWS:
        raise PipelineError(f"{operation!r}: window must be one of {sorted(WINDOWS)}, got {window!r}")
    return WINDOWS[window]


@dataclasses.dataclass(frozen=True)
class RaggedDecoder(JitOperation):
    """RaggedArrayField -> a Padded batch: ``(batch, max_length, *row)`` values and ``(batch,)`` int64 lengths.

    A sample of more than ``max_length`` rows keeps ``max_length`` of them: its first (``window="start"``,
    truncation), its middle (``"center"``) or a random window (``"random"``: a random crop, e.g. one second of
    audio, drawn per sample and epoch from the seed); shorter ones are padded with ``pad_value`` after their
    rows. Follow with ``ToTensor()``, ``PadToLongest()`` (trim to the batch's longest sample), ``Pack()`` or
    ``PackRows(n)`` (see :mod:`beton.transforms.ragged`).
    """

    max_length: int
    pad_value: Any = 0
    window: str = "start"

    is_decoder: ClassVar[bool] = True

    def __post_init__(self) -> None:
        check_max_length(self, self.max_length)
        check_window(self, self.window)

    def output_state(self, previous: Any) -> State:
        field = require_field(self, previous, "beton.fields.ragged.RaggedArrayField").field
        pad_row(self.pad_value, field.dtype, field.row_shape, self)
        return State((self.max_length, *field.row_shape), field.dtype, layout="padded")

    def kernel(self) -> Any:
        return _ragged_kernel

    def payload_pieces(self, previous: Any, key: np.uint64) -> Pieces | None:
        """The rows each sample keeps (its window, the same draw as the kernel's), as one piece per sample;
        None when no sample is longer than ``max_length`` (whole payloads are then the same bytes)."""
        field, metadata = previous.field, previous.metadata
        if metadata is None or not len(metadata):
            return None
        lengths = np.ascontiguousarray(metadata["length"], np.int64)
        if not (lengths > self.max_length).any():
            return None
        starts = window_starts(np.uint64(key), lengths, np.int64(self.max_length), np.int64(WINDOWS[self.window]))
        row_bytes = field.row_bytes
        return Pieces((starts * row_bytes)[:, None], (np.minimum(lengths, self.max_length) * row_bytes)[:, None])

    def kernel_arguments(self, previous: Any) -> tuple:
        field = previous.field
        pad = pad_row(self.pad_value, field.dtype, field.row_shape, self)
        return (np.int64(field.row_bytes), np.int64(self.max_length), pad, not pad.any(),
                np.int64(WINDOWS[self.window]))
