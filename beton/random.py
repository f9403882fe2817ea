"""Counter-based random numbers for compiled operations: results depend on (key, sample, draw), nothing else.

Every random draw in a pipeline is ``uniform(key, sample, draw)`` or derived from it, where ``key`` is the
operation's key for the epoch (:func:`operation_key`: a hash of seed, epoch, output and position), ``sample``
the dataset index and ``draw`` the draw's number inside the operation. No generator state is carried between
samples, so results are the same whatever thread processes a sample and in whatever order: augmentations are
bit-reproducible for any ``num_workers``.

The mixing function is SplitMix64's finaliser, which passes BigCrush when used as a counter-based hash of
distinct inputs; that is plenty for augmentation parameters.
"""

from __future__ import annotations

import hashlib

import numba
import numpy as np

__all__ = ["operation_key", "uniform", "integer", "mix64"]

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_TO_UNIT = 1.0 / 9007199254740992.0  # 2**-53


def operation_key(seed: int, epoch: int, output: int, position: int) -> np.uint64:
    """The key of one operation of one pipeline for one epoch (a stable hash, not Python's ``hash``)."""
    digest = hashlib.blake2b(f"{seed}/{epoch}/{output}/{position}".encode(), digest_size=8).digest()
    return np.uint64(int.from_bytes(digest, "little"))


@numba.njit(nogil=True, cache=True, inline="always")
def mix64(value):
    z = value
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


@numba.njit(nogil=True, cache=True)
def uniform(key, sample, draw):
    """A float64 in [0, 1) determined by (key, sample, draw)."""
    state = mix64(np.uint64(key) + np.uint64(sample) * _GOLDEN)
    state = mix64(state + np.uint64(draw) * _GOLDEN + np.uint64(1))
    return (state >> np.uint64(11)) * _TO_UNIT


@numba.njit(nogil=True, cache=True)
def integer(key, sample, draw, low, high):
    """An integer in [low, high) determined by (key, sample, draw); ``low`` when the range is empty."""
    if high <= low:
        return low
    return low + min(int(uniform(key, sample, draw) * (high - low)), high - low - 1)
