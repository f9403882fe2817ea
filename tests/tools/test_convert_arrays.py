"""``convert numpy`` and ``convert torch``: every dtype a field can store comes back equal; the rest is named."""

from __future__ import annotations


import hypothesis.extra.numpy
import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import beton
import beton.convert
from beton.fields import BytesField, FloatField, IntField, JSONField, NDArrayField, TorchTensorField
from beton.tools.convert import ConversionError, fields_for_arrays

from cli_runs import run_cli

N = 6


# name -> (array of N samples, the field it becomes)
NUMPY = {
    "bool": (np.array([True, False] * 3), IntField),
    "int8": (np.arange(-3, 3, dtype=np.int8), IntField),
    "int64": (np.array([-2**63, 2**63 - 1, 0, 1, 2, 3], np.int64), IntField),
    "uint32": (np.array([0, 2**32 - 1, 5, 6, 7, 8], np.uint32), IntField),
    "big-endian": (np.arange(N, dtype=">i4"), IntField),
    "uint64": (np.array([2**64 - 1, 0, 1, 2, 3, 4], np.uint64), NDArrayField),
    "float16": (np.linspace(-1, 1, N).astype(np.float16), FloatField),
    "float32": (np.linspace(0, 1, N, dtype=np.float32), FloatField),
    "longdouble": (np.linspace(0, 1, N).astype(np.longdouble) / 3, NDArrayField),
    "complex128": (np.arange(N) * (1 + 2j), NDArrayField),
    "datetime64": (np.arange("2024-01-01", "2024-01-07", dtype="datetime64[D]"), NDArrayField),
    "timedelta64": (np.arange(N).astype("timedelta64[ms]"), NDArrayField),
    "str": (np.array(["a", "bé", "", "写真", "e" * 20, "f"]), JSONField),
    "bytes": (np.array([b"a", b"bc", b"", b"\x00x", b"e", b"f"]), BytesField),
    "structured": (np.array([(i, i / 2) for i in range(N)], [("a", "<i4"), ("b", "<f8")]), NDArrayField),
    "images": (np.arange(N * 4 * 3 * 2, dtype=np.uint8).reshape(N, 4, 3, 2), NDArrayField),
    "matrices": (np.arange(N * 6, dtype=np.float64).reshape(N, 2, 3) / 7, NDArrayField),
    "bools-2d": (np.arange(N * 4).reshape(N, 4) % 3 == 0, NDArrayField),
}


def test_every_numpy_dtype_round_trips(tmp_path):
    np.savez(tmp_path / "all.npz", **{name: array for name, (array, _) in NUMPY.items()})
    report = beton.convert.numpy(tmp_path / "all.npz", tmp_path / "all.beton", num_workers=2, progress=False)
    assert report.num_samples == N
    with beton.Reader(tmp_path / "all.beton") as reader:
        for name, (array, kind) in NUMPY.items():
            assert type(reader.fields[name]) is kind, name
        for i in range(N):
            sample = dict(zip(reader.field_names, reader[i]))
            for name, (array, kind) in NUMPY.items():
                if kind in (IntField, FloatField):
                    assert sample[name] == array[i].item(), name  # the value; the dtype becomes int64/float64
                elif kind in (JSONField, BytesField):
                    assert sample[name] == array[i].item() and type(sample[name]) is type(array[i].item()), name
                else:
                    assert sample[name].dtype == array.dtype and sample[name].shape == array.shape[1:], name
                    np.testing.assert_array_equal(sample[name], array[i], err_msg=name)
        assert reader.metadata["source"] == {"format": "numpy", "file": str(tmp_path / "all.npz")}


def test_a_npy_file_converts(tmp_path):
    """``convert numpy x.npy`` crashed (a context manager around a plain array)."""
    np.save(tmp_path / "x.npy", np.arange(12, dtype=np.float32).reshape(4, 3))
    result = run_cli("convert", "numpy", tmp_path / "x.npy", tmp_path / "x.beton", "--name", "features", "--no-progress")
    assert result.returncode == 0, result.stderr
    assert "fields: features NDArrayField" in result.stdout
    with beton.Reader(tmp_path / "x.beton") as reader:
        np.testing.assert_array_equal(reader[2][0], np.array([6, 7, 8], np.float32))


@pytest.mark.parametrize("arrays, message", [
    ({"o": np.array([{"a": 1}, None, 3], dtype=object)}, "entry 'o' holds Python objects"),
    ({"s": np.array([["a", "b"], ["c", "d"]])}, r"entry 's' holds \(2,\) strings per sample"),
    ({"x": np.zeros(3), "y": np.zeros(4)}, "same length .* 'x': 3, 'y': 4"),
    ({"scalar": np.float32(1.0)}, "entry 'scalar' is a float32, expected an array"),
    ({"zero_d": np.array(5)}, "entry 'zero_d' is a single value"),
    ({"void": np.zeros(3, "V0")}, "whose values take no bytes"),
    ({}, "no arrays"),
])
def test_what_cannot_be_stored_is_named(tmp_path, arrays, message):
    with pytest.raises(ConversionError, match=message):
        beton.convert.arrays(arrays, tmp_path / "x.beton", progress=False)
    assert not (tmp_path / "x.beton").exists()


def test_object_arrays_in_files_are_refused_without_running_pickle(tmp_path):
    np.savez(tmp_path / "o.npz", good=np.arange(3), bad=np.array([{"a": 1}, 2, 3], dtype=object))
    result = run_cli("convert", "numpy", tmp_path / "o.npz", tmp_path / "o.beton")
    assert result.returncode == 1 and "entry 'bad'" in result.stderr and "pickle" in result.stderr
    np.save(tmp_path / "o.npy", np.array([None, 1], dtype=object))
    result = run_cli("convert", "numpy", tmp_path / "o.npy", tmp_path / "o.beton")
    assert result.returncode == 1 and "o.npy" in result.stderr and "pickle" in result.stderr


TORCH = {
    "labels": (torch.arange(N), IntField),
    "flags": (torch.tensor([True, False] * 3), IntField),
    "weights": (torch.linspace(0, 1, N, dtype=torch.bfloat16), FloatField),
    "images": (torch.arange(N * 12, dtype=torch.uint8).reshape(N, 3, 2, 2), TorchTensorField),
    "embeddings": (torch.randn(N, 5, dtype=torch.bfloat16), TorchTensorField),
    "complex": (torch.arange(N, dtype=torch.float32).to(torch.complex64) * (1 + 2j), TorchTensorField),
    "halves": (torch.arange(N * 2, dtype=torch.float16).reshape(N, 2), TorchTensorField),
}


def test_every_torch_dtype_round_trips(tmp_path):
    torch.save({name: tensor for name, (tensor, _) in TORCH.items()}, tmp_path / "t.pt")
    result = run_cli("convert", "torch", tmp_path / "t.pt", tmp_path / "t.beton", "--no-progress")
    assert result.returncode == 0, result.stderr
    with beton.Reader(tmp_path / "t.beton") as reader:
        for name, (tensor, kind) in TORCH.items():
            assert type(reader.fields[name]) is kind, name
        for i in range(N):
            sample = dict(zip(reader.field_names, reader[i]))
            for name, (tensor, kind) in TORCH.items():
                if kind is TorchTensorField:
                    assert sample[name].dtype == tensor.dtype and torch.equal(sample[name], tensor[i]), name
                else:
                    assert sample[name] == tensor[i].item(), name


def test_lists_and_single_tensors(tmp_path):
    torch.save([torch.arange(4), torch.ones(4, 2)], tmp_path / "l.pt")
    beton.convert.torch(tmp_path / "l.pt", tmp_path / "l.beton", progress=False)
    with beton.Reader(tmp_path / "l.beton") as reader:
        assert reader.field_names == ["f0", "f1"] and reader[3][0] == 3
    torch.save(torch.ones(3, 2), tmp_path / "one.pt")
    beton.convert.torch(tmp_path / "one.pt", tmp_path / "one.beton", name="x", progress=False)
    with beton.Reader(tmp_path / "one.beton") as reader:
        assert reader.field_names == ["x"] and len(reader) == 3


@pytest.mark.parametrize("content, message", [
    ({"x": torch.arange(3), "name": "abc"}, "entry 'name' is a str, expected an array"),
    ({"x": torch.arange(3), "nested": {"a": torch.arange(3)}}, "entry 'nested' is a dict"),
    ({"x": torch.zeros(3, dtype=torch.uint16)}, "entry 'x' has dtype torch.uint16, which cannot be stored"),
    ({"x": torch.arange(3).to_sparse()}, "entry 'x' is a torch.sparse_coo tensor"),
    ({"x": torch.tensor(3.0)}, "entry 'x' is a single value"),
    ({"x": torch.arange(3), "y": torch.arange(5)}, "'x': 3, 'y': 5"),
    ({1: torch.arange(3)}, "dict keys name the fields and must be non-empty strings, got 1"),
    (42, "holds a int; expected a tensor"),
])
def test_torch_messages_name_the_entry_and_its_problem(tmp_path, content, message):
    torch.save(content, tmp_path / "bad.pt")
    result = run_cli("convert", "torch", tmp_path / "bad.pt", tmp_path / "bad.beton")
    assert result.returncode == 1 and message in result.stderr, result.stderr
    assert "same length" not in result.stderr or "'y'" in message


def test_a_pt_file_that_needs_pickle_is_refused(tmp_path):
    import pickle

    with open(tmp_path / "code.pt", "wb") as file:
        pickle.dump({"x": complex(1, 2)}, file)  # not a tensor archive: weights_only refuses it
    result = run_cli("convert", "torch", tmp_path / "code.pt", tmp_path / "c.beton")
    assert result.returncode == 1 and "cannot be loaded as tensors (weights_only=True)" in result.stderr


def test_fields_for_arrays_chooses_from_dtype_and_shape():
    fields = fields_for_arrays({name: array for name, (array, _) in NUMPY.items()})
    assert {name: type(field) for name, field in fields.items()} == {name: kind for name, (_, kind) in NUMPY.items()}
    assert fields["images"] == NDArrayField(np.uint8, (4, 3, 2)) and fields["uint64"] == NDArrayField(np.uint64, ())


@given(array=hypothesis.extra.numpy.arrays(
    st.sampled_from([np.bool_, np.int8, np.int16, np.uint16, np.uint64, np.float16, np.float64, np.complex64,
                     np.dtype("<U3"), np.dtype("S2"), np.dtype(">i4"), np.dtype("datetime64[s]")]),
    hypothesis.extra.numpy.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=4)))
def test_any_array_round_trips_as_its_field_stores_it(tmp_path, array):
    if array.dtype.kind in "US" and array.ndim > 1:
        with pytest.raises(ConversionError, match="strings per sample"):
            beton.convert.arrays({"x": array}, tmp_path / "h.beton", num_workers=0, progress=False)
        return
    beton.convert.arrays({"x": array}, tmp_path / "h.beton", num_workers=0, progress=False)
    with beton.Reader(tmp_path / "h.beton") as reader:
        field = reader.fields["x"]
        for i in range(len(array)):
            value = reader[i][0]
            if isinstance(field, (IntField, FloatField, JSONField, BytesField)):
                expected = array[i].item()
                assert value == expected or (value != value and expected != expected)  # NaN is NaN
            else:
                assert value.dtype == array.dtype and value.shape == array.shape[1:]
                np.testing.assert_array_equal(value, array[i])
