"""Hypothesis strategies: fields paired with values that fit them, and whole datasets."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from beton.fields import BytesField, FloatField, IntField, JSONField, NDArrayField, RaggedArrayField, TorchTensorField
from beton.fields.ndarray import TORCH_DTYPES

#: numpy dtypes NDArrayField round-trips; tests are parametrised from this table.
NDARRAY_DTYPES = ("|u1", "|i1", "<u2", "<i2", "<u4", "<i4", "<u8", "<i8", ">u8", "<f2", "<f4", "<f8", ">f4", "|b1",
                  "<c8", "<c16", np.dtype(np.longdouble).str, np.dtype(np.clongdouble).str)
#: (tests/fields/test_ndarray_dtypes.py has the full table, non-numbers included, with what a Loader gives for each)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)

shapes = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5)


@st.composite
def ndarray_fields(draw):
    dtype = np.dtype(draw(st.sampled_from(NDARRAY_DTYPES)))
    shape = draw(shapes)
    return NDArrayField(dtype, shape), hnp.arrays(dtype, shape)


@st.composite
def torch_fields(draw):
    name = draw(st.sampled_from(sorted(TORCH_DTYPES)))
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=2, min_side=0, max_side=4))
    storage = np.dtype(TORCH_DTYPES[name])

    def to_tensor(array):
        return torch.from_numpy(array.copy()).view(getattr(torch, name))

    return TorchTensorField(getattr(torch, name), shape), hnp.arrays(storage, shape).map(to_tensor)


#: Row shapes of ragged arrays: scalars (tokens, audio) and small fixed rows (boxes, frames of features).
row_shapes = hnp.array_shapes(min_dims=0, max_dims=2, min_side=1, max_side=4)


@st.composite
def ragged_fields(draw, max_length: int = 6):
    """A RaggedArrayField of any dtype NDArrayField stores, with values of 0..max_length rows."""
    dtype = np.dtype(draw(st.sampled_from(NDARRAY_DTYPES)))
    row = draw(row_shapes)
    values = st.integers(0, max_length).flatmap(lambda length: hnp.arrays(dtype, (length, *row)))
    return RaggedArrayField(dtype, (None, *row)), values


def bytes_fields(max_size: int):
    return st.just((BytesField(), st.binary(max_size=max_size)))


#: A field together with a strategy for its values.
field_and_values = st.one_of(
    st.just((IntField(), st.integers(-(2**63), 2**63 - 1))),
    st.just((FloatField(), st.floats(allow_nan=False) | st.integers(-(2**53), 2**53))),
    ndarray_fields(),
    torch_fields(),
    ragged_fields(),
    bytes_fields(3000),
    st.just((JSONField(), json_values)),
)

field_names = st.text(min_size=1, max_size=40).filter(lambda name: "\x00" not in name)


@st.composite
def datasets(draw, max_fields: int = 6, max_samples: int = 12):
    """(fields mapping, list of sample tuples)."""
    names = draw(st.lists(field_names, min_size=1, max_size=max_fields, unique=True))
    pairs = [draw(field_and_values) for _ in names]
    fields = {name: field for name, (field, _) in zip(names, pairs)}
    rows = st.tuples(*(values for _, values in pairs))
    samples = draw(st.lists(rows, min_size=0, max_size=max_samples))
    return fields, samples
