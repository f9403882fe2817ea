"""Pieces: the parts of samples' allocations a decoder reads, when it reads less than the whole allocation.

A field says which (:meth:`beton.fields.Field.read_pieces`: a progressive JPEG's first scans, stored apart
in a scan-grouped page); the memory layers read only those parts and lay them end to end, followed by a
trailer (the JPEG's end marker), so the decoder gets one contiguous payload. This module is the one place that
lays pieces out, for the memory layers and for decoders handed a whole allocation.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

__all__ = ["Pieces"]


@dataclasses.dataclass(frozen=True)
class Pieces:
    """Per sample (rows): ``starts`` relative to the allocation's offset and ``lengths`` (0: a column the sample
    does not use), int64 arrays of one shape; ``trailer``: bytes that follow the pieces in what a decoder reads."""

    starts: np.ndarray
    lengths: np.ndarray
    trailer: bytes = b""

    def same_as(self, other: Pieces) -> bool:
        """The same parts of the same samples (what two decoders of one field declared)."""
        return self is other or (self.trailer == other.trailer and np.array_equal(self.starts, other.starts)
                                 and np.array_equal(self.lengths, other.lengths))

    def take(self, rows: np.ndarray) -> Pieces:
        """The pieces of these samples only."""
        return Pieces(self.starts[rows], self.lengths[rows], self.trailer)

    def read_bytes(self) -> np.ndarray:
        """Bytes read from storage per sample: the pieces."""
        return self.lengths.sum(axis=1)

    def sizes(self) -> np.ndarray:
        """Bytes a decoder gets per sample: the pieces end to end, then the trailer."""
        return self.read_bytes() + len(self.trailer)

    def skipped(self) -> np.ndarray | None:
        """Bytes of each allocation before what a decoder gets, when that is one contiguous part (one piece per
        sample, no trailer: a ragged window), for ``Source.skipped``; None (nothing skipped) otherwise."""
        if self.starts.ndim != 2 or self.starts.shape[1] != 1 or self.trailer:
            return None
        return np.ascontiguousarray(self.starts[:, 0], np.int64)

    def gather(self, row: int, copy: Callable[[int, int, np.ndarray], None], out: np.ndarray) -> np.ndarray:
        """Lay sample ``row``'s pieces end to end in ``out`` (``sizes()[row]`` bytes), then the trailer;
        ``copy(start, length, destination)`` fetches one piece of the allocation."""
        done = 0
        for start, length in zip(self.starts[row].tolist(), self.lengths[row].tolist()):
            if length:
                copy(start, length, out[done : done + length])
                done += length
        out[done : done + len(self.trailer)] = np.frombuffer(self.trailer, np.uint8)
        return out
