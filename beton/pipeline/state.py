"""FFCV's ``State`` (``ffcv.pipeline.state``), for operations written to FFCV's contract.

beton's own operations use :class:`beton.pipeline.operation.State` (shape, dtype, kind, device). An operation
written for FFCV receives this State in ``declare_state_and_memory`` and returns a changed copy
(``dataclasses.replace(previous_state, shape=...)``); :mod:`beton.pipeline.ffcv_contract` translates between
the two.
"""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["State"]


@dataclasses.dataclass(frozen=True)
class State:
    """Per-sample shape and dtype of a batch; ``jit_mode`` True means numpy on the CPU (compilable), False torch
    tensors on ``device``; ``dtype`` is a numpy dtype in jit mode, a torch dtype otherwise."""

    jit_mode: bool
    device: Any
    shape: tuple[int, ...]
    dtype: Any
