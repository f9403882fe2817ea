"""Process cache: whole heap pages read ahead of use, in the epoch's known order, into a bounded pool.

For data that does not fit the OS page cache, network file systems, or to measure and bound the bytes read.
Three parts, each in its own module, joined here by :class:`ProcessCacheLayer`:

* the schedule (:mod:`beton.memory.page_schedule`): at the start of an epoch the batches' samples are known,
  hence the pages each batch needs; the page budget; the pinned pages and which batches are ready;
* the page reader (:mod:`beton.memory.page_reader`): a thread that walks the batches in order, reading the
  pages of each through a :class:`~beton.storage.page_source.PageSource`, paced to ``read_bandwidth``, held
  back by the epoch's one slot gate (a fixed lead ahead of the workers);
* staging (:mod:`beton.memory.staging`): a worker computing batch b waits until b is ready, then copies the
  batch's payloads from the pinned pages into its slot's staging buffers, which the decoders read. When the
  batch's stages are over its pages are unpinned.

Partial reads (:class:`~beton.pieces.Pieces`, fixed for the epoch when it starts: the first scans of
scan-grouped progressive JPEGs at a low fidelity, or the window of rows a ragged decoder keeps): the cache
reads only the pages that hold the pieces, and of each only the prefix that does, and gathers each sample's
pieces into one payload (``Source.gathered``, ``Source.skipped``). So a low fidelity reads fewer bytes from
storage, as in PCR, and a sample of 10^7 rows costs the pages and staging of its window, not its full size.

A file changed under the cache: reads go through the page source (for a local file, ``preadv`` on the
descriptor of a :class:`~beton.storage.page_source.LocalFile`, whose size and modification time are checked
before every batch, and the path's identity when an epoch starts); a short read is an error (never zeros), and
the Reader's memory map is not touched after construction (the allocation columns are copied). So a truncated,
rewritten or replaced file raises :class:`~beton.errors.FormatError` naming the file and never kills the
process; pages already read before the change are copies and stay valid.

Content checks (``verify_content``): whole pages are read, and each is hashed once per Loader by the first worker
whose batch needs it, before the batch's payloads are staged (:class:`~beton.storage.digests.PageDigests`), not by
the page reader, which goes on reading meanwhile.

Memory bound: ``budget_pages * page_size`` bytes of pages plus the slots' staging buffers (one batch of
payloads per slot; of the parts decoders read, where they declare parts). The budget is at least the number of distinct pages any ``num_slots + 1`` consecutive
batches need (the most whose pages are pinned at once; less could deadlock), and by default twice that. Under
QUASI_RANDOM each page is needed by one contiguous run of batches, so every page is read once per epoch; under
RANDOM a page may be read several times.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from beton.memory.base import EpochReads, MemoryLayer, MemoryStrategy, StoredField
from beton.memory.page_reader import PageReader, pinned_batches
from beton.memory.page_schedule import Heap, PageSchedule, minimum_budget
from beton.memory.staging import stage_payloads, stage_pieces
from beton.pieces import Pieces
from beton.pipeline.operation import Source
from beton.memory.slots import Slot
from beton.dataset.union import OpenedDataset, open_page_source, page_digests
from beton.storage.page_source import PageSource

__all__ = ["ProcessCache", "ProcessCacheLayer"]


@dataclasses.dataclass(frozen=True)
class ProcessCache(MemoryStrategy):
    """Read whole pages ahead of use into a bounded pool of this process: ``Loader(memory=ProcessCache())``.

    ``pages``: the page budget (default: twice the fewest that cannot deadlock; a smaller request is raised to
    that minimum). ``read_bandwidth``: read at most this many bytes per second, to share a disk with other jobs
    or to measure how a pipeline behaves on slower storage (None: as fast as the file allows). How a URL is
    read is the Loader's ``remote=``, not the memory strategy's.
    """

    pages: int | None = None
    read_bandwidth: float | None = None

    def __post_init__(self) -> None:
        if self.pages is not None and self.pages < 1:
            raise ValueError(f"ProcessCache(pages=...) must be at least 1, got {self.pages}")
        if self.read_bandwidth is not None and not self.read_bandwidth > 0:
            raise ValueError(f"ProcessCache(read_bandwidth=...) must be a positive rate in bytes/s, got "
                             f"{self.read_bandwidth}")

    def build(self, dataset: OpenedDataset, num_slots: int) -> ProcessCacheLayer:
        return ProcessCacheLayer(dataset, num_slots, self.pages, self.read_bandwidth)


class ProcessCacheLayer(MemoryLayer):
    """The running process cache over one opened file (see the module docstring for its three parts).

    ``dataset``: one file (a Reader) or several as one (a :class:`~beton.dataset.union.ShardedDataset`).
    ``file``: where pages are read from (default: the dataset's files opened again, local or remote); any
    :class:`~beton.storage.page_source.PageSource` does. ``budget_pages`` is the current epoch's budget.
    """

    def __init__(self, dataset: OpenedDataset, num_slots: int, budget_pages: int | None = None,
                 read_bandwidth: float | None = None, file: PageSource | None = None) -> None:
        file = file if file is not None else open_page_source(dataset)
        self._heap = Heap.of(dataset)
        self._digests = page_digests(dataset)  # None unless content is checked
        super().__init__(dataset, file)
        self._num_slots = num_slots
        self._requested_budget = budget_pages
        self._read_bandwidth = read_bandwidth
        self._schedule = PageSchedule([], 0, 1)
        self._reader: PageReader | None = None

    @property
    def budget_pages(self) -> int:
        return self._schedule.budget_pages

    def start_epoch(self, reads: EpochReads) -> None:
        """Compute the epoch's schedule and start the page reader on it."""
        self._stop_reader()
        super().start_epoch(reads)
        empty = np.zeros(0, np.int64)
        batch_pages = [empty] * reads.first + [self._pages_of(samples, reads.payloads)
                                               for samples in reads.batches[reads.first:]]
        minimum = minimum_budget(batch_pages, pinned_batches(self._num_slots))
        self._schedule = PageSchedule(batch_pages, reads.first,
                                      max(self._requested_budget or 2 * minimum, minimum, 1))
        self.file.will_read(batch_pages, self._schedule.budget_pages)  # a remote source starts fetching
        # whole pages where content is checked: a digest covers a whole page
        page_need = self._bytes_needed_per_page(reads.payloads) if self._pieces and self._digests is None else None
        self._reader = PageReader(self.file, self._heap, self._schedule, reads.gate, reads.first, self.counters,
                                  self._read_bandwidth, page_need)

    def _pages_of(self, samples: np.ndarray, payloads: tuple[int, ...]) -> np.ndarray:
        if not payloads or not len(samples):
            return np.zeros(0, np.int64)
        parts = [self._parts(column, samples) for column in payloads]
        return self._heap.pages_of(np.concatenate([offsets for offsets, _ in parts]),
                                   np.concatenate([sizes for _, sizes in parts]))

    def _parts(self, column: int, samples: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Absolute offsets and sizes of what the decoders read of ``column`` for ``samples`` (None: every
        sample): their pieces where they read parts (a ragged window, early scans), else whole payloads."""
        offsets = self._offsets[column] if samples is None else self._offsets[column].take(samples)
        pieces = self._pieces.get(column)
        if pieces is None:
            return offsets, self._sizes[column] if samples is None else self._sizes[column].take(samples)
        if samples is not None:
            pieces = pieces.take(samples)
        return (offsets[:, None] + pieces.starts).reshape(-1), pieces.lengths.reshape(-1)

    def _bytes_needed_per_page(self, payloads: tuple[int, ...]) -> np.ndarray:
        """How many bytes of each page this epoch reads: a prefix, when decoders read only parts of payloads."""
        heap = self._heap
        need = np.zeros(heap.num_pages, np.int64)
        for column in sorted(payloads):
            offsets, sizes = self._parts(column)
            starts, ends = offsets[sizes > 0] - heap.offset, offsets[sizes > 0] - heap.offset + sizes[sizes > 0]
            first, last = starts // heap.page_size, (ends - 1) // heap.page_size
            np.maximum.at(need, last, ends - last * heap.page_size)
            spanned = np.zeros(heap.num_pages + 1, np.int64)  # a part spanning pages needs all but its last whole
            np.add.at(spanned, first, 1)
            np.add.at(spanned, last, -1)
            need[np.cumsum(spanned[:-1]) > 0] = heap.page_size
        return need

    def source(self, stored: StoredField, samples: np.ndarray, batch: int, slot: Slot) -> Source:
        column = stored.payload
        if column < 0:
            return self.empty_source(stored)
        pages = self._schedule.pages_for(batch)  # pinned until batch_done
        self.file.check()  # after the wait: every page of the batch was read before a check that passed
        if self._digests is not None:  # in the worker, not the page reader, which goes on reading meanwhile
            self._digests.check_pages(pages, pages.__getitem__)
        offsets = self._offsets[column].take(samples)
        pieces: Pieces | None = self._pieces.get(column)
        if pieces is not None:
            return stage_pieces(pages, self._heap, slot.staging, column, stored.metadata, offsets,
                                pieces.take(samples), self.file.description)
        return stage_payloads(pages, self._heap, slot.staging, column, stored.metadata, offsets,
                              self._sizes[column].take(samples), self.file.description)

    def batch_done(self, batch: int) -> None:
        """Unpin the batch's pages."""
        self._schedule.release(batch)

    def _stop_reader(self) -> None:
        if self._reader is not None:
            self._reader.stop()
            self._reader = None

    def close(self) -> None:
        self._stop_reader()
        super().close()
