"""Operations written to FFCV's documented contract, run in beton pipelines: transforms and decoders.

FFCV's contract: subclass ``Operation`` and implement

* ``declare_state_and_memory(previous_state) -> (State, AllocationQuery | None)``: the output's State (see
  :mod:`beton.pipeline.state`) and the per-sample memory to preallocate for it (None: the operation works in
  place and returns its input);
* ``generate_code() -> function``: for a transform, ``f(batch, dst)`` computes the whole batch into ``dst`` and
  returns the output; with ``f.with_indices = True`` it is called ``f(batch, dst, indices)`` with the dataset
  indices of the batch. ``Compiler.get_iterator()`` gives the loop range to use over the batch;
* optionally, shared state: ``declare_shared_memory(previous_state)`` returns an ``AllocationQuery`` (or a
  sequence of them, or None) of per-sample memory, and ``generate_code_for_shared_state()`` a function
  ``init(shared)``. When the latter gives a function, each batch gets that memory (fresh and zeroed here, rows
  for the batch's samples), ``init(shared)`` is called with it before the operation's function, and the
  function receives it as its last argument: ``f(batch, dst[, indices], shared)``. When it gives None, as in
  FFCV, no shared memory is passed. beton runs such an operation placed in one pipeline only (placed in two,
  FFCV shares one memory between them; that is refused here with a clear error).

Every operation of a pipeline is given, before ``declare_state_and_memory`` is called, the pipeline's stored
field (``accept_field(field)``, the user's own field object for a field written to FFCV's field contract) and
the field's metadata column and ``memory_read`` (``accept_globals(metadata, memory_read)``); where it does not
define them, the attributes ``field``, ``metadata`` and ``memory_read`` are set, as FFCV's base class does. They
are given to a copy, so the user's operation object is not changed.

A **decoder** (the first operation of a pipeline, reading a field written to FFCV's field contract, see
:mod:`beton.ffcv.fields`) returns ``decoder(batch_indices, destination, metadata, storage_state)``
instead: ``metadata`` is the field's metadata column (indexed by sample), and the payload a record points to is
``self.memory_read(pointer, storage_state)``. Its input State is FFCV's starting one: jit mode, CPU, ``uint8``,
shape None.

How beton runs such an operation (:class:`FFCVOperation`):

* **compiled and fused** (the usual case: jit mode, compilation enabled, numpy output memory of the declared
  State): the function is compiled with numba (``nogil``) and wrapped as a *rows* kernel
  (:mod:`beton.ffcv.kernels`), a compiled step like beton's own: consecutive compiled steps of all
  pipelines (beton's ``JitOperation`` s, FFCV-style decoders and transforms) become one compiled stage, one
  call per batch, writing into the batch slot's buffers (batches the loop keeps stay valid as for every slot
  buffer: the slot gets fresh memory). A decoder's destination rows are zeroed first, so the padding of
  variable-length samples holds zeros, never old bytes.
* **as a batch stage** otherwise (torch input or output, output memory of a torch dtype or unlike the declared
  State, or ``Compiler.set_enabled(False)``, which runs the function as Python): one call per batch with fresh
  ``dst`` memory (zeroed for a decoder).

Memory follows FFCV's rule (:func:`gives_numpy`, :func:`allocate`): a query with a numpy dtype gets numpy
memory whatever its device, page-locked where it names a CUDA device and CUDA is there (in the slot too:
:meth:`FFCVOperation.pinned_output`); a query with a torch dtype gets torch tensors on its device.

Random draws made with ``np.random`` inside such a function are the operation's own: unlike beton's keyed
draws, they do not repeat with the seed.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from beton.errors import PipelineError
from beton.pipeline.allocation_query import AllocationQuery
from beton.pipeline.compiler import Compiler
from beton.pipeline.contracts import OperationContract
from beton.ffcv.kernels import rows_kernel
from beton.ffcv.memory import read_payload, storage_state
from beton.memory.slots import pinned_empty
from beton.pipeline.operation import (
    BatchContext,
    BatchOperation,
    JitOperation,
    Source,
    SourceState,
    State,
    torch_dtype,
)

__all__ = ["FFCVOperation", "CONTRACT", "follows_ffcv_contract", "has_shared_state", "gives_numpy", "pins", "allocate"]

#: The class that adapts a field written to FFCV's field contract (named, not imported: fields sit above).
_FFCV_FIELD_CLASS = "beton.ffcv.fields.FFCVField"
#: What a decoder's declare_state_and_memory receives: the state FFCV's pipelines start from.
_DECODER_INPUT = State(jit_mode=True, device=torch.device("cpu"), shape=None, dtype=np.dtype("u1"))


def follows_ffcv_contract(operation: Any) -> bool:
    """Whether ``operation`` is written to FFCV's contract rather than one of beton's three kinds."""
    return callable(getattr(operation, "declare_state_and_memory", None)) and \
        callable(getattr(operation, "generate_code", None))


def has_shared_state(operation: Any) -> bool:
    """Whether an operation written to FFCV's contract may use shared state (it defines
    ``generate_code_for_shared_state``; FFCV's base class gives every operation one that returns None)."""
    return callable(getattr(operation, "generate_code_for_shared_state", None))


@dataclasses.dataclass(frozen=True)
class _Prepared:
    """What ``output_state`` derived from the operation's declarations, for running it."""

    decodes: bool
    allocation: AllocationQuery | None
    function: Callable  # compiled unless it runs as Python
    with_indices: bool
    shared: AllocationQuery | tuple[AllocationQuery, ...] | None  # None: no shared memory passed
    shared_state: Callable | None  # generate_code_for_shared_state()'s function, None: no shared state
    kernel: Any = None  # the rows kernel when the operation is compiled into a fused stage, else None


@dataclasses.dataclass(frozen=True, eq=False)
class FFCVOperation(JitOperation, BatchOperation):
    """Runs an operation written to FFCV's contract (see the module docstring) in a beton pipeline: as a
    compiled rows step, fused with its compiled neighbours, or as a batch operation."""

    operation: Any
    #: the stored field of the pipeline it is placed in (:meth:`for_source`), for accept_field / accept_globals
    source: SourceState | None = None
    decodes_when_first = True
    kernel_takes_rows = True

    def for_source(self, source: SourceState) -> FFCVOperation:
        return dataclasses.replace(self, source=source)

    def placement_key(self) -> Any:
        return self.operation if has_shared_state(self.operation) else None

    def output_state(self, previous: State | SourceState) -> State:
        decodes = isinstance(previous, SourceState)
        if decodes:
            operation, given = self._given_globals(previous, decodes=True), _DECODER_INPUT
        else:
            previous.require(isinstance(previous, State) and previous.kind in ("numpy", "torch"), self,
                             "numpy or torch batches")
            operation, given = self._given_globals(self.source, decodes=False), _to_ffcv(previous)
        declared = operation.declare_state_and_memory(given)
        if not (isinstance(declared, tuple) and len(declared) == 2 and isinstance(declared[0], State)
                and (declared[1] is None or isinstance(declared[1], AllocationQuery))):
            raise PipelineError(f"{self!r}: declare_state_and_memory must return (State, AllocationQuery or None), "
                                f"got {declared!r}")
        state, allocation = declared
        if decodes and allocation is None:
            raise PipelineError(f"{self!r} decodes, so declare_state_and_memory must ask for its output memory "
                                "(an AllocationQuery), got None")
        output = _from_ffcv(state)
        shared, shared_state = self._shared(operation, given)
        jit = state.jit_mode and (decodes or previous.kind == "numpy")
        function = self._generated(operation, decodes)
        compiled = jit and Compiler.is_enabled
        if compiled and allocation is not None and not gives_numpy(allocation):
            raise PipelineError(f"{self!r} declares jit_mode=True, so its function is compiled, but asks for torch "
                                f"memory (AllocationQuery dtype {allocation.dtype}), which compiled code cannot take "
                                "(FFCV fails the same way): ask with a numpy dtype, or declare jit_mode=False")
        prepared = _Prepared(
            decodes=decodes, allocation=allocation,
            function=Compiler.compile(function) if jit else function,
            with_indices=bool(getattr(function, "with_indices", False)) and not decodes,
            shared=shared, shared_state=None if shared_state is None else
            (Compiler.compile(shared_state) if jit else shared_state))
        if compiled and _fits_slot(allocation, output, None if decodes else previous) and _numpy_queries(shared):
            queries = shared if isinstance(shared, tuple) else (shared,) if shared is not None else None
            prepared = dataclasses.replace(prepared, kernel=rows_kernel(
                prepared.function, decodes=decodes, with_indices=prepared.with_indices,
                in_place=allocation is None, shared_state=prepared.shared_state,
                shared=None if queries is None else [(tuple(q.shape), np.dtype(q.dtype)) for q in queries],
                many_shared=isinstance(shared, tuple)))
        object.__setattr__(self, "_prepared", prepared)  # derived here, read by the methods below
        return output

    # ---- how the compiler runs it ---------------------------------------------------------------------------

    def stage_kind(self, previous: State | SourceState) -> str:
        return "jit" if self._prepared.kernel is not None else "batch"

    def kernel(self) -> Any:
        return self._prepared.kernel

    def in_place(self, previous: State) -> bool:
        return self._prepared.allocation is None

    def pinned_output(self, previous: State | SourceState) -> bool:
        allocation = self._prepared.allocation
        return allocation is not None and pins(allocation)

    @property
    def _function(self) -> Callable:
        """The operation's own function as it runs (a numba dispatcher when compiled)."""
        return self._prepared.function

    # ---- what it is given -----------------------------------------------------------------------------------

    def _given_globals(self, source: SourceState | None, decodes: bool) -> Any:
        """A copy of the operation, given what FFCV's pipeline gives its operations before asking them anything:
        the pipeline's field, its metadata column and ``memory_read``."""
        if decodes:
            if not _is_ffcv_field(source.field):
                raise PipelineError(f"{self!r} is the first operation of pipeline {source.field_name!r}, so it "
                                    f"decodes the stored field, which must be written to FFCV's field contract; it "
                                    f"is {source.field.describe()}")
            if source.metadata is None:
                raise PipelineError(f"{self!r}: no metadata column for field {source.field_name!r}")
        operation = copy.copy(self.operation)
        if source is None:  # not placed in a pipeline (a plan built without sources): nothing to give
            return operation
        field = source.field.field if _is_ffcv_field(source.field) else source.field  # as the user wrote it
        _give(operation, "accept_field", (field,), {"field": field})
        _give(operation, "accept_globals", (source.metadata, read_payload),
              {"metadata": source.metadata, "memory_read": read_payload})
        return operation

    def _generated(self, operation: Any, decodes: bool) -> Callable:
        function = operation.generate_code()
        if not callable(function):
            raise PipelineError(f"{self!r}: generate_code must return a function, got {function!r}")
        if decodes and not _accepts(function, 4):
            raise PipelineError(f"{self!r} is the first operation of its pipeline, so generate_code must return a "
                                "decoder(batch_indices, destination, metadata, storage_state)")
        return function

    def _shared(self, operation: Any, given: State) -> tuple[Any, Callable | None]:
        """(shared memory queries, state function) from FFCV's shared-state methods, where the class has them."""
        if not has_shared_state(operation):
            return None, None
        shared_state = operation.generate_code_for_shared_state()
        if shared_state is None:
            return None, None  # as in FFCV: without a state function, no shared memory is passed
        if not callable(shared_state):
            raise PipelineError(f"{self!r}: generate_code_for_shared_state must return a function or None, got "
                                f"{shared_state!r}")
        declare = getattr(operation, "declare_shared_memory", None)
        queries = declare(given) if callable(declare) else None
        if isinstance(queries, Sequence) and all(isinstance(q, AllocationQuery) for q in queries):
            queries = tuple(queries)
        elif queries is not None and not isinstance(queries, AllocationQuery):
            raise PipelineError(f"{self!r}: declare_shared_memory must return an AllocationQuery, a sequence of "
                                f"them or None, got {queries!r}")
        return queries, shared_state

    # ---- as a batch operation -------------------------------------------------------------------------------

    def apply(self, batch: Any, context: BatchContext) -> Any:
        prepared = self._prepared
        count = len(context.samples)
        extra = ()
        if prepared.shared_state is not None:
            shared = prepared.shared
            memory = tuple(allocate(q, count, zeroed=True) for q in shared) if isinstance(shared, tuple) \
                else allocate(shared, count, zeroed=True)
            prepared.shared_state(memory)
            extra = (memory,)
        if prepared.decodes:
            source: Source = batch
            # zeroed: a decoder that pads (variable-length payloads) leaves the padding as it found it
            destination = allocate(prepared.allocation, count, zeroed=True)
            return prepared.function(context.samples, destination, source.metadata,
                                     storage_state(source, context.samples), *extra)
        destination = allocate(prepared.allocation, len(batch))
        if prepared.with_indices:
            return prepared.function(batch, destination, context.samples, *extra)
        return prepared.function(batch, destination, *extra)

    def __repr__(self) -> str:
        return f"{type(self.operation).__name__}() (FFCV contract)"


def _is_ffcv_field(field: Any) -> bool:
    return any(f"{cls.__module__}.{cls.__qualname__}" == _FFCV_FIELD_CLASS for cls in type(field).__mro__)


def _fits_slot(allocation: AllocationQuery | None, output: State, previous: State | None) -> bool:
    """Whether the output can live in a slot buffer of the output State: numpy memory (FFCV's rule: a numpy
    dtype, whatever the device) of exactly the declared shape and dtype, or (in place) the input's own,
    unchanged."""
    if output.kind != "numpy" or output.layout != "dense":
        return False
    if allocation is None:
        return previous is not None and previous.kind == "numpy" and \
            (tuple(previous.shape), np.dtype(previous.dtype)) == (tuple(output.shape), np.dtype(output.dtype))
    return gives_numpy(allocation) and \
        (tuple(allocation.shape), np.dtype(allocation.dtype)) == (tuple(output.shape), np.dtype(output.dtype))


def _numpy_queries(shared: Any) -> bool:
    queries = shared if isinstance(shared, tuple) else (shared,) if shared is not None else ()
    return all(gives_numpy(query) for query in queries)


# ---- FFCV's memory rule -------------------------------------------------------------------------------------

def gives_numpy(query: AllocationQuery) -> bool:
    """FFCV's memory rule: a query with a numpy dtype (or anything numpy takes as one) gets numpy memory, whatever
    its device; one with a torch dtype gets torch tensors on its device."""
    if isinstance(query.dtype, torch.dtype):
        return False
    try:
        np.dtype(query.dtype)
    except TypeError:
        raise PipelineError(f"AllocationQuery dtype {query.dtype!r} is neither a numpy nor a torch dtype") from None
    return True


def pins(query: AllocationQuery) -> bool:
    """Whether a query's numpy memory is page-locked: when it names a CUDA device (FFCV pins whenever it can; a
    page-locked buffer only speeds up copies to a GPU). Pinned only where CUDA is available."""
    return gives_numpy(query) and query.device is not None and torch.device(query.device).type == "cuda"


def allocate(query: AllocationQuery | None, count: int, zeroed: bool = False) -> Any:
    """Memory for ``count`` samples of ``query``, by FFCV's memory rule (:func:`gives_numpy`, :func:`pins`);
    None for no query."""
    if query is None:
        return None
    shape = (count, *query.shape)
    if gives_numpy(query):
        dtype = np.dtype(query.dtype)
        if pins(query) and torch.cuda.is_available():
            memory = pinned_empty(shape, dtype)
            if zeroed:
                memory[...] = 0
            return memory
        return (np.zeros if zeroed else np.empty)(shape, dtype)
    return (torch.zeros if zeroed else torch.empty)(shape, dtype=query.dtype, device=query.device or "cpu")


def _give(operation: Any, method: str, arguments: tuple, attributes: dict[str, Any]) -> None:
    """Call FFCV's ``accept_*`` method where the operation defines one, else set what it would have set."""
    accept = getattr(operation, method, None)
    if callable(accept):
        accept(*arguments)
    else:
        for name, value in attributes.items():
            setattr(operation, name, value)


def _accepts(function: Callable, count: int) -> bool:
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):  # no signature to read (a compiled function): let the call tell
        return True
    try:
        signature.bind(*range(count))
    except TypeError:
        return False
    return True


def _to_ffcv(state: State) -> State:
    """The State as an FFCV operation reads it: a torch.device, a numpy dtype in jit mode."""
    jit = state.kind == "numpy"
    dtype = np.dtype(state.dtype) if jit else state.dtype
    return State(jit_mode=jit, device=torch.device(state.device), shape=tuple(state.shape), dtype=dtype)


def _from_ffcv(state: State) -> State:
    """The State an FFCV operation declared, as beton's operations read it (a device name, the dtype's kind)."""
    if state.jit_mode:
        return State(tuple(state.shape), np.dtype(state.dtype), kind="numpy")
    return State(tuple(state.shape), torch_dtype(state.dtype), kind="torch",
                 device=str(torch.device(state.device or "cpu")))


#: FFCV's operation contract, as pipeline planning adapts it (registered by :mod:`beton.ffcv`).
CONTRACT = OperationContract("ffcv", follows_ffcv_contract, FFCVOperation)
