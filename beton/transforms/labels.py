"""Label operations."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numba
import numpy as np

from beton.pipeline.operation import JitOperation, State
from beton.transforms._selection import chosen_indices, is_chosen

__all__ = ["ReplaceLabel"]


@numba.njit(nogil=True, cache=True)
def _replace_label_kernel(src, dst, i, sample, key, args):
    chosen, new_label = args
    if is_chosen(chosen, sample):
        dst[i] = new_label


@dataclasses.dataclass(frozen=True)
class ReplaceLabel(JitOperation):
    """Give the samples whose dataset index is in ``indices`` the label ``new_label`` (e.g. label noise)."""

    indices: Sequence[int]
    new_label: int

    def output_state(self, previous: Any) -> State:
        previous.require(isinstance(previous, State) and previous.kind == "numpy" and previous.shape == ()
                         and np.issubdtype(previous.dtype, np.integer), self, "a numpy batch of integer labels")
        return previous

    def in_place(self, previous: State) -> bool:
        return True

    def kernel(self) -> Any:
        return _replace_label_kernel

    def kernel_arguments(self, previous: Any) -> tuple:
        return (chosen_indices(self.indices), np.int64(self.new_label))
