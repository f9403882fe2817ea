"""Fields of variable size stored as one payload: raw bytes and JSON documents."""

from __future__ import annotations

import dataclasses
import json
import sys
from typing import Any

import numpy as np

from beton import bounded_json
from beton.errors import DecodeError, EncodeError
from beton.decoders.basic import BytesDecoder, JSONDecoder
from beton.fields.base import Encoded, EncodeContext, Field, answers_ffcv_encode
from beton.pipeline.operation import Operation

# FFCV's import path ``ffcv.fields.bytes`` also holds its decoders.
__all__ = ["BytesField", "JSONField", "BytesDecoder", "JSONDecoder"]


@dataclasses.dataclass(frozen=True)
class BytesField(Field):
    """A byte string of any length per sample, read back with its exact length (``bytes``).

    Takes ``bytes``-like values (anything with the buffer protocol: ``bytes``, ``bytearray``, ``memoryview``,
    ``array.array``), numpy arrays and CPU torch tensors of any dtype and shape: their raw bytes, C order (what
    ``array.tobytes()`` gives; read them back with ``np.frombuffer(value, dtype)``, or store them in a
    :class:`~beton.fields.RaggedArrayField`, which keeps dtype and row shape). Text must be encoded first.

    In a Loader (see :class:`beton.decoders.BytesDecoder`), ``BytesDecoder(exact=True)``, the default, gives a
    list of ``bytes`` per batch; ``BytesDecoder()`` FFCV's uint8 rows as long as the file's longest value;
    ``BytesDecoder(max_length=n)`` a padded uint8 batch with lengths, for torch.
    """

    type_name = "beton.BytesField"
    has_payload = True

    @answers_ffcv_encode
    def encode(self, value: Any, context: EncodeContext) -> Encoded:
        if isinstance(value, np.ndarray):
            if value.dtype.hasobject:
                raise EncodeError("expected bytes or an array of numbers, got a numpy array of Python objects")
            return Encoded(payload=value.tobytes())
        torch = sys.modules.get("torch")  # a value can only be a tensor if torch is imported already
        if torch is not None and isinstance(value, torch.Tensor):
            if value.device.type != "cpu":
                raise EncodeError(f"expected a CPU tensor, got one on {value.device} (call .cpu() first)")
            return Encoded(payload=value.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
        if isinstance(value, str):
            raise EncodeError("expected bytes, got str: encode text first (value.encode('utf-8')), or use JSONField")
        try:
            return Encoded(payload=memoryview(value).tobytes())  # C order, also for non-contiguous buffers
        except TypeError:
            raise EncodeError(f"expected bytes, a buffer or an array, got {type(value).__name__}") from None

    def lengths(self, records: np.ndarray, sizes: np.ndarray | None) -> np.ndarray | None:
        return _payload_lengths(sizes)

    def default_pipeline(self) -> list[Operation]:
        return [BytesDecoder(exact=True)]

    def to_python(self, metadata: np.void, payload: np.ndarray | None) -> bytes:
        return payload.tobytes()


@dataclasses.dataclass(frozen=True)
class JSONField(Field):
    """A JSON document per sample (dicts, lists, strings, numbers), stored as UTF-8 text.

    Strict JSON: NaN and infinity are refused at write time; tuples come back as lists.
    """

    type_name = "beton.JSONField"
    has_payload = True

    @answers_ffcv_encode
    def encode(self, value: Any, context: EncodeContext) -> Encoded:
        try:
            text = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
            return Encoded(payload=text.encode("utf-8"))
        except (TypeError, ValueError, UnicodeEncodeError) as error:
            raise EncodeError(f"value is not JSON-serialisable: {error}") from None

    def lengths(self, records: np.ndarray, sizes: np.ndarray | None) -> np.ndarray | None:
        """Bytes of each document's UTF-8 text."""
        return _payload_lengths(sizes)

    @staticmethod
    def unpack(batch: Any) -> Any:
        """FFCV's ``JSONField.unpack``: what a Loader gave for a JSONField, as Python values.

        Takes ``BytesDecoder()``'s rows (a uint8 array or tensor, each document followed by a NUL, as FFCV's
        loader gives them; one row gives one value), ``JSONDecoder``'s list of values (returned as a list) or
        ``BytesDecoder(exact=True)``'s list of bytes (each parsed).
        """
        torch = sys.modules.get("torch")  # a batch can only be a tensor if torch is imported already
        if torch is not None and isinstance(batch, torch.Tensor):
            batch = batch.cpu().numpy()
        if not isinstance(batch, np.ndarray):
            return [bounded_json.decode_payload(bytes(value)) if isinstance(value, (bytes, bytearray, memoryview)) else value
                    for value in batch]
        if batch.dtype != np.uint8 or batch.ndim not in (1, 2):
            raise DecodeError(f"JSONField.unpack takes BytesDecoder's uint8 rows, got {batch.dtype} of shape "
                              f"{batch.shape}")
        values = [_document(row) for row in batch.reshape(-1, batch.shape[-1])]
        return values if batch.ndim == 2 else values[0]

    def default_pipeline(self) -> list[Operation]:
        return [JSONDecoder()]

    def to_python(self, metadata: np.void, payload: np.ndarray | None) -> Any:
        return bounded_json.decode_payload(payload.tobytes())


def _payload_lengths(sizes: np.ndarray | None) -> np.ndarray | None:
    return None if sizes is None else np.asarray(sizes, dtype=np.int64)


def _document(row: np.ndarray) -> Any:
    """The JSON value of one of BytesDecoder's rows: its text ends at the first NUL."""
    text, terminator, _ = row.tobytes().partition(b"\0")
    if not terminator:
        raise DecodeError("a row given to JSONField.unpack holds no NUL after its document: not a row of "
                          "BytesDecoder() on a JSONField")
    return bounded_json.decode_payload(text)
