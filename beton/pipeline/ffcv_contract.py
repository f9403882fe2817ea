"""Operations written to FFCV's documented contract, run in beton pipelines: transforms and decoders.

FFCV's contract: subclass ``Operation`` and implement

* ``declare_state_and_memory(previous_state) -> (State, AllocationQuery | None)``: the output's State (see
  :mod:`beton.pipeline.state`) and the per-sample memory to preallocate for it (None: the operation works in
  place and returns its input);
* ``generate_code() -> function``: for a transform, ``f(batch, dst)`` computes the whole batch into ``dst`` and
  returns the output; with ``f.with_indices = True`` it is called ``f(batch, dst, indices)`` with the dataset
  indices of the batch. ``Compiler.get_iterator()`` gives the loop range to use over the batch.

A **decoder** (the first operation of a pipeline, reading a field written to FFCV's field contract, see
:mod:`beton.fields.ffcv_contract`) returns ``decoder(batch_indices, destination, metadata, storage_state)``
instead: ``metadata`` is the field's metadata column (indexed by sample), and the payload a record points to is
``self.memory_read(pointer, storage_state)``. As in FFCV, the decoder is given ``field`` (the field object),
``metadata`` and ``memory_read`` before ``declare_state_and_memory`` is called (by ``accept_field`` and
``accept_globals`` where it defines them); they are set on a copy, so the user's operation object is not
changed. Its input State is FFCV's starting one: jit mode, CPU, ``uint8``, shape None.

beton runs such an operation as a batch stage (:class:`FFCVOperation`): in jit mode (numpy input, and every
decoder that declares jit mode) the function is compiled with numba (``nogil``), so worker threads run it in
parallel; on torch input it runs as Python. ``dst`` is fresh memory for every batch, so batches the loop keeps
stay valid; a decoder's is zeroed, so the padding of variable-length samples holds zeros, never old bytes. Random draws made with ``np.random`` inside such a function are the operation's own: unlike beton's
keyed draws, they do not repeat with the seed.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from beton.errors import PipelineError
from beton.pipeline.allocation_query import AllocationQuery
from beton.pipeline.compiler import Compiler
from beton.pipeline.ffcv_memory import read_payload, storage_state
from beton.pipeline.operation import BatchContext, BatchOperation, Source, SourceState, State, torch_dtype
from beton.pipeline.state import State as FFCVState

__all__ = ["FFCVOperation", "follows_ffcv_contract"]

#: The class that adapts a field written to FFCV's field contract (named, not imported: fields sit above).
_FFCV_FIELD_CLASS = "beton.fields.ffcv_contract.FFCVField"
#: What a decoder's declare_state_and_memory receives: the state FFCV's pipelines start from.
_DECODER_INPUT = FFCVState(jit_mode=True, device=torch.device("cpu"), shape=None, dtype=np.dtype("u1"))


def follows_ffcv_contract(operation: Any) -> bool:
    """Whether ``operation`` is written to FFCV's contract rather than one of beton's three kinds."""
    return callable(getattr(operation, "declare_state_and_memory", None)) and \
        callable(getattr(operation, "generate_code", None))


@dataclasses.dataclass(frozen=True, eq=False)
class FFCVOperation(BatchOperation):
    """Runs an operation written to FFCV's contract (see the module docstring) as a beton batch operation."""

    operation: Any
    decodes_when_first = True

    def output_state(self, previous: State | SourceState) -> State:
        decodes = isinstance(previous, SourceState)
        if decodes:
            operation, given = self._bound_decoder(previous), _DECODER_INPUT
        else:
            previous.require(isinstance(previous, State) and previous.kind in ("numpy", "torch"), self,
                             "numpy or torch batches")
            operation, given = self.operation, _to_ffcv(previous)
        declared = operation.declare_state_and_memory(given)
        if not (isinstance(declared, tuple) and len(declared) == 2 and isinstance(declared[0], FFCVState)
                and (declared[1] is None or isinstance(declared[1], AllocationQuery))):
            raise PipelineError(f"{self!r}: declare_state_and_memory must return (State, AllocationQuery or None), "
                                f"got {declared!r}")
        state, allocation = declared
        function = self._generated(operation, decodes)
        jit = state.jit_mode and (decodes or previous.kind == "numpy")
        object.__setattr__(self, "_allocation", allocation)
        object.__setattr__(self, "_decodes", decodes)
        object.__setattr__(self, "_with_indices", bool(getattr(function, "with_indices", False)))
        object.__setattr__(self, "_function", Compiler.compile(function) if jit else function)
        return _from_ffcv(state)

    def _bound_decoder(self, source: SourceState) -> Any:
        """A copy of the decoder, given what FFCV's pipeline gives a decoder before asking it anything."""
        if not any(f"{cls.__module__}.{cls.__qualname__}" == _FFCV_FIELD_CLASS for cls in type(source.field).__mro__):
            raise PipelineError(f"{self!r} is the first operation of pipeline {source.field_name!r}, so it decodes "
                                f"the stored field, which must be written to FFCV's field contract; it is "
                                f"{source.field.describe()}")
        if source.metadata is None:
            raise PipelineError(f"{self!r}: no metadata column for field {source.field_name!r}")
        decoder = copy.copy(self.operation)
        field = source.field.field  # the user's own field object, as FFCV hands it over
        _give(decoder, "accept_field", (field,), {"field": field})
        _give(decoder, "accept_globals", (source.metadata, read_payload),
              {"metadata": source.metadata, "memory_read": read_payload})
        return decoder

    def _generated(self, operation: Any, decodes: bool) -> Callable:
        function = operation.generate_code()
        if not callable(function):
            raise PipelineError(f"{self!r}: generate_code must return a function, got {function!r}")
        if decodes and not _accepts(function, 4):
            raise PipelineError(f"{self!r} is the first operation of its pipeline, so generate_code must return a "
                                "decoder(batch_indices, destination, metadata, storage_state)")
        return function

    def apply(self, batch: Any, context: BatchContext) -> Any:
        if self._decodes:
            source: Source = batch
            # zeroed: a decoder that pads (variable-length payloads) leaves the padding as it found it
            destination = _allocate(self._allocation, len(context.samples), zeroed=True)
            return self._function(context.samples, destination, source.metadata,
                                  storage_state(source, context.samples))
        destination = _allocate(self._allocation, len(batch))
        if self._with_indices:
            return self._function(batch, destination, context.samples)
        return self._function(batch, destination)

    def __repr__(self) -> str:
        return f"{type(self.operation).__name__}() (FFCV contract)"


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


def _allocate(query: AllocationQuery | None, count: int, zeroed: bool = False) -> Any:
    if query is None:
        return None
    shape = (count, *query.shape)
    if query.device is None:
        return (np.zeros if zeroed else np.empty)(shape, np.dtype(query.dtype))
    return (torch.zeros if zeroed else torch.empty)(shape, dtype=torch_dtype(query.dtype), device=query.device)


def _to_ffcv(state: State) -> FFCVState:
    jit = state.kind == "numpy"
    dtype = np.dtype(state.dtype) if jit else state.dtype
    return FFCVState(jit_mode=jit, device=torch.device(state.device), shape=tuple(state.shape), dtype=dtype)


def _from_ffcv(state: FFCVState) -> State:
    if state.jit_mode:
        return State(tuple(state.shape), np.dtype(state.dtype), kind="numpy")
    return State(tuple(state.shape), torch_dtype(state.dtype), kind="torch",
                 device=str(torch.device(state.device or "cpu")))
