"""Operations written to FFCV's contract as compiled kernels that fuse into beton's stages.

An FFCV-style operation's function works on a whole batch (``f(batch, dst[, indices][, shared])``; a decoder's
``f(batch_indices, destination, metadata, storage_state[, shared])``), so it cannot run inside the per-sample
loop of a fused stage. :func:`rows_kernel` wraps it in a kernel of the compiler's *rows* form
(``kernel(src, dst, start, end, samples, key, args)``, see :class:`beton.pipeline.operation.JitOperation`): the
stage ends its loop, calls the kernel once for the batch positions ``[start, end)`` (the whole batch, or one
sample when the executor replays a failing batch to name the sample), and starts a new loop after it. So a
decoder, FFCV-style transforms and beton's own compiled operations around them run in one compiled call per
batch, and their outputs live in the batch slot's buffers like every other compiled step's.

What the wrapper adds around the user's function, so that the fused path gives what the batch path gives:

* a decoder's destination rows are zeroed first (the batch path gives it zeroed memory): the padding of
  variable-length samples holds zeros, never an earlier batch's bytes;
* its ``storage_state`` is built from the batch's samples, as the batch path builds it
  (:func:`beton.ffcv.memory.storage_state`);
* the function's result must be an array of the declared dtype and number of dimensions and of the output
  rows' shape (else :class:`~beton.errors.PipelineError`); where it is not the output rows themselves (a
  function that returns another array, or an in-place operation that returns a copy), it is copied there;
* shared state (``declare_shared_memory`` + ``generate_code_for_shared_state``): fresh zeroed memory for the
  batch's rows, given to the state function first and then to the operation's function as its last argument.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numba
import numpy as np
from numba import types
from numba.extending import overload

from beton.errors import PipelineError

__all__ = ["rows_kernel", "adopt_result", "batch_storage_state"]


def adopt_result(result: Any, rows: np.ndarray) -> None:
    """Make ``rows`` (the step's output rows) hold ``result`` (what the operation's function returned).

    Only called from compiled code; the compiled version (below) checks the types when the stage compiles."""
    raise NotImplementedError("adopt_result is only available in compiled code")


@overload(adopt_result)
def _adopt_result_compiled(result, rows):
    if not (isinstance(result, types.Array) and result.ndim == rows.ndim and result.dtype == rows.dtype):
        message = (f"an operation written to FFCV's contract returned {result}, but declared "
                   f"{rows.ndim - 1}-dimensional {rows.dtype} samples in its State")

        def refuse(result, rows):
            raise PipelineError(message)

        return refuse

    def adopt(result, rows):
        if result.shape != rows.shape:
            raise PipelineError("an operation written to FFCV's contract returned an array whose shape is not "
                                "(batch, *the shape its State declared)")
        if result.ctypes.data != rows.ctypes.data or result.strides != rows.strides:
            rows[...] = result.copy()  # the copy first: the result may overlap the rows

    return adopt


@numba.njit(nogil=True, cache=True)
def batch_storage_state(source, samples):
    """What :func:`beton.ffcv.memory.storage_state` gives a decoder, from the stage's arguments: the
    batch's memory, its samples sorted, their batch positions in that order, each position's offset and size."""
    memory, offsets, sizes = source[1], source[2], source[3]
    order = np.argsort(samples, kind="mergesort").astype(np.int64)
    return memory, samples[order].astype(np.int64), order, offsets.astype(np.int64), sizes.astype(np.int64)


def rows_kernel(function: Callable, *, decodes: bool, with_indices: bool, in_place: bool,
                shared: Sequence[tuple[tuple[int, ...], np.dtype]] | None, shared_state: Callable | None,
                many_shared: bool) -> Any:
    """The compiled rows kernel around ``function`` (already compiled), see the module docstring.

    ``shared``: per shared-memory query, its per-sample (shape, dtype); None when the operation declares none.
    ``shared_state``: the compiled ``generate_code_for_shared_state()`` function, None when it gives none (then,
    as in FFCV, no shared memory is passed at all). ``many_shared``: the queries came as a sequence (a tuple of
    arrays is passed), not as one query (one array).
    """
    namespace: dict[str, Any] = {"np": np, "function": function, "adopt_result": adopt_result,
                                 "batch_storage_state": batch_storage_state, "shared_state": shared_state}
    lines = ["def rows(src, dst, start, end, samples, key, args):",
             "    if end <= start:",
             "        return",  # nothing to do; the stage was still compiled with this call in it
             "    out = dst[start:end]"]
    extra = ""
    if shared_state is not None:
        if shared is None:
            lines.append("    shared = None")
        else:
            arrays = []
            for number, (shape, dtype) in enumerate(shared):
                namespace[f"SHAPE_{number}"], namespace[f"DTYPE_{number}"] = tuple(shape), np.dtype(dtype)
                arrays.append(f"np.zeros((end - start,) + SHAPE_{number}, DTYPE_{number})")
            packed = f"({', '.join(arrays)},)" if many_shared else arrays[0]
            lines.append(f"    shared = {packed}")
        lines.append("    shared_state(shared)")
        extra = ", shared"
    if decodes:
        lines += ["    out[...] = 0",
                  f"    result = function(samples[start:end], out, src[0], batch_storage_state(src, samples){extra})"]
    else:
        destination = "None" if in_place else "out"
        indices = ", samples[start:end]" if with_indices else ""
        lines.append(f"    result = function(src[start:end], {destination}{indices}{extra})")
    lines.append("    adopt_result(result, out)")
    exec(compile("\n".join(lines) + "\n", "<beton FFCV rows kernel>", "exec"), namespace)
    return numba.njit(nogil=True)(namespace["rows"])
