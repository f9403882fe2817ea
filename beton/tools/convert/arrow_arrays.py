"""Arrow list columns of numbers as numpy arrays: one fixed shape (NDArrayField) or a varying first dimension
(RaggedArrayField).

A column's *layout* is the numpy dtype and shape its values take, read from the Arrow type (fixed-size lists
nest into fixed dimensions, a variable-length list at the top is the ragged dimension) or from a Hugging Face
``Array2D..5D`` feature, whose first dimension may be ``None``. Lists whose inner lengths vary, of strings, or
of anything but integers, floats and booleans have no layout: they are stored as JSON.

Values are converted a record batch at a time: one vectorised copy when the batch has no null (at any depth)
and every inner list has its dimension's length, else row by row, so that a bad row is named with what is
wrong with it: a null list is ``None`` (the caller decides), a null item or an inner list of the wrong length
is a :class:`BadValue`. Nothing is cast beyond the column's own type, except to a Hugging Face feature's dtype,
and then only values that fit it (:func:`fitted`): a value the feature's dtype cannot hold is a BadValue naming
the item, never wrapped (258 as uint8 is not 2), truncated (1.5 as int32 is not 1) or taken for a truth value (2
as bool is not True).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["HF_ARRAYS", "BadValue", "fixed_layout", "ragged_layout", "fixed_arrays", "ragged_arrays", "fitted"]

#: Hugging Face ``datasets`` features holding n-dimensional arrays.
HF_ARRAYS = ("Array2D", "Array3D", "Array4D", "Array5D")

Layout = tuple[np.dtype, tuple[int | None, ...]]  # dtype, shape; a None first dimension is ragged


class BadValue:
    """A value the converter refuses, and why (the caller adds the column's name)."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


def fixed_layout(arrow_type: Any, feature: dict | None, pa: Any) -> Layout | None:
    """(dtype, shape) of a column of fixed-shape arrays: fixed-size lists of numbers, or an ArrayND feature with
    every dimension given."""
    layout = _layout(arrow_type, feature, pa)
    if layout is None or layout[1][0] is None:
        return None
    return layout


def ragged_layout(arrow_type: Any, feature: dict | None, pa: Any) -> Layout | None:
    """(dtype, (None, *row)) of a column of arrays whose first dimension varies: variable-length lists of numbers
    or of fixed-size lists of numbers, an ArrayND feature with a ``None`` first dimension; also any fixed layout
    (``types={"column": "ragged"}``). None when rows would hold no bytes (a RaggedArrayField needs some)."""
    layout = _layout(arrow_type, feature, pa)
    if layout is None or math.prod(layout[1][1:]) == 0:  # type: ignore[arg-type]
        return None
    return layout[0], (None, *layout[1][1:])


def _layout(arrow_type: Any, feature: dict | None, pa: Any) -> Layout | None:
    arrow_type = _storage_type(arrow_type, pa)
    if feature and feature.get("_type") in HF_ARRAYS:  # shape and dtype from the feature, checked against the type
        shape, dtype = feature.get("shape"), feature.get("dtype")
        if not (isinstance(shape, list) and shape and isinstance(dtype, str)
                and all(isinstance(dim, int) and not isinstance(dim, bool) and dim >= 0 for dim in shape[1:])
                and (shape[0] is None or (isinstance(shape[0], int) and not isinstance(shape[0], bool)
                                          and shape[0] >= 0))):
            return None
        try:
            resolved = np.dtype(dtype)
        except TypeError:
            return None
        depth, leaf = 0, arrow_type
        while _is_list(leaf, pa):
            depth, leaf = depth + 1, leaf.value_type
        if resolved.kind not in "biuf" or depth != len(shape) or not _is_number(leaf, pa):
            return None
        return resolved, tuple(shape)
    if pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type):
        shape: list[int | None] = [None]
        arrow_type = arrow_type.value_type
    elif pa.types.is_fixed_size_list(arrow_type):
        shape = []
    else:
        return None
    while pa.types.is_fixed_size_list(arrow_type):
        shape.append(arrow_type.list_size)
        arrow_type = arrow_type.value_type
    if not _is_number(arrow_type, pa):
        return None
    return np.dtype(arrow_type.to_pandas_dtype()), tuple(shape)


def _storage_type(arrow_type: Any, pa: Any) -> Any:
    """The type an extension type (a Hugging Face ArrayND when ``datasets`` is imported) stores its data as."""
    return arrow_type.storage_type if isinstance(arrow_type, pa.ExtensionType) else arrow_type


def _is_list(arrow_type: Any, pa: Any) -> bool:
    return pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type) or \
        pa.types.is_fixed_size_list(arrow_type)


def _is_number(arrow_type: Any, pa: Any) -> bool:
    return pa.types.is_integer(arrow_type) or pa.types.is_floating(arrow_type) or pa.types.is_boolean(arrow_type)


def fixed_arrays(column: Any, dtype: np.dtype, shape: tuple[int, ...], pa: Any) -> list[Any]:
    """One array of ``shape`` per row (``None`` for a null row, :class:`BadValue` for a malformed one)."""
    column = _storage(column, pa)
    flat = _flatten(column, shape, dtype, pa)
    if flat is not None:
        return list(flat.reshape((len(column), *shape)))
    return [None if value is None else _array(value, dtype, shape) for value in column.to_pylist()]


def ragged_arrays(column: Any, dtype: np.dtype, row: tuple[int, ...], pa: Any) -> list[Any]:
    """One array of shape ``(length, *row)`` per row (``None`` for a null list, :class:`BadValue` for a
    malformed one)."""
    column = _storage(column, pa)
    if not len(column):
        return []
    offsets, values = _list_parts(column, pa)
    flat = _flatten(values.slice(offsets[0], offsets[-1] - offsets[0]), row, dtype, pa)
    if flat is not None:
        offsets = offsets - offsets[0]
        valid = column.is_valid().to_numpy(zero_copy_only=False)
        return [flat[offsets[i]:offsets[i + 1]] if valid[i] else None for i in range(len(column))]
    # a null somewhere (perhaps only behind a null list) or inner lists of other lengths: find it row by row
    return [None if value is None else _array(value, dtype, (None, *row)) for value in column.to_pylist()]


def _storage(column: Any, pa: Any) -> Any:
    return column.storage if isinstance(column.type, pa.ExtensionType) else column


def _list_parts(column: Any, pa: Any) -> tuple[np.ndarray, Any]:
    """(offsets, values): row i's items are ``values[offsets[i]:offsets[i + 1]]``, for any list type."""
    if pa.types.is_fixed_size_list(column.type):  # .values ignores the slice offset, as offsets here count it
        size = column.type.list_size
        return (column.offset + np.arange(len(column) + 1, dtype=np.int64)) * size, column.values
    return np.asarray(column.offsets, dtype=np.int64), column.values


def _flatten(values: Any, shape: tuple[int, ...], dtype: np.dtype, pa: Any) -> np.ndarray | None:
    """``values``, lists nested ``len(shape)`` deep, as one array of shape ``(len(values), *shape)``; None when a
    null is among them or a list's length is not its dimension's."""
    for size in shape:
        if values.null_count:
            return None
        offsets, items = _list_parts(values, pa)
        if len(values) and not (np.diff(offsets) == size).all():
            return None
        values = items.slice(offsets[0], offsets[-1] - offsets[0]) if len(values) else items.slice(0, 0)
    if values.null_count:
        return None
    converted, bad = fitted(values.to_numpy(zero_copy_only=False), dtype)
    if bad is not None and bad.any():  # found and named row by row
        return None
    return converted.reshape((-1, *shape))


def _array(value: list, dtype: np.dtype, shape: tuple[int | None, ...]) -> np.ndarray | BadValue:
    """A Python list (a row's value) as an array of ``shape`` (a None dimension takes any length), or why not."""
    problem = _shape_problem(value, shape, ())
    if problem is not None:
        return BadValue(problem)
    if not value:  # no rows: nothing tells numpy the row shape
        return np.zeros((0, *shape[1:]), dtype)  # type: ignore[arg-type]
    raw = np.array(value)  # the values' own type (the column's), then checked into the field's
    converted, bad = fitted(raw, dtype)
    if bad is not None and bad.any():
        where = tuple(int(index) for index in np.argwhere(bad)[0])
        return BadValue(f"item {''.join(f'[{index}]' for index in where)} holds {raw[where].item()!r}, which the declared "
                        f"dtype {dtype} cannot hold")
    return converted


def fitted(raw: np.ndarray, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray | None]:
    """``raw`` as ``dtype``, and the mask of values that do not fit it (None when all do by their type alone).

    An integer or bool dtype takes only values it holds exactly: integers within its range, floats that are
    whole numbers within it, and for bool only 0 and 1. A float dtype takes any number within its range, rounded
    to its precision (NaN and infinities stay what they are; a finite value that would become infinite does not
    fit)."""
    dtype = np.dtype(dtype)
    if raw.dtype == dtype:
        return raw, None
    with np.errstate(invalid="ignore", over="ignore"):
        if dtype.kind == "b":
            bad = ~((raw == 0) | (raw == 1))
            return raw != 0, bad
        converted = raw.astype(dtype)
        if dtype.kind == "f":
            return converted, np.isfinite(raw) & ~np.isfinite(converted)
        info = np.iinfo(dtype)
        if raw.dtype.kind == "b":
            return converted, None
        if raw.dtype.kind == "f":  # the bounds as floats are exact: powers of two (or zero)
            return converted, ~np.isfinite(raw) | (raw != np.trunc(raw)) | (raw < float(info.min)) | \
                (raw >= float(info.max) + 1.0)
        source = np.iinfo(raw.dtype)  # integers: the bounds within the source's range, in its type
        low, high = max(info.min, source.min), min(info.max, source.max)
        return converted, (raw < raw.dtype.type(low)) | (raw > raw.dtype.type(high))


def _shape_problem(value: Any, shape: tuple[int | None, ...], where: tuple[int, ...]) -> str | None:
    name = "the list" if not where else "item " + "".join(f"[{index}]" for index in where)
    if value is None:
        return f"{name} is null"
    if not shape:
        return None
    if shape[0] is not None and len(value) != shape[0]:
        return f"{name} has {len(value)} items where the column's arrays have {shape[0]}"
    for index, item in enumerate(value):
        problem = _shape_problem(item, shape[1:], (*where, index))
        if problem is not None:
            return problem
    return None
