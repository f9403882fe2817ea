"""Operations: the steps of a loader pipeline, and the State that flows between them.

An operation is an immutable description (a frozen dataclass). From the State of its input it derives the
State of its output (:meth:`Operation.output_state`), raising :class:`~beton.errors.PipelineError` when it
cannot accept that input. It holds no per-field or global state, so one instance may sit in two pipelines.

There are three kinds, and the compiler treats each differently:

* :class:`JitOperation` - per sample, compiled with numba. It names a module-level ``@njit`` kernel
  (:meth:`JitOperation.kernel`) with the fixed signature ``kernel(src, dst, i, sample, key, args)``:
  read sample ``sample`` from ``src`` (batch position ``i``), write batch position ``i`` of ``dst``; ``key``
  seeds its random draws (see :mod:`beton.random`); ``args`` is the tuple from
  :meth:`JitOperation.kernel_arguments`. Consecutive jit operations are fused into one compiled loop. A jit
  operation that needs its whole batch at once (``kernel_takes_rows``) is called once between two such loops
  of the same compiled stage.
* :class:`SampleOperation` - per sample, in Python, run by worker threads (for C calls that release the GIL,
  such as JPEG decoding): :meth:`SampleOperation.apply` writes batch position ``i`` of ``dst``.
* :class:`BatchOperation` - once per batch, on the whole batch (torch operations): ``apply(batch) -> batch``.

Decoders are the first operation of a pipeline: their input State is a :class:`SourceState` naming the field,
and their ``src`` is the field's :class:`Source` for the batch.

Variable-length samples travel as a padded batch (``State.layout == "padded"``, see
:mod:`beton.pipeline.ragged`): values with a capacity as first per-sample dimension, and each sample's length.
A jit kernel then gets ``src``/``dst`` as the pair ``(values, lengths)``: values as raw bytes, one row of
``capacity * row bytes`` per batch position (numba cannot read every dtype numpy can store), lengths int64.
Python operations get a :class:`~beton.pipeline.ragged.Padded` of typed arrays. An operation takes only the
layouts it lists in ``layouts`` (dense batches by default), so a pipeline that would hand it a padded batch is
refused when it is built.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Hashable, Mapping, Sequence
from typing import Any, ClassVar, Literal

import numpy as np

from beton.errors import PipelineError
from beton.pipeline.allocation_query import AllocationQuery  # re-exported: FFCV's examples import it from here
from beton.pieces import Pieces
from beton.random import batch_rng

__all__ = [
    "State",
    "SourceState",
    "Source",
    "Operation",
    "JitOperation",
    "SampleOperation",
    "BatchOperation",
    "BatchContext",
    "Scratch",
    "AllocationQuery",
]


@dataclasses.dataclass(frozen=True)
class State:
    """What flows between operations: per-sample shape and dtype, as numpy arrays or torch tensors.

    ``kind`` "python" is a list of Python objects per batch (bytes, JSON values); shape and dtype are unused.

    It is also FFCV's ``State`` (``ffcv.pipeline.state``, the face :mod:`beton.pipeline.state`): ``jit_mode`` is
    FFCV's spelling of ``kind`` (True: numpy batches, compilable; False: torch tensors). Either may be given or
    changed (``dataclasses.replace(state, jit_mode=False)`` as FFCV operations do, ``kind="torch"`` as beton's);
    the other follows.
    """

    shape: tuple[int, ...]  # None only in the State an FFCV-style decoder starts from
    dtype: Any  # np.dtype for numpy data, torch.dtype for torch data
    kind: Literal["numpy", "torch", "python"] = "numpy"
    device: Any = "cpu"  # a str; a torch.device where an FFCV-style operation gives one
    #: "dense": one array ``(batch, *shape)``; "padded": a Padded batch, ``shape[0]`` a capacity; "packed": a
    #: Packed batch (rows of ``shape[1:]`` end to end). See :mod:`beton.pipeline.ragged`.
    layout: Literal["dense", "padded", "packed"] = "dense"
    jit_mode: bool | None = dataclasses.field(default=None, repr=False)
    #: (kind, jit_mode) as this State was built, so that a copy tells which of the two its caller changed.
    _built: tuple[str, bool] | None = dataclasses.field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        kind, jit = self.kind, self.jit_mode
        if jit is not None and jit != (kind == "numpy") and (self._built is None or self._built[0] == kind):
            kind = "numpy" if jit else ("torch" if kind == "numpy" else kind)  # jit_mode was given or changed
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "jit_mode", kind == "numpy")
        object.__setattr__(self, "_built", (kind, kind == "numpy"))

    def require(self, condition: bool, operation: Operation, expectation: str) -> None:
        if not condition:
            raise PipelineError(f"{operation!r} needs {expectation}, got {self.describe()}")

    def describe(self) -> str:
        layout = "" if self.layout == "dense" else f"{self.layout} "
        return f"{layout}{self.kind} {self.dtype} per-sample shape {self.shape} on {self.device}"


@dataclasses.dataclass(frozen=True)
class SourceState:
    """The input of a decoder: which stored field it reads, and that field's data-table column (all samples)."""

    field: Any  # beton.fields.Field
    field_name: str
    metadata: np.ndarray | None = dataclasses.field(default=None, compare=False, repr=False)
    #: The sources of the pipelines holding the operations this decoder follows (:meth:`Operation.follows`),
    #: in the same order: e.g. the image field whose crop a boxes decoder repeats.
    followed: tuple[SourceState, ...] = dataclasses.field(default=(), compare=False, repr=False)
    #: Each sample's length (:meth:`beton.fields.Field.lengths`: bytes of a byte string, rows of a ragged
    #: array) for fields that have one, else None: for a decoder whose output shape is the file's longest sample.
    lengths: np.ndarray | None = dataclasses.field(default=None, compare=False, repr=False)

    def describe(self) -> str:
        return f"stored field {self.field_name!r} ({self.field.describe()})"


@dataclasses.dataclass(frozen=True)
class Source:
    """Everything a decoder kernel may read for one field, for one batch.

    ``metadata`` is the field's data-table column for all samples (indexed by sample); ``memory`` holds the
    payload bytes, and ``offsets[i]``/``sizes[i]`` locate batch position i's payload in it. Fields without a
    payload get empty arrays. Passed to kernels as the tuple ``(metadata, memory, offsets, sizes, skipped)``.

    ``skipped``: empty (the default, None) when memory holds whole payloads. A memory layer may instead hold only
    the part of each payload that the decoder said it reads (:meth:`Operation.payload_pieces`: the window of
    rows a :class:`~beton.decoders.RaggedDecoder` keeps); ``skipped[i]`` is then how many bytes at the front
    of batch position i's payload it does not hold: ``memory[offsets[i] + k]`` is byte ``skipped[i] + k`` of
    the payload, for ``k < sizes[i]``. A decoder that declares parts checks them against what it needs.
    """

    metadata: np.ndarray
    memory: np.ndarray
    offsets: np.ndarray
    sizes: np.ndarray
    #: True when the memory layer gathered pieces of each payload end to end (for scan-grouped JPEGs: plain
    #: JPEGs of the first scans + EOI; for a decoder's own pieces: the part of each payload it reads).
    gathered: bool = False
    skipped: np.ndarray | None = None

    def as_tuple(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        skipped = self.skipped if self.skipped is not None else np.zeros(0, np.int64)  # empty: whole payloads
        return self.metadata, self.memory, self.offsets, self.sizes, skipped


@dataclasses.dataclass(frozen=True)
class BatchContext:
    """One batch as the executor runs it, and what a Python-level operation may know about it.

    The executor makes one per batch (``keys`` and ``sources`` filled) and hands each Python-level operation a
    copy whose ``key`` is that operation's own (:meth:`with_key`).
    """

    samples: np.ndarray  # dataset indices of the batch, int64
    epoch: int
    key: np.uint64 = np.uint64(0)  # this operation's random key for this epoch
    batch: int = 0  # the batch's number in the epoch (counting batches a resume skipped)
    seed: int = 0
    scratch: Any = None  # Scratch of the batch's slot: scratch(nbytes, purpose) -> a reusable uint8 buffer
    fidelity: int | None = None  # progressive-JPEG scans to read, set by Loader.set_fidelity (None: all)
    #: every operation's key for this epoch, by (output, position in its pipeline)
    keys: Mapping[tuple[int, int], np.uint64] = dataclasses.field(default_factory=dict, repr=False)
    #: per output, where its decoder reads the batch's stored values
    sources: Sequence[Source] = dataclasses.field(default=(), repr=False)

    def with_key(self, key: Any) -> BatchContext:
        """This context as an operation whose random key is ``key`` sees it."""
        # every field written out: this runs per operation per batch, and dataclasses.replace costs twice as much
        return BatchContext(self.samples, self.epoch, key, self.batch, self.seed, self.scratch, self.fidelity,
                            self.keys, self.sources)

    def batch_rng(self, purpose: str) -> np.random.Generator:
        """A generator shared by every operation of this batch that names the same purpose (e.g. mixup)."""
        return batch_rng(self.seed, self.epoch, self.batch, purpose)


def torch_dtype(dtype: Any) -> Any:
    """A torch dtype from a torch dtype, its name ("bfloat16") or anything numpy takes as a dtype."""
    import torch

    if isinstance(dtype, torch.dtype):
        return dtype
    if isinstance(dtype, str) and isinstance(getattr(torch, dtype, None), torch.dtype):
        return getattr(torch, dtype)
    return torch.from_numpy(np.zeros(0, dtype)).dtype


class Scratch:
    """Grow-only uint8 buffers owned by one batch slot, or by a worker helping with another batch (so by one thread
    at a time), one per purpose.

    A purpose is any hashable name; buffers of different purposes never overlap.
    """

    def __init__(self) -> None:
        self._buffers: dict[Hashable, np.ndarray] = {}

    def __call__(self, nbytes: int, purpose: Hashable = "default") -> np.ndarray:
        buffer = self._buffers.get(purpose)
        if buffer is None or buffer.size < nbytes:
            buffer = self._buffers[purpose] = np.empty(nbytes, np.uint8)
        return buffer[:nbytes]


class Operation(abc.ABC):
    """Base of all operations; see the module docstring for the three kinds.

    A direct subclass may instead follow FFCV's contract (``declare_state_and_memory`` and ``generate_code``):
    pipelines run it adapted (:mod:`beton.pipeline.contracts`; :class:`beton.ffcv.operations.FFCVOperation`).
    """

    def output_state(self, previous: State | SourceState) -> State:
        """Validate the input State and return the output State (every beton operation implements it)."""
        raise PipelineError(f"{type(self).__name__} implements neither output_state (beton's contract: subclass "
                            "JitOperation, SampleOperation or BatchOperation) nor declare_state_and_memory and "
                            "generate_code (FFCV's contract)")

    #: True for decoders: operations whose input is a stored field (a SourceState), not another operation.
    is_decoder: ClassVar[bool] = False
    #: True for operations that decode when they come first in a pipeline and transform elsewhere: FFCV's
    #: contract marks no decoders, the first operation of a pipeline is its decoder.
    decodes_when_first: ClassVar[bool] = False

    #: The batch layouts (State.layout) this operation takes as input.
    layouts: ClassVar[frozenset[str]] = frozenset({"dense"})

    def follows(self) -> tuple[Operation, ...]:
        """Operations of other pipelines whose random draws this one repeats (boxes that move with their image).

        The very instances placed in those pipelines. This operation's kernel (or ``BatchContext.key``) then
        receives their keys, in this order, as a uint64 array instead of a key of its own; a decoder also sees
        their pipelines' sources in ``SourceState.followed``.
        """
        return ()

    def payload_pieces(self, previous: SourceState, key: np.uint64) -> Pieces | None:
        """For a decoder that reads only part of each payload: those parts, for every sample of the file, in an
        epoch whose random key for this operation is ``key`` (the one its kernel gets); None (the default): it
        reads whole payloads.

        A memory layer that copies payloads (the process cache) then reads and stages only these parts, and the
        decoder's :class:`Source` says so (``skipped``, ``sizes``): a decoder that declares parts must read them
        from where the Source says, and raise when the Source does not hold what it needs. Several decoders of
        one stored field get parts only when all declare the same ones.
        """
        return None

    def payload_setting(self, fidelity: int | None) -> int | None:
        """The setting at which this decoder reads its field's payloads (:meth:`beton.fields.Field.read_pieces`)
        while the loader's fidelity is ``fidelity`` (``Loader.set_fidelity``; None: not set): that fidelity by
        default. A decoder with a setting of its own overrides this (the image decoders' ``fidelity``: the
        loader's wins when set). A larger setting reads more and None reads everything, so several decoders of
        one field get the largest.
        """
        return fidelity

    def in_place(self, previous: State) -> bool:
        """True when the operation writes its output into its input's buffer (no buffer of its own)."""
        return False

    def pinned_output(self, previous: State | SourceState) -> bool:
        """True when the output buffer should be page-locked memory, for fast and asynchronous copies to a GPU:
        the slot pins it where CUDA is available (plain memory elsewhere). False by default; an operation written
        to FFCV's contract asks for it with a numpy-dtype ``AllocationQuery`` on a CUDA device."""
        return False

    def for_source(self, source: SourceState) -> Operation:
        """This operation as placed in a pipeline that reads ``source`` (the compiler asks before anything else).

        Itself, for beton's operations: they learn what they need from the States they are given. Operations
        written to FFCV's contract are told their pipeline's field and metadata (FFCV's ``accept_field`` and
        ``accept_globals``), on a copy: see :mod:`beton.ffcv.operations`.
        """
        return self

    def stage_kind(self, previous: State | SourceState) -> str | None:
        """Override to run as another kind for some inputs ("jit", "sample" or "batch"); None: by class."""
        return None

    def placement_key(self) -> Any:
        """An object whose operation may sit in one place of the pipelines only, or None (the default: any
        number). An FFCV operation with shared state gives the user's object: FFCV shares one memory between its
        placements, which beton refuses rather than run differently."""
        return None

    def __repr__(self) -> str:
        if dataclasses.is_dataclass(self):
            parts = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in dataclasses.fields(self) if f.repr)
            return f"{type(self).__name__}({parts})"
        return f"{type(self).__name__}()"


class JitOperation(Operation):
    """A per-sample operation compiled with numba and fused with its jit neighbours."""

    #: False: the kernel is ``kernel(src, dst, i, sample, key, args)``, called for each batch position inside the
    #: stage's fused loop. True: it is ``kernel(src, dst, start, end, samples, key, args)``, called once for the
    #: batch positions ``[start, end)`` (``samples`` is the whole batch's): for operations that need their batch
    #: at once, as those written to FFCV's contract. The fused stage ends its loop before such a kernel and
    #: starts another after it, so it still runs in the same compiled call.
    kernel_takes_rows: ClassVar[bool] = False

    @abc.abstractmethod
    def kernel(self) -> Any:
        """The module-level ``numba.njit(nogil=True, cache=True)`` kernel ``(src, dst, i, sample, key, args)``."""

    def kernel_arguments(self, previous: State | SourceState) -> tuple:
        """Constant arguments for the kernel (numpy scalars and arrays), derived from this operation's fields."""
        return ()


class SampleOperation(Operation):
    """A per-sample operation run in Python by the worker threads (for GIL-releasing C calls)."""

    @abc.abstractmethod
    def apply(self, src: Any, dst: np.ndarray, i: int, sample: int, context: BatchContext) -> None:
        """Write batch position ``i`` of ``dst`` from ``src`` (a :class:`Source` for decoders).

        Other positions of the same batch may run at the same time in other threads (idle workers help finish
        the epoch's last batches): write position ``i`` only, and keep temporary buffers in ``context.scratch``
        (each thread's own)."""


class BatchOperation(Operation):
    """An operation applied once per batch, usually a torch operation."""

    @abc.abstractmethod
    def apply(self, batch: Any, context: BatchContext) -> Any:
        """Return the transformed batch (may be a view of the input)."""
