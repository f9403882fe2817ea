"""The memory layer: where a batch's payload bytes come from, as the epoch engine sees it.

A user picks a strategy (:class:`MemoryStrategy`: :class:`~beton.memory.OSCache` or
:class:`~beton.memory.ProcessCache`, small frozen option objects); the Loader builds the running
:class:`MemoryLayer` from it for its file (:meth:`MemoryStrategy.build`), once, and the epoch engine calls it:

1. :meth:`MemoryLayer.start_epoch` when an epoch starts, with what the epoch will read (:class:`EpochReads`:
   its batches, the payload columns its pipelines read, the pieces of each allocation its decoders read, the
   epoch's slot gate);
2. :meth:`MemoryLayer.will_serve` from a worker thread, once per batch, with its samples, then
   :meth:`MemoryLayer.source` once per stored field, before the batch's stages run: a
   :class:`~beton.pipeline.operation.Source` the decoders read;
3. :meth:`MemoryLayer.batch_done` once the batch's stages are over (also when they failed), for every batch
   whose sources were asked for;
4. :meth:`MemoryLayer.close` when the Loader closes.

``counters`` (:class:`MemoryCounters`) count what the current epoch read.

Never reading the Reader's memory map after construction: the layers copy what they need of the tables
(:func:`metadata_column`, :func:`allocation_columns`) and read payloads through their own
:class:`~beton.storage.page_source.PageSource`, whose ``check()`` runs before each batch's payloads are read and
``check_path()`` at each epoch's start (see "A file changed under a running Loader" in docs/loader.md).
"""

from __future__ import annotations

import abc
import dataclasses
import threading
from collections.abc import Mapping, Sequence

import numpy as np

from beton.errors import PipelineError
from beton.fields.base import Field
from beton.pieces import Pieces
from beton.pipeline.operation import Source
from beton.memory.slots import Slot, SlotGate
from beton.storage.page_source import PageSource
from beton.dataset.union import OpenedDataset

__all__ = ["MemoryStrategy", "MemoryLayer", "EpochReads", "StoredField", "MemoryCounters", "metadata_column",
           "allocation_columns"]


def metadata_column(dataset: OpenedDataset, field_name: str) -> np.ndarray:
    """A contiguous copy of one field's data-table column (numba wants contiguous arrays; a copy, never a view
    of the memory map, even where the column is already contiguous: see the module docstring)."""
    column = dataset.data_table[field_name]
    if column.dtype.itemsize == 0:
        return np.zeros(0, np.uint8)  # payload-only fields: numba cannot type zero-size records
    return np.array(column, order="C", copy=True)


def allocation_columns(dataset: OpenedDataset) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per payload column, contiguous int64 copies of the payloads' offsets and sizes: a batch then needs two
    takes, not a structured gather, and never reads the Reader's memory map."""
    table = dataset.allocation_table
    offsets = [np.ascontiguousarray(table[:, c]["offset"], np.int64) for c in range(table.shape[1])]
    sizes = [np.ascontiguousarray(table[:, c]["size"], np.int64) for c in range(table.shape[1])]
    return offsets, sizes


@dataclasses.dataclass(frozen=True, eq=False)
class StoredField:
    """One stored field as a pipeline reads it: its name, its Field, a copy of its data-table column
    (``metadata``) and its allocation-table column (``payload``; -1 for a field without payloads)."""

    name: str
    field: Field
    metadata: np.ndarray = dataclasses.field(repr=False)
    payload: int

    @classmethod
    def of(cls, dataset: OpenedDataset, name: str) -> StoredField:
        return cls(name, dataset.fields[name], metadata_column(dataset, name), dataset.descriptors[name].payload_column)


@dataclasses.dataclass(frozen=True, eq=False)
class EpochReads:
    """What an epoch will read, told to the memory layer when the epoch starts.

    ``batches``: every batch of the epoch (int64 sample indices), indexed by batch number; ``first``: the first
    batch the epoch computes (later than 0 after a resume); ``payloads``: the payload columns the pipelines
    read; ``pieces``: per payload column whose decoders read only parts of each allocation (the first scans of
    scan-grouped JPEGs at a low fidelity), those parts; ``gate``: the epoch's slot gate, on which a layer that
    reads ahead waits before reading a batch, as the workers do before computing it.
    """

    batches: Sequence[np.ndarray]
    first: int
    payloads: tuple[int, ...]
    pieces: Mapping[int, Pieces]
    gate: SlotGate


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


class MemoryLayer(abc.ABC):
    """A running memory layer over one opened file; the call order is in the module docstring.

    The base class holds what every layer shares: the opened file (``file``, a PageSource), the payloads'
    offsets and sizes, the counters, and the epoch's pieces. A subclass implements :meth:`source` and extends
    the rest where it keeps per-epoch or per-batch state.
    """

    def __init__(self, dataset: OpenedDataset, file: PageSource) -> None:
        self.file = file
        self._offsets, self._sizes = allocation_columns(dataset)
        self.counters = MemoryCounters()
        self._pieces: dict[int, Pieces] = {}
        self._piece_bytes: dict[int, np.ndarray] = {}
        self._empty = np.zeros(0, np.uint8)
        self._empty.flags.writeable = False  # the numba type of every layer's memory: read-only bytes
        self._no_offsets = np.zeros(0, np.int64)
        self._whole_payloads: tuple[int, ...] = ()  # payload columns the epoch reads whole

    def start_epoch(self, reads: EpochReads) -> None:
        """An epoch starts: check that the path still names the opened file, count from zero, and remember the
        pieces the decoders read. A layer that reads ahead also starts reading ``reads.batches`` here."""
        self.file.check_path()
        self.counters = MemoryCounters()
        self._pieces = dict(reads.pieces)
        self._whole_payloads = tuple(column for column in reads.payloads if column not in self._pieces)
        for column, pieces in self._pieces.items():
            _check_within_payloads(pieces, self._sizes[column], column)
        self._piece_bytes = {column: pieces.read_bytes() for column, pieces in self._pieces.items()}  # per sample

    def will_serve(self, samples: np.ndarray) -> None:
        """A batch of ``samples`` is about to be computed: the file checks what it has not checked yet of the
        files they lie in (a union's shards, against its tables file), before any of their values is read.
        Samples with bytes in a payload column the epoch reads whole are left to the reading of those bytes,
        which opens (and so checks) their files before the batch's sources exist: checking them here too would
        open them a second time, closing others the reads had opened."""
        for column in self._whole_payloads:
            samples = samples[self._sizes[column].take(samples) == 0]
        if len(samples):
            self.file.will_serve(samples)

    def empty_source(self, stored: StoredField) -> Source:
        """A Source with no payloads (fields without payloads; compiling stages on an empty batch)."""
        return Source(stored.metadata, self._empty, self._no_offsets, self._no_offsets)

    @abc.abstractmethod
    def source(self, stored: StoredField, samples: np.ndarray, batch: int, slot: Slot) -> Source:
        """Where the decoders of batch ``batch`` (``samples``, computed in ``slot``) read ``stored``'s values."""

    def batch_done(self, batch: int) -> None:
        """The stages of ``batch`` are over: its sources are read no more. A layer whose sources point into
        memory it holds for the batch (the process cache's pinned pages) releases it here; by default a
        layer holds nothing per batch."""

    def close(self) -> None:
        """Release the file (arrays already handed out stay valid)."""
        self.file.close()


def _check_within_payloads(pieces: Pieces, sizes: np.ndarray, column: int) -> None:
    """PipelineError unless every piece lies within its sample's payload: a layer reads and stages them, and a
    decoder handed a part the size of its whole payload then holds exactly that payload."""
    lengths, starts = pieces.lengths, pieces.starts
    if lengths.shape != starts.shape or len(lengths) != len(sizes):
        raise PipelineError(f"the pieces decoders read of payload column {column} cover {len(lengths)} samples, "
                            f"the file has {len(sizes)}")
    bad = (lengths < 0) | ((lengths > 0) & ((starts < 0) | (starts + lengths > sizes[:, None])))
    if bad.any():
        sample = int(np.flatnonzero(bad.any(axis=1))[0])
        raise PipelineError(f"the pieces decoders read of payload column {column} lie outside sample {sample}'s "
                            f"payload of {int(sizes[sample])} bytes: starts {starts[sample].tolist()}, lengths "
                            f"{lengths[sample].tolist()}")


class MemoryStrategy(abc.ABC):
    """A declared memory strategy: frozen options, reusable for any number of Loaders, from which each Loader
    builds its own running layer."""

    @abc.abstractmethod
    def build(self, dataset: OpenedDataset, num_slots: int) -> MemoryLayer:
        """The running layer for ``dataset``'s file, serving a ring of ``num_slots`` batch slots."""
