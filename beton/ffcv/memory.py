"""The pointers of fields written to FFCV's contract, and the ``memory_read`` their decoders follow them with.

In FFCV a field's ``encode(destination, value, malloc)`` asks ``malloc(size)`` for payload memory, gets back
``(pointer, buffer)``, fills the buffer and keeps the pointer in its metadata record (``destination['ptr']``);
its decoder later calls ``memory_read(pointer, storage_state)`` for the payload's bytes. In FFCV the pointer is
the payload's file offset.

Here it is a **handle**: ``POINTER_BASE + the sample's position in the file``. Why not the offset:

* the writer's workers encode before the parent places payloads, so an offset would have to be patched into
  records whose layout only the field knows; a handle is known when ``malloc`` is called;
* handles are unique: FFCV's offsets are not (an empty payload has the offset of the next one), and a lookup
  by offset can then return another sample's bytes;
* ``POINTER_BASE`` (2**62) is far above any offset, count or size a record holds, so the reader can tell a
  pointer from the field's other metadata without knowing the field's layout, and check, before any decoder
  runs, that every pointer a record holds is its own sample's (:mod:`beton.ffcv.fields`).

:func:`read_payload` is the compiled ``memory_read``: it finds the handle among the batch's samples and returns
that sample's payload from whichever memory the batch was read into (the file's memory map under the OS cache,
the slot's staging buffer under the process cache), as the :class:`~beton.pipeline.operation.Source` locates
it. A pointer of no sample of the batch is a :class:`~beton.errors.DecodeError`, never a read elsewhere.
"""

from __future__ import annotations

import numba
import numpy as np

from beton.errors import DecodeError
from beton.pipeline.operation import Source

__all__ = ["POINTER_BASE", "POINTER_SPAN", "pointer_of", "read_payload", "storage_state"]

#: The pointer of the sample at position 0. Fits int64 and uint64 members alike.
POINTER_BASE = 1 << 62
#: Values in [POINTER_BASE, POINTER_BASE + POINTER_SPAN) are pointers: far more samples than a file can hold.
POINTER_SPAN = 1 << 48


def pointer_of(sample: int) -> int:
    """The pointer ``malloc`` gives the sample at position ``sample`` of the file."""
    return POINTER_BASE + int(sample)


def storage_state(source: Source, samples: np.ndarray) -> tuple:
    """The ``storage_state`` argument of an FFCV-style decoder for one batch: the batch's memory, its samples
    sorted (to look handles up), their batch positions in that order, and each position's offset and size."""
    samples = np.asarray(samples, np.int64)
    order = np.argsort(samples, kind="stable")
    return (source.memory, np.ascontiguousarray(samples[order]), order.astype(np.int64),
            np.asarray(source.offsets, np.int64), np.asarray(source.sizes, np.int64))


@numba.njit(nogil=True, cache=True)
def read_payload(pointer, storage_state):
    """FFCV's ``memory_read(pointer, storage_state)``: the payload bytes the pointer names, as a read-only view."""
    memory, samples, order, offsets, sizes = storage_state
    sample = np.int64(pointer) - POINTER_BASE
    found = np.searchsorted(samples, sample)
    if sample < 0 or found >= samples.size or samples[found] != sample:
        raise DecodeError("memory_read: the pointer is not the payload pointer of a sample of this batch")
    position = order[found]
    return memory[offsets[position] : offsets[position] + sizes[position]]
