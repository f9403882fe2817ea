"""Fields of variable size stored as one payload: raw bytes and JSON documents."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import numpy as np

from beton import _json
from beton.errors import EncodeError
from beton.decoders.basic import BytesDecoder, JSONDecoder
from beton.fields.base import Encoded, EncodeContext, Field
from beton.pipeline.operation import Operation

# FFCV's import path ``ffcv.fields.bytes`` also holds its decoders.
__all__ = ["BytesField", "JSONField", "BytesDecoder", "JSONDecoder"]


@dataclasses.dataclass(frozen=True)
class BytesField(Field):
    """A byte string of any length per sample, read back with its exact length (``bytes``).

    Takes ``bytes``-like values and numpy arrays of any dtype and shape (their raw bytes, C order: what
    ``array.tobytes()`` gives; read them back with ``np.frombuffer(value, dtype)``).
    """

    type_name = "beton.BytesField"
    has_payload = True

    def encode(self, value: Any, context: EncodeContext) -> Encoded:
        if isinstance(value, (bytes, bytearray, memoryview)):
            return Encoded(payload=bytes(value))
        if isinstance(value, np.ndarray) and value.dtype != object:
            return Encoded(payload=value.tobytes())
        raise EncodeError(f"expected bytes or a numpy array, got {type(value).__name__}"
                          + (" of Python objects" if isinstance(value, np.ndarray) else ""))

    def default_pipeline(self) -> list[Operation]:
        return [BytesDecoder()]

    def to_python(self, metadata: np.void, payload: np.ndarray | None) -> bytes:
        return payload.tobytes()


@dataclasses.dataclass(frozen=True)
class JSONField(Field):
    """A JSON document per sample (dicts, lists, strings, numbers), stored as UTF-8 text.

    Strict JSON: NaN and infinity are refused at write time; tuples come back as lists.
    """

    type_name = "beton.JSONField"
    has_payload = True

    def encode(self, value: Any, context: EncodeContext) -> Encoded:
        try:
            text = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
            return Encoded(payload=text.encode("utf-8"))
        except (TypeError, ValueError, UnicodeEncodeError) as error:
            raise EncodeError(f"value is not JSON-serialisable: {error}") from None

    @staticmethod
    def unpack(batch: Any) -> list[Any]:
        """FFCV's ``JSONField.unpack``: a batch of JSON values as Python objects. beton's JSONDecoder already
        gives a list of values (returned as a list); FFCV's padded uint8 rows (NUL-terminated) are parsed."""
        if isinstance(batch, np.ndarray) and batch.dtype == np.uint8 and batch.ndim == 2:
            return [_json.decode_payload(row.tobytes().split(b"\0", 1)[0]) for row in batch]
        return list(batch)

    def default_pipeline(self) -> list[Operation]:
        return [JSONDecoder()]

    def to_python(self, metadata: np.void, payload: np.ndarray | None) -> Any:
        return _json.decode_payload(payload.tobytes())
