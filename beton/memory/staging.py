"""The process cache's staging: a batch's payloads copied out of pinned pages into its slot's staging buffer.

The decoders read one contiguous, read-only buffer per stored field and batch: the payloads laid end to end
(or, for decoders that read parts of each allocation, each sample's pieces gathered end to end with their
trailer, ``Source.gathered``; where that is one contiguous part, such as a ragged window, ``Source.skipped``
says where in the payload it starts). The buffer belongs to the batch's slot (``slot.staging``, grow-only, one per
payload column), so it stays untouched until the slot's next batch, after the stages that read it are over.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from beton.errors import CorruptDataError
from beton.memory.page_schedule import Heap
from beton.pieces import Pieces
from beton.pipeline.operation import Scratch, Source

__all__ = ["stage_payloads", "stage_pieces", "stage_buffer", "staged_source"]


def stage_payloads(pages: Mapping[int, np.ndarray], heap: Heap, staging: Scratch, column: int,
                   metadata: np.ndarray, offsets: np.ndarray, sizes: np.ndarray, description: str) -> Source:
    """A Source over the payloads at absolute ``offsets`` of ``sizes`` bytes, copied end to end into the
    staging buffer of ``column``."""
    buffer, positions = stage_buffer(staging, column, sizes)
    for offset, size, position in zip(offsets.tolist(), sizes.tolist(), positions.tolist()):
        _copy(pages, heap, offset - heap.offset, size, buffer[position : position + size], description)
    return staged_source(metadata, buffer, positions, sizes)


def stage_pieces(pages: Mapping[int, np.ndarray], heap: Heap, staging: Scratch, column: int,
                 metadata: np.ndarray, offsets: np.ndarray, pieces: Pieces, description: str) -> Source:
    """A Source over each sample's ``pieces`` (of the allocations at absolute ``offsets``), gathered end to end
    with the trailer into the staging buffer of ``column``."""
    sizes = pieces.sizes()
    buffer, positions = stage_buffer(staging, column, sizes)
    starts = offsets - heap.offset
    for row, (start, position, size) in enumerate(zip(starts.tolist(), positions.tolist(), sizes.tolist())):
        def copy(offset: int, length: int, out: np.ndarray, start: int = start) -> None:
            _copy(pages, heap, start + offset, length, out, description)

        pieces.gather(row, copy, buffer[position : position + size])
    return staged_source(metadata, buffer, positions, sizes, gathered=True, skipped=pieces.skipped())


def stage_buffer(staging: Scratch, column: int, sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The staging buffer for payloads of ``sizes`` laid end to end, and where each one starts."""
    positions = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64) if len(sizes) else sizes
    return staging(max(int(sizes.sum()), 1), column), positions


def _copy(pages: Mapping[int, np.ndarray], heap: Heap, start: int, size: int, out: np.ndarray,
          description: str) -> None:
    """Copy ``size`` heap bytes from heap offset ``start`` out of the pages (which may be prefixes)."""
    done = 0
    while done < size:
        page, within = divmod(start + done, heap.page_size)
        piece = min(size - done, heap.page_size - within)
        available = pages[page][within : within + piece]
        if len(available) != piece:
            raise CorruptDataError(f"{description}: page {page} was read up to byte {len(pages[page])}, a payload "
                                   f"needs byte {within + piece}")
        out[done : done + piece] = available
        done += piece


def staged_source(metadata: np.ndarray, buffer: np.ndarray, positions: np.ndarray, sizes: np.ndarray,
                      gathered: bool = False, skipped: np.ndarray | None = None) -> Source:
    """A Source over the filled part of a staging buffer, which decoders must not write into."""
    view = buffer[: int(sizes.sum())]
    view.flags.writeable = False
    return Source(metadata, view, positions, sizes, gathered=gathered, skipped=skipped)
