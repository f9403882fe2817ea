"""One output of a Loader, named apart from the field it reads (FFCV's ``PipelineSpec``): what lets a file's field
give several outputs, such as two augmented views of one image."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

__all__ = ["PipelineSpec"]


@dataclasses.dataclass(frozen=True, init=False)
class PipelineSpec:
    """An output reading the stored field ``source`` (its name), decoded by ``decoder`` and then transformed by
    ``transforms``, for ``Loader(pipelines={output name: PipelineSpec(...)})``.

    As FFCV's: with no ``decoder``, the transforms' first operation decodes if it is a decoder, else the field's
    default decoder does; with neither a decoder nor transforms, the output is the field's default pipeline
    (its decoder, then ``ToTensor``). Outputs named after none of the file's fields come after the fields'
    outputs, in the order given. Each output decodes on its own, and random operations draw per output: two
    views of one image get two crops. FFCV's other ``source``, an operation of another pipeline (a branch that
    shares that operation's result), is refused by the Loader rather than run as two draws.
    """

    source: Any
    decoder: Any
    transforms: tuple[Any, ...]

    def __init__(self, source: Any, decoder: Any = None, transforms: Sequence[Any] | None = None) -> None:
        object.__setattr__(self, "source", source)
        object.__setattr__(self, "decoder", decoder)
        object.__setattr__(self, "transforms", tuple(transforms or ()))  # the user's list is read, never kept

    def operations(self) -> list[Any]:
        """The decoder (if given) and the transforms, as given."""
        return ([] if self.decoder is None else [self.decoder]) + list(self.transforms)
