"""OS cache: payloads are read straight from a memory map of the file; the kernel's page cache does the rest.

The fastest choice when the dataset fits in RAM, or is read several times, since nothing is copied before the
decoders. Counters report the payload bytes the loader asked for (the OS does the actual reading).

A file changed under a running Loader
-------------------------------------
Reading a memory map past the end of a file that has since been truncated kills the process with SIGBUS, so
the memory layer touches the Reader's map only while the Loader is built: tables and metadata columns are
copied then, and payloads are read from a map of the layer's own descriptor
(:class:`~beton.storage.page_source.LocalFile`). Its size and modification time are checked before every batch,
and the path's identity when an epoch starts, so a file truncated, rewritten or replaced raises
:class:`~beton.errors.FormatError` naming the file in the training loop. A check cannot stop a truncation between
it and the decoders' reads: a read lease on the descriptor does (:mod:`beton.memory.file_lease`: whoever truncates
the file or opens it for writing waits until no batch reads the map, and the next batch raises). Where the
kernel grants no lease (another user's file, NFS: ``layer.lease.held`` is False), that window remains (see
"Memory" in docs/loader.md). A file replaced by a rename keeps being read from the file the Loader opened until
the next epoch starts, which raises.
"""

from __future__ import annotations

import dataclasses
import mmap

import numpy as np

from beton.memory.base import MemoryLayer, MemoryStrategy, StoredField
from beton.memory.file_lease import FileLease
from beton.memory.page_schedule import Heap
from beton.pipeline.operation import Source
from beton.memory.slots import Slot
from beton.storage.digests import PageDigests
from beton.storage.page_source import LocalFile
from beton.dataset.union import OpenedDataset, ShardedDataset

__all__ = ["OSCache", "OSCacheLayer"]


@dataclasses.dataclass(frozen=True)
class OSCache(MemoryStrategy):
    """Read payloads through a memory map of the file (the OS page cache): ``Loader(memory=OSCache())``.

    ``readahead=False`` asks the kernel not to read ahead around each access (``MADV_RANDOM``): for random
    access to a file larger than RAM, or when decoders read only part of each payload (progressive-JPEG
    fidelity), only the touched pages are then read from storage.
    """

    readahead: bool = True

    def build(self, reader: OpenedDataset, num_slots: int) -> OSCacheLayer:
        return OSCacheLayer(reader, self.readahead)


class OSCacheLayer(MemoryLayer):
    """The running OS cache: each batch's sources are views of one memory map of the opened file.

    It keeps the base class's ``start_epoch`` (file check, counters, pieces); a batch holds the file's read lease
    from its ``source`` to its ``batch_done``.
    """

    def __init__(self, reader: OpenedDataset, readahead: bool = True) -> None:
        if isinstance(reader, ShardedDataset):  # payloads of several files cannot lie in one memory map
            raise ValueError(f"{reader.path}: a dataset of {len(reader.readers)} files is read through the process "
                             "cache (one memory map cannot hold several files): leave os_cache and memory out, or "
                             "pass memory=ProcessCache(...)")
        file = LocalFile(reader)
        super().__init__(reader, file)
        # The map of the descriptor that check() watches, so both are the same file; it ends where the file
        # ended when opened, and the Reader checked every payload against that size.
        self.mapping = mmap.mmap(file.fd, 0, access=mmap.ACCESS_READ)
        if not readahead and hasattr(self.mapping, "madvise") and hasattr(mmap, "MADV_RANDOM"):
            self.mapping.madvise(mmap.MADV_RANDOM)
        self._memory = np.frombuffer(self.mapping, np.uint8)  # read-only, as every layer's memory
        self._heap = Heap.of(reader)
        self._digests = PageDigests.of([reader])  # None unless the Reader checks content
        self.lease = FileLease(file.fd, file.path)

    def source(self, stored: StoredField, samples: np.ndarray, batch: int, slot: Slot) -> Source:
        """Views of the map: no staging in the slot and nothing held for the batch (``batch``, ``slot`` unused)."""
        column = stored.payload
        if column < 0:
            return self.empty_source(stored)
        self.file.check()  # the batch's decoders read the map next: the file must not have shrunk
        self.lease.enter(batch)  # and nobody may shrink it until batch_done
        offsets = self._offsets[column].take(samples)
        sizes = self._sizes[column].take(samples)
        if self._digests is not None:
            self._check_content(offsets, sizes)
        read = self._piece_bytes.get(column)  # what the decoders read of each payload, where they read parts
        self.counters.add(0, int(sizes.sum() if read is None else read.take(samples).sum()))
        return Source(stored.metadata, self._memory, offsets, sizes)

    def batch_done(self, batch: int) -> None:
        self.lease.leave(batch)

    def close(self) -> None:
        self.lease.close()  # before the descriptor it watches is closed
        super().close()

    def _check_content(self, offsets: np.ndarray, sizes: np.ndarray) -> None:
        """Hash every page under these payloads that no batch has loaded yet (whole pages, even where decoders
        read parts of payloads: a page's digest covers all of it)."""
        for page in self._digests.unchecked(self._heap.pages_of(offsets, sizes)).tolist():
            start, end = self._heap.page_bounds(page)
            self._digests.check(page, self._memory[start:end])
