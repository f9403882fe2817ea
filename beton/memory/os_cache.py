"""OS cache: payloads are read straight from a memory map of the file; the kernel's page cache does the rest.

The fastest choice when the dataset fits in RAM, or is read several times, since nothing is copied before the
decoders. Counters report the payload bytes the loader asked for (the OS does the actual reading).

A file changed under a running Loader
-------------------------------------
Reading a memory map past the end of a file that has since been truncated kills the process with SIGBUS, so
the memory layer touches the Reader's map only while the Loader is built: tables and metadata columns are
copied then, and payloads are read from a map of the cache's own descriptor (:class:`~beton.storage.page_source.LocalFile`). Its size
and modification time are checked before every batch, and the path's identity when an epoch starts, so a
file truncated, rewritten or replaced raises :class:`~beton.errors.FormatError` naming the file in the
training loop. What remains: a truncation after a batch's check and before its decoders have read its
payloads still raises SIGBUS (see "Memory" in docs/loader.md). A file replaced by a rename keeps being read
from the file the Loader opened until the next epoch starts, which raises.
"""

from __future__ import annotations

import mmap
import threading
from collections.abc import Mapping

import numpy as np

from beton.pieces import Pieces
from beton.pipeline.operation import Source
from beton.storage.page_source import LocalFile
from beton.storage.reader import Reader

__all__ = ["OSCache", "allocation_columns", "metadata_column"]


def metadata_column(reader: Reader, field_name: str) -> np.ndarray:
    """A contiguous copy of one field's data-table column (numba wants contiguous arrays; a copy, never a view
    of the memory map, even where the column is already contiguous: see the module docstring)."""
    column = reader.data_table[field_name]
    if column.dtype.itemsize == 0:
        return np.zeros(0, np.uint8)  # payload-only fields: numba cannot type zero-size records
    return np.array(column, order="C", copy=True)


def allocation_columns(reader: Reader) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per payload column, contiguous int64 copies of the payloads' offsets and sizes: a batch then needs two
    takes, not a structured gather, and never reads the Reader's memory map."""
    table = reader.allocation_table
    offsets = [np.ascontiguousarray(table[:, c]["offset"], np.int64) for c in range(table.shape[1])]
    sizes = [np.ascontiguousarray(table[:, c]["size"], np.int64) for c in range(table.shape[1])]
    return offsets, sizes


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
        self._file = LocalFile(reader)
        # The map of the descriptor that check() watches, so both are the same file; it ends where the file
        # ended when opened, and the Reader checked every payload against that size.
        mapping = mmap.mmap(self._file.fd, 0, access=mmap.ACCESS_READ)
        if not readahead and hasattr(mapping, "madvise") and hasattr(mmap, "MADV_RANDOM"):
            mapping.madvise(mmap.MADV_RANDOM)
        self._memory = np.frombuffer(mapping, np.uint8)  # read-only: the numba type of the process cache's views
        self._offsets, self._sizes = allocation_columns(reader)
        self.counters = MemoryCounters()
        self._pieces: dict[int, Pieces] = {}

    def start_epoch(self, batches: list[np.ndarray], columns: list[int],
                    pieces: Mapping[int, Pieces] | None = None) -> None:
        """``pieces``: per payload column whose decoders read parts of each allocation, those parts, so that the
        counters count their bytes rather than each allocation's span."""
        self._file.check_path()
        self.counters = MemoryCounters()
        self._pieces = dict(pieces or {})

    def empty_source(self, metadata: np.ndarray, column: int) -> Source:
        empty = np.zeros(0, np.int64)
        return Source(metadata, self._memory[:0], empty, empty)

    def source(self, metadata: np.ndarray, column: int, samples: np.ndarray, batch: int, slot: int) -> Source:
        if column < 0:
            return self.empty_source(metadata, column)
        self._file.check()  # the batch's decoders read the map next: the file must not have shrunk
        offsets = self._offsets[column].take(samples)
        sizes = self._sizes[column].take(samples)
        if column in self._pieces:
            self.counters.add(0, int(self._pieces[column].take(samples).read_bytes().sum()))
        else:
            self.counters.add(0, int(sizes.sum()))
        return Source(metadata, self._memory, offsets, sizes)

    def batch_done(self, batch_index: int) -> None:
        pass

    def close(self) -> None:
        self._file.close()  # the map stays valid until the last array viewing it is collected
