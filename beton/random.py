"""Every random number beton draws, from the one seed the user gives: four schemes, one per kind of consumer.

Each scheme is keyed by exactly what its results may depend on, and by nothing else (no global generator, no
thread or process identity), so results repeat with the seed whatever ``num_workers`` is:

* orders: :func:`order_rng` (seed, epoch);
* compiled kernels: :func:`operation_key` (seed, epoch, output, position), then :func:`uniform` and
  :func:`integer` (key, sample, draw);
* batch operations: :func:`batch_rng` (seed, epoch, batch, purpose);
* the writer: :func:`encode_rng` (writer seed, sample, field) and :func:`writer_shuffle` (writer seed).

Why each consumer needs its own scheme is in docs/loader.md, "Randomness".

The counter-based kernels' scheme: every draw in a compiled operation is ``uniform(key, sample, draw)`` or
derived from it, where ``key`` is the operation's key for the epoch (:func:`operation_key`), ``sample`` the
dataset index and ``draw`` the draw's number inside the operation. No generator state is carried between
samples, so augmentations are bit-reproducible for any ``num_workers``. The mixing function is SplitMix64's
finaliser, which passes BigCrush when used as a counter-based hash of distinct inputs; that is plenty for
augmentation parameters.

Changing any of these functions changes every file written with a seed-dependent field and every
order or augmentation users have resumed from: ``tests/test_random.py`` pins values of each.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import numba
import numpy as np

__all__ = ["order_rng", "operation_key", "uniform", "integer", "mix64", "batch_rng", "encode_rng",
           "writer_shuffle"]

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_TO_UNIT = 1.0 / 9007199254740992.0  # 2**-53
_WRITER_SHUFFLE = 0x5348  # keys the writer's shuffle apart from the fields' own draws (which take 3 words)


def order_rng(seed: int, epoch: int) -> np.random.Generator:
    """The generator an order draws one epoch's permutation from (the same on every rank)."""
    return np.random.default_rng([seed, epoch])


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


def batch_rng(seed: int, epoch: int, batch: int, purpose: str) -> np.random.Generator:
    """The generator of one batch for one purpose: every operation of the batch naming ``purpose`` gets the
    same draws (the purpose's first 8 UTF-8 bytes, as a little-endian number, key it)."""
    purpose_number = int.from_bytes(purpose.encode("utf-8")[:8].ljust(8, b"\0"), "little")
    return np.random.default_rng([seed, epoch, batch, purpose_number])


def encode_rng(seed: int, sample: int, field: int) -> np.random.Generator:
    """The generator a field's ``encode`` draws from for one sample (position in the file) and field (position
    in the writer's fields)."""
    return np.random.default_rng([seed, sample, field])


def writer_shuffle(seed: int, indices: Iterable[int]) -> list[int]:
    """``indices`` in the order ``DatasetWriter.from_indexed_dataset(shuffle_indices=True)`` stores them."""
    return [int(i) for i in np.random.default_rng([seed, _WRITER_SHUFFLE]).permutation(list(indices))]
