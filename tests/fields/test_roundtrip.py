"""Every field written and read back: values equal what was written, for any shape, size and name."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import beton
from beton.fields import BytesField, IntField, JSONField, NDArrayField

from conftest import write
from strategies import NDARRAY_DTYPES, datasets


def assert_same(expected, actual):
    if isinstance(expected, np.ndarray):
        assert isinstance(actual, np.ndarray) and actual.dtype == expected.dtype
        np.testing.assert_array_equal(actual, expected)
    elif isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor) and actual.dtype == expected.dtype
        assert actual.shape == expected.shape
        # Compare bits, so that NaNs and signed zeros count as equal only when identical.
        assert actual.numpy().tobytes() == expected.numpy().tobytes() if actual.dtype != torch.bfloat16 \
            else torch.equal(actual.view(torch.int16), expected.view(torch.int16))
    elif isinstance(expected, float):
        assert actual == expected or (np.isnan(actual) and np.isnan(expected))
    else:
        assert actual == expected and type(actual) is type(expected)


def json_normalised(value):
    """What JSON gives back: tuples become lists, integral floats stay floats."""
    if isinstance(value, (list, tuple)):
        return [json_normalised(item) for item in value]
    if isinstance(value, dict):
        return {key: json_normalised(item) for key, item in value.items()}
    return value


@given(dataset=datasets(), page_size=st.sampled_from([256, 1024, 4096]))
def test_any_dataset_reads_back_exactly(tmp_path_factory, dataset, page_size):
    fields, samples = dataset
    path = write(tmp_path_factory.mktemp("rt") / "data.beton", fields, samples, page_size=page_size)
    with beton.Reader(path) as reader:
        assert reader.num_samples == len(samples)
        assert list(reader.fields) == list(fields)
        assert reader.fields == fields
        for index, sample in enumerate(samples):
            for field, expected, actual in zip(fields.values(), sample, reader[index]):
                if isinstance(field, JSONField):
                    expected = json_normalised(expected)
                elif isinstance(field, IntField):
                    expected = int(expected)
                elif isinstance(expected, int) and not isinstance(field, IntField):
                    expected = float(expected)
                assert_same(expected, actual)
    beton.verify(path)


@pytest.mark.parametrize("dtype", NDARRAY_DTYPES)
def test_every_ndarray_dtype(tmp_path, dtype):
    rng = np.random.default_rng(0)
    arrays = [(rng.integers(0, 2, (2, 3)) * i).astype(dtype) for i in range(3)]
    path = write(tmp_path / "a.beton", {"x": NDArrayField(dtype, (2, 3))}, [(a,) for a in arrays])
    with beton.Reader(path) as reader:
        for index, array in enumerate(arrays):
            assert_same(array, reader[index][0])


@pytest.mark.parametrize("size", [0, 1, 255, 256, 257, 1023, 1024, 1025, 5000])
def test_payload_sizes_around_page_size(tmp_path, size):
    """0 bytes, exactly a page, and payloads spanning several consecutive pages."""
    payloads = [bytes([i % 251]) * size for i in range(4)] + [b"tail"]
    path = write(tmp_path / "b.beton", {"blob": BytesField()}, [(p,) for p in payloads], page_size=256)
    with beton.Reader(path) as reader:
        assert [reader[i][0] for i in range(len(payloads))] == payloads
        offsets = reader.allocation_table[:, 0]["offset"] - reader.heap_offset
        sizes = reader.allocation_table[:, 0]["size"]
        for offset, length in zip(offsets, sizes):
            if 0 < length <= 256:  # small payloads never cross a page boundary
                assert offset // 256 == (offset + length - 1) // 256
            elif length > 256:  # large ones start a page
                assert offset % 256 == 0
    beton.verify(path)


@settings(max_examples=10)
@given(num_fields=st.integers(1, 40))
def test_many_fields_with_unicode_names(tmp_path_factory, num_fields):
    fields = {f"поле {i} 🐟 " + "x" * (i * 3): IntField() for i in range(num_fields)}
    samples = [tuple(range(k, k + num_fields)) for k in range(3)]
    path = write(tmp_path_factory.mktemp("many") / "m.beton", fields, samples)
    with beton.Reader(path) as reader:
        assert list(reader.fields) == list(fields)  # full names, no truncation
        assert [reader[k] for k in range(3)] == samples


def test_empty_and_single_sample_files(tmp_path):
    for count in (0, 1):
        path = write(tmp_path / f"{count}.beton", {"b": BytesField(), "i": IntField()},
                     [(b"abc", 5)][:count])
        with beton.Reader(path) as reader:
            assert len(reader) == count
            assert reader.num_pages == count
            if count:
                assert reader[0] == (b"abc", 5)
                assert reader[-1] == (b"abc", 5)
            with pytest.raises(IndexError):
                reader[count]
        beton.verify(path)


def test_data_table_is_a_read_only_structured_array(mixed_file):
    with beton.Reader(mixed_file) as reader:
        table = reader.data_table
        assert table.dtype.names == ("label", "score", "arr", "blob", "meta")
        np.testing.assert_array_equal(table["label"]["value"], np.arange(60))
        with pytest.raises(ValueError):
            table["label"]["value"][0] = 5


def test_ffcv_value_habits_an_ndarray_of_size_one_dims_and_any_array_as_bytes(tmp_path):
    fields = {"y": NDArrayField(np.float32, (1,)), "pair": NDArrayField(np.int16, (2, 1)), "blob": BytesField()}
    samples = [(np.float32(i / 2), np.array([i, -i], np.int16), np.arange(i, dtype=np.int32)) for i in range(5)]
    path = write(tmp_path / "f.beton", fields, samples)
    with beton.Reader(path) as reader:
        for i, (y, pair, blob) in enumerate(reader[j] for j in range(5)):
            assert y.shape == (1,) and y[0] == np.float32(i / 2)
            np.testing.assert_array_equal(pair, [[i], [-i]])
            np.testing.assert_array_equal(np.frombuffer(blob, np.int32), np.arange(i))
    for value in (np.zeros(2, np.float32), np.float64(1.0)):  # other sizes and dtypes stay errors
        with pytest.raises(beton.EncodeError, match="expected an array of dtype"):
            write(tmp_path / "bad.beton", {"y": NDArrayField(np.float32, (1,))}, [(value,)])
    with pytest.raises(beton.EncodeError, match="Python objects"):
        write(tmp_path / "bad.beton", {"b": BytesField()}, [(np.array([{}], dtype=object),)])


def test_json_field_unpack_takes_beton_batches_and_ffcv_padded_rows():
    from beton.fields import JSONField

    assert JSONField.unpack([{"a": 1}, [2]]) == [{"a": 1}, [2]]
    rows = np.zeros((2, 12), np.uint8)
    for row, text in zip(rows, (b'{"a": 1}', b"[2, 3]")):
        row[: len(text)] = np.frombuffer(text, np.uint8)
    assert JSONField.unpack(rows) == [{"a": 1}, [2, 3]]
