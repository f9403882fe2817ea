"""Numpy dtypes as a file stores them (JSON of numpy's descr) and the checked way back from a file's text.

A dtype read from a file is parsed with a depth limit and must consist of plain little-endian numbers where
it describes data-table records: numpy must never be asked to view file bytes as objects.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from beton import bounded_json

__all__ = ["dtype_to_json", "dtype_from_json", "dtype_from_descr", "check_metadata_dtype", "MAX_DTYPE_DEPTH"]

#: Deepest nesting accepted in a stored metadata dtype's JSON (two levels per nested record).
MAX_DTYPE_DEPTH = 16
#: Kinds of the members of a metadata record: plain numbers (bool, signed, unsigned, float, complex).
METADATA_KINDS = "biufc"


def dtype_to_json(dtype: np.dtype) -> str:
    """Serialise a (structured) dtype as JSON, the form stored in field records."""
    return json.dumps(np.lib.format.dtype_to_descr(dtype))


def dtype_from_json(text: str) -> np.dtype:
    """Inverse of :func:`dtype_to_json`; raises ValueError/TypeError on text that is not a dtype."""
    return dtype_from_descr(bounded_json.loads(text, MAX_DTYPE_DEPTH))


def check_metadata_dtype(dtype: np.dtype) -> None:
    """Raise ValueError unless every member of ``dtype`` is a plain little-endian number (no objects, strings,
    datetimes or big-endian values: the data table is read as raw little-endian bytes, and numpy cannot view
    bytes as objects)."""
    if dtype.names is not None:
        for name in dtype.names:
            check_metadata_dtype(dtype.fields[name][0])
        return
    if dtype.subdtype is not None:
        check_metadata_dtype(dtype.subdtype[0])
        return
    if dtype.kind not in METADATA_KINDS or dtype.byteorder == ">":
        raise ValueError(f"metadata members must be little-endian numbers, got {dtype.str}")


def dtype_from_descr(descr: Any) -> np.dtype:
    """A dtype from its numpy descr, also when JSON has turned the descr's tuples into lists."""
    return np.lib.format.descr_to_dtype(_descr_from_json(descr))


def _descr_from_json(descr: Any) -> Any:
    # JSON turns the (name, format[, shape]) tuples of a descr into lists; numpy wants tuples back.
    if isinstance(descr, str):
        return descr
    if not isinstance(descr, list):
        raise TypeError(f"not a dtype description: {descr!r}")
    items = []
    for name, fmt, *shape in descr:
        item = (name, _descr_from_json(fmt))
        items.append(item + (tuple(shape[0]),) if shape else item)
    return items
