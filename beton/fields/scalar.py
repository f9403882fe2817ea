"""Scalar fields: the value lives entirely in the data table, no payload."""

from __future__ import annotations

import dataclasses
import numbers
import operator
from typing import Any

import numpy as np

from beton.errors import EncodeError
from beton.decoders.basic import FloatDecoder, IntDecoder
from beton.fields.base import Encoded, EncodeContext, Field, answers_ffcv_encode
from beton.pipeline.operation import Operation
from beton.transforms.torch_ops import ToTensor

__all__ = ["IntField", "FloatField"]

_INT64 = np.iinfo(np.int64)


@dataclasses.dataclass(frozen=True)
class IntField(Field):
    """A signed 64-bit integer per sample (class labels, ids)."""

    type_name = "beton.IntField"
    metadata_dtype = np.dtype([("value", "<i8")])

    @answers_ffcv_encode
    def encode(self, value: Any, context: EncodeContext) -> Encoded:
        if isinstance(value, (float, np.floating)):
            raise EncodeError(f"expected an integer, got {type(value).__name__} {value!r}")
        try:
            integer = operator.index(value)
        except TypeError:
            raise EncodeError(f"expected an integer, got {type(value).__name__}") from None
        if not _INT64.min <= integer <= _INT64.max:
            raise EncodeError(f"expected an integer in int64 range, got {integer}")
        return Encoded(metadata=(integer,))

    def default_pipeline(self) -> list[Operation]:
        return [IntDecoder(), ToTensor()]

    def to_python(self, metadata: np.void, payload: np.ndarray | None) -> int:
        return int(metadata["value"])


@dataclasses.dataclass(frozen=True)
class FloatField(Field):
    """A 64-bit float per sample (regression targets, weights)."""

    type_name = "beton.FloatField"
    metadata_dtype = np.dtype([("value", "<f8")])

    @answers_ffcv_encode
    def encode(self, value: Any, context: EncodeContext) -> Encoded:
        if not isinstance(value, numbers.Real) or isinstance(value, (bool, np.bool_)):
            raise EncodeError(f"expected a real number, got {type(value).__name__}")
        return Encoded(metadata=(float(value),))

    def default_pipeline(self) -> list[Operation]:
        return [FloatDecoder(), ToTensor()]

    def to_python(self, metadata: np.void, payload: np.ndarray | None) -> float:
        return float(metadata["value"])
