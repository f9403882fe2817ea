"""FFCV's ``AllocationQuery`` (``ffcv.pipeline.allocation_query``): the per-sample output memory an operation
written to FFCV's contract asks for in ``declare_state_and_memory``."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

__all__ = ["AllocationQuery"]


@dataclasses.dataclass(frozen=True)
class AllocationQuery:
    """Per-sample ``shape`` and ``dtype`` of the output; a ``device`` makes it a torch tensor there."""

    shape: tuple[int, ...]
    dtype: Any = np.dtype("<u1")
    device: Any = None
