"""OS cache: payloads are read straight from a memory map of the file; the kernel's page cache does the rest.

The fastest choice when the dataset fits in RAM, or is read several times, since nothing is copied before the
decoders. Counters report the payload bytes the loader asked for (the OS does the actual reading).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

import numpy as np

from beton.fields.rgb_image import scan_bytes
from beton.pipeline.operation import Source
from beton.reader import Reader

__all__ = ["OSCache", "metadata_column"]


def metadata_column(reader: Reader, field_name: str) -> np.ndarray:
    """A contiguous copy of one field's data-table column (numba wants contiguous arrays)."""
    column = reader.data_table[field_name]
    if column.dtype.itemsize == 0:
        return np.zeros(0, np.uint8)  # payload-only fields: numba cannot type zero-size records
    return np.ascontiguousarray(column)


class MemoryCounters:
    """Pages and bytes read, per epoch; safe to update from several threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.pages_read = 0
        self.bytes_read = 0

    def add(self, pages: int, num_bytes: int) -> None:
        with self._lock:
            self.pages_read += pages
            self.bytes_read += num_bytes

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return {"pages_read": self.pages_read, "bytes_read": self.bytes_read}


class OSCache:
    """Sources for decoders from the memory map of the file.

    ``readahead=False`` asks the kernel not to read ahead around each access (``MADV_RANDOM``): for random
    access to a file larger than RAM, or when decoders read only part of each payload (progressive-JPEG
    fidelity), only the touched pages are then read from storage. It applies to the whole mapping, hence to
    every user of this Reader.
    """

    def __init__(self, reader: Reader, readahead: bool = True) -> None:
        self._reader = reader
        if not readahead:
            reader.advise_random_access()
        self._memory = reader.file_map  # read-only: the same numba type as the process cache's staging views
        # Contiguous int64 columns, made once: a batch then needs only two takes, not a structured gather.
        table = reader.allocation_table
        self._offsets = [np.ascontiguousarray(table[:, c]["offset"], np.int64) for c in range(table.shape[1])]
        self._sizes = [np.ascontiguousarray(table[:, c]["size"], np.int64) for c in range(table.shape[1])]
        self.counters = MemoryCounters()
        self._scan_limits: dict[int, int | None] = {}

    def start_epoch(self, batches: list[np.ndarray], columns: list[int],
                    scan_limits: Mapping[int, int | None] | None = None) -> None:
        """``scan_limits``: per payload column of scan-grouped images, the scans the decoders read (None: all),
        so that the counters count those scans' bytes rather than each image's allocation span."""
        self.counters = MemoryCounters()
        self._scan_limits = dict(scan_limits or {})

    def empty_source(self, metadata: np.ndarray, column: int) -> Source:
        empty = np.zeros(0, np.int64)
        return Source(metadata, self._memory[:0], empty, empty)

    def source(self, metadata: np.ndarray, column: int, samples: np.ndarray, batch: int, slot: int) -> Source:
        if column < 0:
            return self.empty_source(metadata, column)
        offsets = self._offsets[column].take(samples)
        sizes = self._sizes[column].take(samples)
        if column in self._scan_limits:
            self.counters.add(0, int(scan_bytes(metadata[samples], self._scan_limits[column]).sum()))
        else:
            self.counters.add(0, int(sizes.sum()))
        return Source(metadata, self._memory, offsets, sizes)

    def batch_done(self, batch_index: int) -> None:
        pass

    def close(self) -> None:
        pass
