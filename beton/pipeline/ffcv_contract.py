"""Operations written to FFCV's documented contract, run in beton pipelines.

FFCV's contract: subclass ``Operation`` and implement

* ``declare_state_and_memory(previous_state) -> (State, AllocationQuery | None)``: the output's State (see
  :mod:`beton.pipeline.state`) and the per-sample memory to preallocate for it (None: the operation works in
  place and returns its input);
* ``generate_code() -> function``: the function ``f(batch, dst)`` computes the whole batch into ``dst`` and
  returns the output; with ``f.with_indices = True`` it is called ``f(batch, dst, indices)`` with the dataset
  indices of the batch. ``Compiler.get_iterator()`` gives the loop range to use over the batch.

beton runs such an operation as a batch stage (:class:`FFCVOperation`): in jit mode (numpy input) the function
is compiled with numba (``nogil``), so worker threads run it in parallel; on torch input it runs as Python.
``dst`` is fresh memory for every batch, so batches the loop keeps stay valid. Random draws made with
``np.random`` inside such a function are the operation's own: unlike beton's keyed draws, they do not repeat
with the seed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from beton.errors import PipelineError
from beton.pipeline.allocation_query import AllocationQuery
from beton.pipeline.compiler import Compiler
from beton.pipeline.operation import BatchContext, BatchOperation, State, torch_dtype
from beton.pipeline.state import State as FFCVState

__all__ = ["FFCVOperation", "follows_ffcv_contract"]


def follows_ffcv_contract(operation: Any) -> bool:
    """Whether ``operation`` is written to FFCV's contract rather than one of beton's three kinds."""
    return callable(getattr(operation, "declare_state_and_memory", None)) and \
        callable(getattr(operation, "generate_code", None))


@dataclasses.dataclass(frozen=True, eq=False)
class FFCVOperation(BatchOperation):
    """Runs an operation written to FFCV's contract (see the module docstring) as a beton batch operation."""

    operation: Any

    def output_state(self, previous: State) -> State:
        previous.require(isinstance(previous, State) and previous.kind in ("numpy", "torch"), self,
                         "numpy or torch batches")
        declared = self.operation.declare_state_and_memory(_to_ffcv(previous))
        if not (isinstance(declared, tuple) and len(declared) == 2 and isinstance(declared[0], FFCVState)
                and (declared[1] is None or isinstance(declared[1], AllocationQuery))):
            raise PipelineError(f"{self!r}: declare_state_and_memory must return (State, AllocationQuery or None), "
                                f"got {declared!r}")
        state, allocation = declared
        object.__setattr__(self, "_allocation", allocation)
        object.__setattr__(self, "_function", self._compile(state.jit_mode and previous.kind == "numpy"))
        return _from_ffcv(state)

    def _compile(self, jit: bool) -> Callable:
        function = self.operation.generate_code()
        if not callable(function):
            raise PipelineError(f"{self!r}: generate_code must return a function, got {function!r}")
        with_indices = bool(getattr(function, "with_indices", False))
        compiled = Compiler.compile(function) if jit else function
        object.__setattr__(self, "_with_indices", with_indices)
        return compiled

    def apply(self, batch: Any, context: BatchContext) -> Any:
        destination = _allocate(self._allocation, len(batch))
        if self._with_indices:
            return self._function(batch, destination, context.samples)
        return self._function(batch, destination)

    def __repr__(self) -> str:
        return f"{type(self.operation).__name__}() (FFCV contract)"


def _allocate(query: AllocationQuery | None, count: int) -> Any:
    if query is None:
        return None
    shape = (count, *query.shape)
    if query.device is None:
        return np.empty(shape, np.dtype(query.dtype))
    return torch.empty(shape, dtype=torch_dtype(query.dtype), device=query.device)


def _to_ffcv(state: State) -> FFCVState:
    jit = state.kind == "numpy"
    dtype = np.dtype(state.dtype) if jit else state.dtype
    return FFCVState(jit_mode=jit, device=torch.device(state.device), shape=tuple(state.shape), dtype=dtype)


def _from_ffcv(state: FFCVState) -> State:
    if state.jit_mode:
        return State(tuple(state.shape), np.dtype(state.dtype), kind="numpy")
    return State(tuple(state.shape), torch_dtype(state.dtype), kind="torch",
                 device=str(torch.device(state.device or "cpu")))

