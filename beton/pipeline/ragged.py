"""Batches of variable-length samples: padded (values and lengths) or packed (rows end to end and offsets).

A pipeline's output is one value per batch. For samples of different lengths that value has two parts that
must never drift apart, so both travel together as one small named tuple:

* :class:`Padded` - ``values`` of shape ``(batch, capacity, *row)``, where sample ``i`` holds data in its first
  ``lengths[i]`` rows and the pad value after them, and ``lengths`` of shape ``(batch,)``. A State with
  ``layout="padded"`` describes it: ``State.shape`` is ``(capacity, *row)``.
* :class:`Packed` - the samples' rows laid end to end, ``values`` of shape ``(total rows, *row)``, and
  ``offsets`` of shape ``(batch + 1,)``: sample ``i`` is ``values[offsets[i]:offsets[i + 1]]`` (the cumulative
  sequence lengths, ``cu_seqlens``, that variable-length attention kernels take), with ``max_length`` the
  longest sample of the batch. A State with ``layout="packed"`` describes it (``State.shape`` is
  ``(capacity, *row)`` as for padded batches, capacity bounding every sample).

Both hold numpy arrays or torch tensors (``ToTensor`` converts both parts, ``ToDevice`` moves both). Why one
value and not two outputs: a pipeline reads one field and gives one output, and a lengths output computed by a
second pipeline could disagree with the values (another ``max_length``, another window) without any error.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

__all__ = ["Padded", "Packed", "map_parts", "is_ragged"]


class Padded(NamedTuple):
    """Samples padded to a common length: ``values`` ``(batch, capacity, *row)`` and ``lengths`` ``(batch,)``."""

    values: Any
    lengths: Any

    def mask(self) -> Any:
        """True where ``values`` holds data, False on padding: ``(batch, capacity)`` booleans, on values' device."""
        capacity = self.values.shape[1]
        if isinstance(self.values, np.ndarray):
            return np.arange(capacity) < np.asarray(self.lengths)[:, None]
        import torch

        positions = torch.arange(capacity, device=self.values.device)
        return positions < self.lengths.to(self.values.device)[:, None]


class Packed(NamedTuple):
    """Samples laid end to end: ``values`` ``(total rows, *row)``, ``offsets`` ``(batch + 1,)`` and the longest
    sample's length ``max_length`` (an int, as attention kernels take it)."""

    values: Any
    offsets: Any
    max_length: int

    @property
    def lengths(self) -> Any:
        return self.offsets[1:] - self.offsets[:-1]


def is_ragged(value: Any) -> bool:
    return isinstance(value, (Padded, Packed))


def map_parts(function: Callable[[Any], Any], value: Any) -> Any:
    """``function`` applied to each array part of a Padded or Packed batch (or to ``value`` itself otherwise)."""
    if isinstance(value, Padded):
        return Padded(function(value.values), function(value.lengths))
    if isinstance(value, Packed):
        return Packed(function(value.values), function(value.offsets), value.max_length)
    return function(value)
