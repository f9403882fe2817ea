"""File-level metadata: one JSON object describing the whole dataset (its name, class names, source, license).

Written by ``DatasetWriter(..., metadata={...})`` into the metadata table (see
:mod:`beton.storage.format`) and read back as ``Reader.metadata``. Both directions check the same rules, so a
file that one beton writes, any beton that knows its version opens:

* a JSON object (a mapping with string keys at the top), strict JSON (no NaN or infinity), UTF-8;
* at most :data:`~beton.storage.format.MAX_METADATA_BYTES` bytes and :data:`beton.bounded_json.MAX_JSON_DEPTH` levels
  deep, so that reading it costs at most what the file holds and never exhausts the stack.

An empty mapping is no metadata: the table then holds ``{}``, byte for byte as without it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import numpy as np

from beton import bounded_json
from beton.errors import FieldError, FormatError
from beton.storage import format as fmt

__all__ = ["encode_metadata", "decode_metadata"]


def encode_metadata(metadata: Mapping[str, Any] | None) -> bytes | None:
    """The metadata table's bytes (compact UTF-8 JSON), or None for no metadata (None or an empty mapping).

    Raises FieldError, naming the problem, for anything a reader would refuse.
    """
    if metadata is None:
        return None
    if not isinstance(metadata, Mapping):
        raise FieldError(f"metadata must be a mapping (a JSON object), got {type(metadata).__name__}")
    if not metadata:
        return None
    bad_keys = [key for key in metadata if not isinstance(key, str)]
    if bad_keys:
        raise FieldError(f"metadata keys must be strings, got {bad_keys[0]!r}")
    try:
        text = json.dumps(dict(metadata), ensure_ascii=False, allow_nan=False, separators=(",", ":"))
        blob = text.encode("utf-8")
    except (TypeError, ValueError, UnicodeEncodeError, RecursionError) as error:
        raise FieldError(f"metadata is not strict JSON: {error}") from None
    if len(blob) > fmt.MAX_METADATA_BYTES:
        raise FieldError(f"metadata is {len(blob)} bytes of JSON, more than the {fmt.MAX_METADATA_BYTES} a file "
                         "holds; store per-sample data in a field")
    depth = bounded_json.nesting_depth(blob)
    if depth > bounded_json.MAX_JSON_DEPTH:
        raise FieldError(f"metadata nests {depth} levels deep, more than the {bounded_json.MAX_JSON_DEPTH} readers accept")
    return blob


def decode_metadata(blob: bytes | np.ndarray) -> dict[str, Any]:
    """The metadata object stored in ``blob`` (bytes, or a uint8 view of the file); FormatError when it breaks
    a rule of the module docstring. Reading accepts what Python's json parses (NaN and infinity included)."""
    if len(blob) > fmt.MAX_METADATA_BYTES:
        raise FormatError(f"metadata table is {len(blob)} bytes, more than the {fmt.MAX_METADATA_BYTES} allowed")
    try:
        value = bounded_json.loads(blob)
    except ValueError as error:  # UnicodeDecodeError, JSONDecodeError, too deep, too many digits
        raise FormatError(f"metadata table is not valid JSON: {error}") from None
    if not isinstance(value, dict):
        raise FormatError(f"metadata table holds a JSON {type(value).__name__}, expected an object")
    return value
