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
from beton.memory.file_lease import CopyLeases, FileLease
from beton.memory.page_schedule import Heap
from beton.memory.staging import stage_buffer, staged_source
from beton.pipeline.operation import Source
from beton.memory.slots import Slot
from beton.storage.digests import PageDigests
from beton.storage.page_source import LocalFile
from beton.dataset.union import OpenedDataset, ShardedDataset, ShardedPages, open_page_source, page_digests
from beton.storage.reader import Reader

__all__ = ["OSCache", "OSCacheLayer", "ShardMapsLayer"]


@dataclasses.dataclass(frozen=True)
class OSCache(MemoryStrategy):
    """Read payloads through a memory map of the file (the OS page cache): ``Loader(memory=OSCache())``.

    ``readahead=False`` asks the kernel not to read ahead around each access (``MADV_RANDOM``): for random
    access to a file larger than RAM, or when decoders read only part of each payload (progressive-JPEG
    fidelity), only the touched pages are then read from storage.
    """

    readahead: bool = True

    def build(self, dataset: OpenedDataset, num_slots: int) -> MemoryLayer:
        if isinstance(dataset, ShardedDataset):
            return ShardMapsLayer(dataset, self.readahead)
        return OSCacheLayer(dataset, self.readahead)


class OSCacheLayer(MemoryLayer):
    """The running OS cache: each batch's sources are views of one memory map of the opened file.

    It keeps the base class's ``start_epoch`` (file check, counters, pieces); a batch holds the file's read lease
    from its ``source`` to its ``batch_done``.
    """

    def __init__(self, dataset: Reader, readahead: bool = True) -> None:
        file = LocalFile(dataset)
        super().__init__(dataset, file)
        # The map of the descriptor that check() watches, so both are the same file; it ends where the file
        # ended when opened, and the Reader checked every payload against that size.
        self.mapping = mmap.mmap(file.fd, 0, access=mmap.ACCESS_READ)
        if not readahead and hasattr(self.mapping, "madvise") and hasattr(mmap, "MADV_RANDOM"):
            self.mapping.madvise(mmap.MADV_RANDOM)
        self._memory = np.frombuffer(self.mapping, np.uint8)  # read-only, as every layer's memory
        self._heap = Heap.of(dataset)
        self._digests = page_digests(dataset)  # None unless the Reader checks content
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
            _check_pages(self._digests, self._heap, self._memory, 0, offsets, sizes)
        read = self._piece_bytes.get(column)  # what the decoders read of each payload, where they read parts
        self.counters.add(0, int(sizes.sum() if read is None else read.take(samples).sum()))
        return Source(stored.metadata, self._memory, offsets, sizes)

    def batch_done(self, batch: int) -> None:
        self.lease.leave(batch)

    def close(self) -> None:
        """Release the file and its map at once (the map's own descriptor too), unless a view of it is still held
        somewhere: then it goes when that view does."""
        self.lease.close()  # before the descriptor it watches is closed
        super().close()
        self._memory = self._empty
        try:
            self.mapping.close()
        except BufferError:
            pass


class ShardMapsLayer(MemoryLayer):
    """The OS cache over a dataset of several local files: one memory map cannot hold them all, so each batch's
    payloads are copied out of its shards' maps into the slot's staging buffers (as the process cache copies them
    out of its pages), and the decoders read those. A shard is mapped when a batch first needs it and unmapped,
    least recently used first, once more than the dataset's ``max_open_shards`` are open
    (:meth:`~beton.dataset.union.ShardedPages.mapped`); each shard opened is checked to be the file whose tables
    were read, and each batch's shards are checked after its payloads are copied, as the single file's are. Where
    content is checked (``verify_content``), each page is hashed in its shard's map the first time a batch copies
    from it, before the copy.

    A shard's read lease is held while a copy out of its map is in progress (and its size and modification time
    checked once it is held: :class:`~beton.memory.file_lease.CopyLeases`): the decoders read the copies, so the
    copy is the only time a truncated shard could raise SIGBUS, and whoever truncates it waits for the copy to end.
    Where the kernel grants no lease for a shard, the per-batch checks are all there is, as for a single file.
    """

    def __init__(self, dataset: ShardedDataset, readahead: bool = True) -> None:
        if dataset.remote_shards.any():
            number = int(np.flatnonzero(dataset.remote_shards)[0])
            raise ValueError(f"{dataset.path}: shard {number} ({dataset.manifest.shards[number].location}) is at a "
                             "URL, which no memory map can hold: read it through the process cache (leave os_cache "
                             "and memory out, or pass memory=ProcessCache(...))")
        pages = open_page_source(dataset)
        super().__init__(dataset, pages)
        self._pages: ShardedPages = pages  # type: ignore[assignment]  (several files: their ShardedPages)
        if not readahead:
            self._pages.advise_random_access()
        self._heap_ends, self._shifts = dataset.heap_ends, dataset.shifts
        self._heap = Heap.of(dataset)
        self._digests = page_digests(dataset)  # None unless some shard's content is checked
        self._leases = CopyLeases()

    def source(self, stored: StoredField, samples: np.ndarray, batch: int, slot: Slot) -> Source:
        """The batch's payloads of ``stored``, copied out of their shards' maps into ``slot``'s staging."""
        column = stored.payload
        if column < 0:
            return self.empty_source(stored)
        offsets, sizes = self._offsets[column].take(samples), self._sizes[column].take(samples)
        buffer, positions = stage_buffer(slot.staging, column, sizes)
        shards = np.searchsorted(self._heap_ends, offsets, side="right")  # a payload lies before its shard's end
        for shard in np.unique(shards[sizes > 0]).tolist():
            rows = np.flatnonzero((shards == shard) & (sizes > 0))
            with self._pages.opened(shard) as file, self._pages.mapped(shard) as mapped, \
                    self._leases.copying(file.fd, file.description, file.check):  # type: ignore[attr-defined]
                if self._digests is not None:
                    _check_pages(self._digests, self._heap, mapped, int(self._shifts[shard]), offsets[rows],
                                 sizes[rows])
                starts = offsets[rows] - int(self._shifts[shard])
                for start, size, position in zip(starts.tolist(), sizes[rows].tolist(), positions[rows].tolist()):
                    buffer[position : position + size] = mapped[start : start + size]
        self._pages.check()  # after the copies: bytes of a file changed meanwhile never reach the decoders
        read = self._piece_bytes.get(column)  # what the decoders read of each payload, where they read parts
        self.counters.add(0, int(sizes.sum() if read is None else read.take(samples).sum()))
        return staged_source(stored.metadata, buffer, positions, sizes)


def _check_pages(digests: PageDigests, heap: Heap, mapped: np.ndarray, shift: int, offsets: np.ndarray,
                 sizes: np.ndarray) -> None:
    """Check every page under these payloads (virtual ``offsets``) that no batch has loaded yet, in ``mapped``
    (a file's map, whose bytes lie ``shift`` before their virtual offsets): whole pages, even where decoders read
    parts of payloads, since a page's digest covers all of it. Hashed in the map itself: no copy."""
    def page_bytes(page: int) -> np.ndarray:
        start, end = heap.page_bounds(page)
        return mapped[start - shift : end - shift]

    digests.check_pages(heap.pages_of(offsets, sizes).tolist(), page_bytes)
