"""A Loader's resume state: what ``state_dict()`` records, and how ``load_state_dict()`` reads and checks it.

The state is a plain dict of numbers and strings (it goes into checkpoints):

==========================================  =====================================================================
``seed``, ``epoch``                         the epoch's order and augmentations
``position``                                batches every rank had received of the epoch's current plan
``world_size``, ``batch_size``,             the plan ``position`` counts in
``drop_last``
``resumed``                                 earlier plans of the same epoch, oldest first, as
                                            ``[world_size, batch_size, drop_last, position]``: an epoch resumed
                                            under another world size or batch size goes on with what they left
                                            (:mod:`beton.order.remainder`)
``samples``                                 real samples of the epoch received across all ranks (padding not
                                            counted): how far the epoch went, whatever the plans
``dataset``, ``indices``, ``order``         what the numbers mean something for: the files' content (not their
                                            path), the selected samples, the order and its settings
==========================================  =====================================================================

A state from another dataset, selection, order or seed is refused (:class:`~beton.errors.ResumeError`, naming
what differs) rather than resumed into other samples. One from another world size, batch size or ``drop_last``
goes on exactly: the rest of the epoch, each remaining sample once across the new ranks.
"""

from __future__ import annotations

import dataclasses
import hashlib
import numbers
from collections.abc import Mapping
from typing import Any

import numpy as np

from beton.errors import ResumeError
from beton.order.remainder import Interruption

__all__ = ["ResumeState", "Identity", "describe_order", "indices_digest"]


@dataclasses.dataclass(frozen=True)
class Identity:
    """What a state is valid for: the dataset's content digest, the selected samples' digest, the order."""

    dataset: str
    indices: str
    order: str


@dataclasses.dataclass(frozen=True)
class ResumeState:
    """A parsed ``state_dict()`` (see the module docstring)."""

    seed: int
    epoch: int
    position: int
    samples: int
    plan: Interruption  # the current plan (world size, batch size, drop_last) and ``position`` in it
    resumed: tuple[Interruption, ...]
    identity: Identity

    def to_dict(self) -> dict[str, Any]:
        plan = self.plan
        return {"seed": self.seed, "epoch": self.epoch, "position": self.position, "samples": self.samples,
                "world_size": plan.world_size, "batch_size": plan.batch_size, "drop_last": plan.drop_last,
                "resumed": [[cut.world_size, cut.batch_size, cut.drop_last, cut.position] for cut in self.resumed],
                **dataclasses.asdict(self.identity)}

    @classmethod
    def parse(cls, state: Any) -> ResumeState:
        """``state`` checked for every key and type (ResumeError naming the first problem)."""
        if not isinstance(state, Mapping):
            raise ResumeError(f"load_state_dict takes the dict state_dict() returned, got {type(state).__name__}")
        missing = [key for key in _KEYS if key not in state]
        if missing:
            raise ResumeError(f"the state has no {', '.join(map(repr, missing))}: load_state_dict takes the dict "
                              f"a Loader's state_dict() returned, with the keys {', '.join(_KEYS)}")
        unknown = sorted(set(state) - set(_KEYS))
        if unknown:
            raise ResumeError(f"the state has keys a Loader's state_dict() does not write: {unknown}")
        resumed = state["resumed"]
        if not isinstance(resumed, (list, tuple)) or not all(
                isinstance(cut, (list, tuple)) and len(cut) == len(_CUT_KEYS) for cut in resumed):
            raise ResumeError(f"the state's 'resumed' must be a list of [world_size, batch_size, drop_last, "
                              f"position], got {resumed!r:.200}")
        cuts = tuple(_interruption(dict(zip(_CUT_KEYS, cut)), first_position=1) for cut in resumed)
        texts = [state[key] for key in ("dataset", "indices", "order")]
        if not all(isinstance(text, str) for text in texts):
            raise ResumeError("the state's 'dataset', 'indices' and 'order' must be strings")
        if not _is_int(state["seed"]):
            raise ResumeError(f"the state's 'seed' must be an integer, got {state['seed']!r:.100}")
        plan = _interruption(state, first_position=0)
        return cls(int(state["seed"]), _count(state, "epoch"), plan.position, _count(state, "samples"), plan, cuts,
                   Identity(*texts))

    def check(self, identity: Identity, seed: int | None) -> None:
        """ResumeError unless this state was saved over ``identity``; ``seed``: the Loader's own, when given."""
        for what, saved, here, fix in (
                ("dataset", self.identity.dataset, identity.dataset,
                 "another file or set of shards (by content, not path): resume over the files it was saved over"),
                ("indices", self.identity.indices, identity.indices,
                 "another selection of samples (indices= or filter()): select the same samples"),
                ("order", self.identity.order, identity.order, "another order: build the Loader with the same one")):
            if saved != here:
                raise ResumeError(f"this state was saved over {fix} (state's {what}: {saved}, this Loader's: {here})")
        if seed is not None and seed != self.seed:
            raise ResumeError(f"this state was saved with seed={self.seed}, this Loader has seed={seed}: build it with "
                              f"seed={self.seed}, or seed=None to take the state's")


_KEYS = ("seed", "epoch", "position", "samples", "world_size", "batch_size", "drop_last", "resumed", "dataset",
         "indices", "order")


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


_CUT_KEYS = ("world_size", "batch_size", "drop_last", "position")


#: More ranks than any job has: a state is untrusted input, and orders plan per rank (BUCKETED's steps).
_MOST_RANKS = 1 << 20


def _interruption(values: Mapping[str, Any], first_position: int) -> Interruption:
    return Interruption(_count(values, "world_size", 1, _MOST_RANKS), _count(values, "batch_size", 1),
                        _flag(values, "drop_last"), _count(values, "position", first_position))


def _count(state: Mapping[str, Any], key: str, low: int = 0, high: int | None = None) -> int:
    value = state[key]
    if not _is_int(value) or value < low or high is not None and value > high:
        bound = f"between {low} and {high}" if high is not None else f"of at least {low}"
        raise ResumeError(f"the state's {key!r} must be an integer {bound}, got {value!r:.100}")
    return int(value)


def _flag(state: Mapping[str, Any], key: str) -> bool:
    value = state[key]
    if not isinstance(value, (bool, np.bool_)):
        raise ResumeError(f"the state's {key!r} must be True or False, got {value!r:.100}")
    return bool(value)


def indices_digest(indices: np.ndarray) -> str:
    """A short digest of the selected samples, in their order."""
    return hashlib.blake2b(np.ascontiguousarray(indices, dtype="<i8").tobytes(), digest_size=8).hexdigest()


def describe_order(order: Any) -> str:
    """The order's class and its settings (attributes that are plain numbers, strings or None), e.g.
    ``beton.order.quasi_random.QuasiRandomOrder(window_pages=4)``; an FFCV TraversalOrder by its class alone (its
    attributes are the Loader's seed and shard, checked apart)."""
    traversal = getattr(order, "traversal", None)
    if traversal is not None:
        return _qualified(traversal)
    settings = ", ".join(f"{name}={value!r}" for name, value in sorted(vars(order).items())
                         if not name.startswith("_") and (value is None or isinstance(value, (bool, int, float, str))))
    return f"{_qualified(order)}({settings})"


def _qualified(value: Any) -> str:
    return f"{type(value).__module__}.{type(value).__qualname__}"
