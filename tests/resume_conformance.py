"""One check that a resumable loader resumes exactly: :func:`check_resume`.

A resumable is anything that yields an epoch per ``iter()``, has ``state_dict()``/``load_state_dict()`` and is a
context manager (a :class:`beton.Loader` under any order, memory strategy, shard or worker count). Every part of
beton that can be checkpointed is checked through this one function, so "resumes exactly" means the same thing
everywhere: the batches an uninterrupted run yields, byte for byte, in the same order, with the same random
augmentations (keyed by epoch and batch number), after a checkpoint taken mid-epoch or at an epoch's end, in a
fresh object or in the same one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch


def fingerprint(batch: Any) -> tuple:
    """The batch's outputs as bytes (copied at once: batches share memory with the loader's slots)."""
    def one(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return (tuple(value.shape), str(value.dtype), value.cpu().numpy().tobytes())
        if isinstance(value, np.ndarray):
            return (value.shape, str(value.dtype), value.tobytes())
        if isinstance(value, tuple):  # Padded / Packed batches of ragged fields: each part's bytes
            return (type(value).__name__, *(one(part) for part in value))
        return repr(value)

    return tuple(one(value) for value in batch)


def where(state: dict) -> tuple[int, int, int]:
    """A state's (seed, epoch, position)."""
    return state["seed"], state["epoch"], state["position"]


def epoch_of(resumable: Any) -> list[tuple]:
    """One epoch (the next ``iter()``), fingerprinted."""
    return [fingerprint(batch) for batch in resumable]


def check_resume(make: Callable[[], Any], midpoint: int | str, epochs: int = 3) -> None:
    """``make()`` builds the resumable, configured the same way each call (a fixed seed, or None: the seed is
    then part of the state). Checks, against an uninterrupted run of ``epochs`` epochs, that a checkpoint taken
    after ``midpoint`` batches of epoch 1 (``midpoint`` may be 0, or "end": the epoch's length):

    * names epoch 1 and ``midpoint`` (the next epoch's start once epoch 1 is over);
    * resumed in a fresh object, yields the rest of epoch 1, then every later epoch, exactly;
    * loaded into the interrupted object itself (whose iterator is still open) does the same;
    * taken again at the start of a resumed epoch is the same checkpoint as the uninterrupted run's.
    """
    with make() as reference:
        expected = [epoch_of(reference) for _ in range(epochs)]
        final_state = reference.state_dict()
    length = len(expected[1])
    midpoint = length if midpoint == "end" else midpoint
    assert 0 <= midpoint <= length, f"midpoint {midpoint} outside epoch 1's {length} batches"
    assert (final_state["epoch"], final_state["position"], final_state["samples"]) == (epochs, 0, 0)

    with make() as interrupted:
        assert epoch_of(interrupted) == expected[0]
        iterator = iter(interrupted)
        received = [fingerprint(next(iterator)) for _ in range(midpoint)]
        state = interrupted.state_dict()  # a checkpoint inside the loop, the iterator still open
        assert received == expected[1][:midpoint]
        if midpoint < length:
            assert (state["epoch"], state["position"]) == (1, midpoint), state
        else:
            assert (state["epoch"], state["position"]) in ((1, length), (2, 0)), state
        # the live object itself restored to the checkpoint: its open iterator is superseded
        interrupted.load_state_dict(state)
        _check_continuation(interrupted, state, received, expected)

    with make() as resumed:  # a fresh process would do this: a new object, then the checkpoint
        resumed.load_state_dict(state)
        assert resumed.state_dict() == state
        _check_continuation(resumed, state, received, expected)
        assert resumed.state_dict() == final_state


def _check_continuation(resumable: Any, state: dict, received: list[tuple], expected: list[list[tuple]]) -> None:
    """After ``load_state_dict(state)``: the rest of the interrupted epoch, then every later epoch."""
    epoch = state["epoch"]
    if state["position"]:
        assert received + epoch_of(resumable) == expected[epoch]
        assert resumable.state_dict() == {**state, "epoch": epoch + 1, "position": 0, "samples": 0}
        epoch += 1
    for number in range(epoch, len(expected)):
        assert epoch_of(resumable) == expected[number], f"epoch {number} differs after resuming from {state}"
