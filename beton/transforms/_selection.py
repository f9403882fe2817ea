"""Operations that act on chosen samples only (ReplaceLabel, Poison): the chosen dataset indices, and the test."""

from __future__ import annotations

from collections.abc import Sequence

import numba
import numpy as np


def chosen_indices(indices: Sequence[int]) -> np.ndarray:
    """The chosen dataset indices as a sorted int64 array without repeats, for :func:`is_chosen`."""
    return np.unique(np.asarray(indices, dtype=np.int64))


@numba.njit(nogil=True, cache=True)
def is_chosen(chosen, sample):
    """Whether ``sample`` is among the sorted ``chosen`` indices."""
    position = np.searchsorted(chosen, sample)
    return position < chosen.size and chosen[position] == sample
