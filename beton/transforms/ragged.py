"""Batch operations on padded batches of variable-length samples (see :mod:`beton.pipeline.ragged`).

They follow :class:`~beton.decoders.RaggedDecoder` (or ``BytesDecoder(max_length=...)``), before ``ToTensor``:

* :class:`PadToLongest` - pad only to the batch's longest sample (at most the decoder's ``max_length``);
* :class:`Pack` - the samples' rows end to end with offsets (``cu_seqlens``), for variable-length attention;
* :class:`PackRows` - the samples' rows end to end cut into rows of a fixed length (language-model training).

Each works on the whole batch in one compiled call. PadToLongest and Pack move the rows within the batch's
own buffer (a forward memmove: every sample moves towards the front, never over rows not yet moved), so they
allocate nothing but the offsets; PackRows does the same when its rows fit in that buffer.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numba
import numpy as np

from beton.decoders.ragged import pad_row
from beton.errors import DecodeError, PipelineError
from beton.pipeline.memcopy import move_bytes
from beton.pipeline.operation import BatchContext, BatchOperation, State
from beton.pipeline.ragged import Packed, Padded

__all__ = ["PadToLongest", "Pack", "PackRows"]


@numba.njit(nogil=True, cache=True)
def _gather(memory, stride, sizes, starts):
    """Move sample i's first ``sizes[i]`` bytes from ``i * stride`` to ``starts[i]`` (``starts`` increasing from
    0, ``starts[i] + sizes[i] <= (i + 1) * stride``: every move goes towards the front, past moved bytes only)."""
    for i in range(len(sizes)):
        if starts[i] != i * stride:
            move_bytes(memory, starts[i], i * stride, sizes[i])


@numba.njit(nogil=True, cache=True)
def _pad_tail(memory, start, pad):
    row_bytes = pad.size
    for position in range(start, memory.size, row_bytes):
        for b in range(row_bytes):
            memory[position + b] = pad[b]


def _require_padded_numpy(operation: BatchOperation, previous: Any) -> State:
    if not isinstance(previous, State) or previous.kind != "numpy" or previous.layout != "padded":
        described = previous.describe() if hasattr(previous, "describe") else repr(previous)
        raise PipelineError(f"{operation!r} needs a padded numpy batch (after RaggedDecoder, before ToTensor), "
                            f"got {described}")
    return previous


def _as_bytes(batch: Padded) -> tuple[np.ndarray, np.ndarray, int]:
    """The batch's values as one flat byte array over the same memory (copied first only if not contiguous),
    its lengths as int64, and the bytes of one row."""
    values = np.ascontiguousarray(batch.values)
    row_bytes = values.dtype.itemsize * int(np.prod(values.shape[2:], dtype=np.int64))
    lengths = np.asarray(batch.lengths, dtype=np.int64)
    if len(lengths) and (lengths.min() < 0 or lengths.max() > values.shape[1]):
        raise DecodeError(f"lengths must lie in [0, {values.shape[1]}], got {lengths.min()}..{lengths.max()}")
    return values.reshape(-1).view(np.uint8), lengths, row_bytes


def _typed(memory: np.ndarray, like: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    nbytes = int(np.prod(shape, dtype=np.int64)) * like.dtype.itemsize
    return memory[:nbytes].view(like.dtype).reshape(shape)


@dataclasses.dataclass(frozen=True)
class PadToLongest(BatchOperation):
    """Trim a padded batch to its longest sample, rounded up to a multiple of ``multiple_of`` (for tensor cores)
    and at most the decoder's ``max_length``: values ``(batch, longest, *row)``, contiguous, and lengths."""

    multiple_of: int = 1

    layouts = frozenset({"padded"})

    def __post_init__(self) -> None:
        if isinstance(self.multiple_of, bool) or not isinstance(self.multiple_of, int) or self.multiple_of < 1:
            raise PipelineError(f"multiple_of must be a positive integer, got {self.multiple_of!r}")

    def output_state(self, previous: Any) -> State:
        return _require_padded_numpy(self, previous)  # shape[0] stays the bound: batches hold at most that

    def apply(self, batch: Padded, context: BatchContext) -> Padded:
        memory, lengths, row_bytes = _as_bytes(batch)
        count, capacity = batch.values.shape[:2]
        longest = int(lengths.max()) if count else 0
        kept = min(capacity, -(-longest // self.multiple_of) * self.multiple_of)
        if kept == capacity:
            return batch
        stride = capacity * row_bytes
        _gather(memory, stride, np.full(count, kept * row_bytes, np.int64),
                np.arange(count, dtype=np.int64) * (kept * row_bytes))
        return Padded(_typed(memory, batch.values, (count, kept, *batch.values.shape[2:])), lengths)


@dataclasses.dataclass(frozen=True)
class Pack(BatchOperation):
    """A padded batch -> Packed: the samples' rows end to end ``(total, *row)``, ``offsets`` ``(batch + 1,)``
    (``cu_seqlens``: sample i is ``values[offsets[i]:offsets[i + 1]]``) of ``offsets_dtype``, and
    ``max_length``, the longest sample. int32 offsets are what variable-length attention kernels take."""

    offsets_dtype: Any = np.int32

    layouts = frozenset({"padded"})

    def __post_init__(self) -> None:
        if np.dtype(self.offsets_dtype) not in (np.dtype(np.int32), np.dtype(np.int64)):
            raise PipelineError(f"offsets_dtype must be int32 or int64, got {self.offsets_dtype!r}")

    def output_state(self, previous: Any) -> State:
        return dataclasses.replace(_require_padded_numpy(self, previous), layout="packed")

    def apply(self, batch: Padded, context: BatchContext) -> Packed:
        memory, lengths, row_bytes = _as_bytes(batch)
        count, capacity = batch.values.shape[:2]
        offsets = np.zeros(count + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        total = int(offsets[-1])
        dtype = np.dtype(self.offsets_dtype)
        if total > np.iinfo(dtype).max:
            raise DecodeError(f"the batch holds {total} rows, more than {dtype} offsets can count")
        _gather(memory, capacity * row_bytes, lengths * row_bytes, offsets[:-1] * row_bytes)
        values = _typed(memory, batch.values, (total, *batch.values.shape[2:]))
        return Packed(values, offsets.astype(dtype), int(lengths.max()) if count else 0)


@dataclasses.dataclass(frozen=True)
class PackRows(BatchOperation):
    """A padded batch -> its samples' rows end to end, cut into rows of ``row_length``: a Padded batch of
    ``ceil(total / row_length)`` rows (values ``(rows, row_length, *row)``), each full but the last, which is
    padded with ``pad_value``; ``lengths`` says how much of each row holds data.

    Samples are concatenated in batch order with nothing between them: for language models, store the
    end-of-document token at the end of every sequence. Tokens are never carried over to the next batch
    (batches stay a pure function of the seed and the epoch), so each batch ends with one partial row.
    """

    row_length: int
    pad_value: Any = 0

    layouts = frozenset({"padded"})

    def __post_init__(self) -> None:
        if isinstance(self.row_length, bool) or not isinstance(self.row_length, (int, np.integer)) \
                or self.row_length < 1:
            raise PipelineError(f"row_length must be a positive integer, got {self.row_length!r}")

    def output_state(self, previous: Any) -> State:
        state = _require_padded_numpy(self, previous)
        pad_row(self.pad_value, np.dtype(state.dtype), tuple(state.shape[1:]), self)
        return dataclasses.replace(state, shape=(int(self.row_length), *state.shape[1:]))

    def apply(self, batch: Padded, context: BatchContext) -> Padded:
        memory, lengths, row_bytes = _as_bytes(batch)
        count, capacity = batch.values.shape[:2]
        row_shape = batch.values.shape[2:]
        starts = np.zeros(count, np.int64)
        np.cumsum(lengths[:-1], out=starts[1:])
        total = int(lengths.sum())
        rows = -(-total // self.row_length)
        needed = rows * self.row_length * row_bytes
        if needed > memory.size:  # the padded last row does not fit in the batch's buffer: gather elsewhere
            target = np.empty(needed, np.uint8)
            target[: memory.size] = memory
            memory = target
        _gather(memory, capacity * row_bytes, lengths * row_bytes, starts * row_bytes)
        _pad_tail(memory[:needed], total * row_bytes, pad_row(self.pad_value, batch.values.dtype, row_shape, self))
        row_lengths = np.full(rows, self.row_length, np.int64)
        if rows:
            row_lengths[-1] = total - (rows - 1) * self.row_length
        return Padded(_typed(memory, batch.values, (rows, self.row_length, *row_shape)), row_lengths)
