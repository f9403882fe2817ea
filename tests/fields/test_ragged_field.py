"""RaggedArrayField: what it accepts, what comes back, and what a hostile file's lengths cannot do."""

from __future__ import annotations

import array

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import beton
from beton import Loader
from beton.decoders import RaggedDecoder
from beton.errors import EncodeError, FieldError, PipelineError
from beton.fields import BytesField, IntField, NDArrayField, RaggedArrayField, TorchTensorField
from beton.fields.base import EncodeContext
from beton.tools.cli import describe

from conftest import write
from strategies import NDARRAY_DTYPES, ragged_fields

CONTEXT = EncodeContext(0, 0, 0)


@pytest.mark.parametrize("shape", [(None,), (-1,), (None, 4), (-1, 3, 2)])
def test_a_varying_first_dimension_in_ndarray_field_points_to_ragged_array_field(shape):
    with pytest.raises(FieldError, match=r"RaggedArrayField\(dtype, "):
        NDArrayField(np.int32, shape)
    with pytest.raises(FieldError, match="RaggedArrayField"):
        TorchTensorField("int32", shape)
    assert RaggedArrayField(np.int32, shape).shape == (None, *shape[1:])  # the same spelling works there


@pytest.mark.parametrize("shape, words", [
    ((4,), "starts with None"), ((), "starts with None"), ((None, None), "only the first"),
    ((None, -1), "only the first"), ((None, 2.5), "only the first"), ((None, 0), "hold no bytes"),
    (5, "sequence"),
])
def test_shapes_it_refuses(shape, words):
    with pytest.raises(FieldError, match=words):
        RaggedArrayField(np.float32, shape)


def test_dtypes_it_refuses():
    with pytest.raises(FieldError):
        RaggedArrayField(object, (None,))
    with pytest.raises(FieldError):
        RaggedArrayField("not a dtype", (None,))


@pytest.mark.parametrize("value", [
    np.zeros((3,), np.int64),  # wrong dtype
    np.zeros((3, 2), np.int32),  # wrong row shape
    np.zeros((), np.int32),  # no first dimension
    [1, 2, 3],  # not an array: never cast
    torch.zeros(3, dtype=torch.int32),
])
def test_values_that_do_not_fit_are_refused(value):
    with pytest.raises(EncodeError):
        RaggedArrayField(np.int32, (None,)).encode(value, CONTEXT)


def test_an_empty_array_is_a_sample_of_length_zero_whatever_its_row_shape():
    field = RaggedArrayField(np.float32, (None, 4))
    assert field.encode(np.array([], np.float32), CONTEXT).metadata == (0,)
    assert field.encode(np.zeros((0, 4), np.float32), CONTEXT).metadata == (0,)
    with pytest.raises(EncodeError):
        field.encode(np.zeros((3, 0), np.float32), CONTEXT)


@pytest.mark.parametrize("dtype", NDARRAY_DTYPES)
@given(data=st.data())
def test_every_dtype_and_row_shape_reads_back_and_loads_padded(tmp_path_factory, dtype, data):
    row = data.draw(st.sampled_from([(), (1,), (4,), (2, 3)]))
    lengths = data.draw(st.lists(st.integers(0, 9), min_size=1, max_size=12))
    raw = data.draw(st.binary(min_size=sum(lengths) * int(np.prod(row)) * np.dtype(dtype).itemsize,
                              max_size=sum(lengths) * int(np.prod(row)) * np.dtype(dtype).itemsize))
    flat = np.frombuffer(raw, dtype).reshape(-1, *row) if raw else np.zeros((0, *row), dtype)
    values = np.split(flat, np.cumsum(lengths)[:-1])
    path = write(tmp_path_factory.mktemp("ragged") / "r.beton", {"x": RaggedArrayField(dtype, (None, *row))},
                 [(v,) for v in values])
    with beton.Reader(path) as reader:
        for index, value in enumerate(values):
            (read,) = reader[index]
            assert read.dtype == np.dtype(dtype) and read.shape == value.shape
            assert read.tobytes() == value.tobytes()  # bits: NaNs and signed zeros compare as stored
    capacity = max(lengths) or 1
    with Loader(path, batch_size=5, num_workers=1, pipelines={"x": [RaggedDecoder(capacity)]}) as loader:
        batches = list(loader)
    padded_values = [padded for batch, in batches for padded in batch.values]  # no concatenate: it makes dtypes native
    assert np.concatenate([batch.lengths for batch, in batches]).tolist() == lengths
    for value, padded in zip(values, padded_values):
        assert padded.dtype == np.dtype(dtype) and padded.shape == (capacity, *row)
        assert padded[: len(value)].tobytes() == value.tobytes()
        assert not padded[len(value):].view(np.uint8).any()  # pad_value 0: zero bytes


@given(pair=ragged_fields(max_length=20), count=st.integers(0, 6), data=st.data())
def test_hypothesis_datasets_of_ragged_fields_read_back(tmp_path_factory, pair, count, data):
    field, values = pair
    samples = [(data.draw(values),) for _ in range(count)]
    path = write(tmp_path_factory.mktemp("hyp") / "h.beton", {"r": field}, samples)
    with beton.Reader(path) as reader:
        assert reader.fields["r"] == field
        for index, (value,) in enumerate(samples):
            assert reader[index][0].tobytes() == value.tobytes()
            assert reader[index][0].shape == value.shape
            assert int(reader.data_table["r"]["length"][index]) == len(value)
    beton.verify(path)


def test_lengths_live_in_the_data_table_and_beton_info_shows_them(tmp_path):
    lengths = [0, 3, 1, 100, 7]
    path = write(tmp_path / "l.beton", {"t": RaggedArrayField(np.int16, (None,)), "i": IntField()},
                 [(np.arange(n, dtype=np.int16), n) for n in lengths])
    with beton.Reader(path) as reader:
        assert reader.data_table["t"]["length"].tolist() == lengths
        assert reader.fields["t"].lengths(reader.data_table["t"], None).tolist() == lengths
        text = describe(reader)
    assert "lengths (rows): min 0, median 3, 99th percentile 96.28, max 100" in text


def test_a_ragged_field_has_no_default_pipeline_but_says_which_to_give(tmp_path):
    path = write(tmp_path / "d.beton", {"t": RaggedArrayField(np.int32, (None,))}, [(np.arange(3, dtype=np.int32),)])
    with pytest.raises(PipelineError, match=r"RaggedDecoder\(max_length=\.\.\.\)"):
        Loader(path, batch_size=2)


def test_files_without_ragged_fields_keep_their_layout(tmp_path):
    """NDArrayField keeps its empty record: files that do not use the new field are byte-identical."""
    assert NDArrayField(np.int32, (3,)).metadata_dtype == np.dtype([])
    assert RaggedArrayField(np.int32, (None,)).metadata_dtype == np.dtype([("length", "<i8")])


# ---- BytesField takes any array or buffer ----------------------------------------------------------------


@pytest.mark.parametrize("value, expected", [
    (b"abc", b"abc"),
    (bytearray(b"\x00\x01"), b"\x00\x01"),
    (memoryview(b"abcdef")[::2], b"ace"),  # a non-contiguous buffer: its bytes in order
    (array.array("i", [1, 2]), np.array([1, 2], np.int32).tobytes()),
    (np.arange(6, dtype=np.int32).reshape(2, 3).T, np.arange(6, dtype=np.int32).reshape(2, 3).T.tobytes()),
    (torch.arange(4, dtype=torch.int16), np.arange(4, dtype=np.int16).tobytes()),
    (torch.ones(2, dtype=torch.bfloat16), np.array([0x3F80, 0x3F80], "<u2").tobytes()),
    (torch.arange(6, dtype=torch.int32).reshape(2, 3).T, np.arange(6, dtype=np.int32).reshape(2, 3).T.tobytes()),
])
def test_bytes_field_takes_any_array_or_buffer(value, expected):
    assert BytesField().encode(value, CONTEXT).payload == expected


@pytest.mark.parametrize("value, words", [("text", "encode text first"), (np.array([object()]), "Python objects"),
                                          (3, "got int")])
def test_bytes_field_refuses_what_has_no_bytes(value, words):
    with pytest.raises(EncodeError, match=words):
        BytesField().encode(value, CONTEXT)
