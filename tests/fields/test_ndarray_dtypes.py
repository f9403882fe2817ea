"""Every dtype NDArrayField stores comes back from a Loader with the same values, compiled or not."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from beton import DatasetWriter, FieldError, Loader, PipelineError
from beton.decoders import NDArrayDecoder
from beton.fields import NDArrayField, RaggedArrayField, TorchTensorField
from beton.fields.ndarray import TORCH_DTYPES
from beton.transforms import ToTensor

#: Every kind of dtype NDArrayField accepts -> the torch dtype its default pipeline gives, or None where torch
#: has none and the default pipeline gives numpy batches of the stored dtype (values exact either way).
DTYPES = {
    "|b1": torch.bool,
    "<i1": torch.int8, "<i2": torch.int16, "<i4": torch.int32, "<i8": torch.int64, ">i4": torch.int32,
    "|u1": torch.uint8, "<u2": torch.uint16, "<u4": torch.uint32, "<u8": torch.uint64, ">u8": torch.uint64,
    "<f2": torch.float16, ">f2": torch.float16, "<f4": torch.float32, "<f8": torch.float64, ">f8": torch.float64,
    "<c8": torch.complex64, "<c16": torch.complex128, ">c16": torch.complex128,
    np.dtype(np.longdouble).str: None, np.dtype(np.clongdouble).str: None,  # no torch dtype: numpy batches
    "<M8[s]": None, ">m8[ms]": None, "|S3": None, "<U2": None, ">U2": None, "|V3": None,
    "structured": None,  # a record per element: STRUCTURED
}
STRUCTURED = np.dtype([("id", "<u8"), ("score", "<f4"), ("pair", "<i2", (2,))])
#: (per-sample shape, Loader num_workers, os_cache): shape () is what `beton convert` writes for 1-D columns.
CASES = [((), 0, True), ((), 2, False), ((3,), 2, True), ((2, 2), 0, False)]


def as_dtype(name: str) -> np.dtype:
    return STRUCTURED if name == "structured" else np.dtype(name)


def values(dtype: np.dtype, count: int, shape: tuple[int, ...] = (2, 3)) -> list[np.ndarray]:
    """``count`` values of ``dtype`` and ``shape``, different per sample, with each kind's extremes: integers'
    minimum and maximum (uint64's 2**64 - 1), infinities and NaN, long doubles finer than float64."""
    size = int(np.prod(shape, dtype=np.int64))
    raw = np.random.default_rng(1).integers(0, 256, (count, size * dtype.itemsize), dtype=np.uint8)
    if dtype.names is not None:
        flat = np.zeros(count * size, dtype)
        flat["id"] = np.iinfo(np.uint64).max - np.arange(count * size, dtype=np.uint64)
        flat["score"] = np.arange(count * size) / 4
        flat["pair"] = np.arange(count * size * 2).reshape(-1, 2) - 5
        return samples(flat, count, shape)
    if dtype.kind in "fc":
        native = dtype.newbyteorder("=")
        real = np.arange(count * size, dtype=native) / native.type(3)  # in the dtype: 1/3 as fine as it holds
        if dtype.kind == "c":
            real = real + real * native.type(2j)
        real[:4] = [np.inf, -np.inf, np.nan, -0.0]  # NaN compares equal where both are NaN (assert_array_equal)
        return samples(real.astype(dtype), count, shape)
    if dtype.kind == "U":
        return [np.array([["ab", "é"][(i + k) % 2] for k in range(size)], dtype).reshape(shape) for i in range(count)]
    if dtype.kind == "b":
        return [(row[::dtype.itemsize] & 1).astype(dtype).reshape(shape) for row in raw]
    arrays = [np.ascontiguousarray(row).view(dtype).reshape(shape) for row in raw]
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        arrays[0].reshape(-1)[0], arrays[-1].reshape(-1)[-1] = info.max, info.min
    return arrays


def samples(flat: np.ndarray, count: int, shape: tuple[int, ...]) -> list[np.ndarray]:
    """``flat`` cut into ``count`` arrays of ``shape`` (0-d arrays for shape (), which keep a big-endian dtype
    where numpy scalars would be native)."""
    rows = flat.reshape(count, -1)
    return [rows[i].reshape(shape) for i in range(count)]


def load_all(path, **options) -> list:
    loader = Loader(str(path), batch_size=4, **options)  # no pipelines=: each field's default
    try:
        return [a for (a,) in loader]
    finally:
        loader.close()


@pytest.mark.parametrize("shape,num_workers,os_cache", CASES)
@pytest.mark.parametrize("name", DTYPES)
def test_every_dtype_loads_with_its_default_pipeline_and_exact_values(tmp_path, name, shape, num_workers, os_cache):
    dtype, expected_torch = as_dtype(name), DTYPES[name]
    stored = values(dtype, 10, shape)
    path = tmp_path / "arrays.beton"
    DatasetWriter(str(path), {"a": NDArrayField(dtype, shape)}, num_workers=1).from_indexed_dataset(
        [(value,) for value in stored])
    batches = load_all(path, num_workers=num_workers, os_cache=os_cache)
    assert [len(b) for b in batches] == [4, 4, 2]
    if expected_torch is None:
        assert all(type(b) is np.ndarray and b.dtype == dtype for b in batches)
        got = np.concatenate(batches)
    else:
        assert all(isinstance(b, torch.Tensor) and b.dtype == expected_torch for b in batches)
        got = np.concatenate([b.numpy() for b in batches])
    assert got.shape == (10, *shape)
    expected = np.stack(stored)
    np.testing.assert_array_equal(got, expected)
    if dtype.char not in "gG":  # x87 long doubles have padding bytes, which numpy's own copies do not keep
        # the very bytes, in the batch's byte order: NaN payloads, strings' trailing NULs, -0.0
        assert got.tobytes() == np.ascontiguousarray(expected.astype(got.dtype)).tobytes()


def test_long_double_values_are_not_rounded_through_float64(tmp_path):
    fine = np.longdouble(1) / np.longdouble(3)
    if np.finfo(np.longdouble).nmant <= np.finfo(np.float64).nmant:
        pytest.skip("long double is float64 on this platform")
    stored = [np.array([fine * k for k in range(1, 4)], np.longdouble) for _ in range(3)]
    assert stored[0][0] != np.longdouble(np.float64(fine))  # the test's values hold more than float64 does
    path = tmp_path / "fine.beton"
    DatasetWriter(str(path), {"x": NDArrayField(np.longdouble, (3,))}).from_indexed_dataset([(v,) for v in stored])
    (got,) = load_all(path, num_workers=0)
    assert got.dtype == np.longdouble and (got == np.stack(stored)).all()


def test_a_subarray_dtype_is_its_base_dtype_with_trailing_dimensions(tmp_path):
    field = NDArrayField("(2,)<i4", (3,))
    assert field == NDArrayField("<i4", (3, 2))  # what numpy makes of np.zeros(3, "(2,)<i4")
    stored = [np.zeros(3, "(2,)<i4") + i for i in range(5)]
    path = tmp_path / "sub.beton"
    DatasetWriter(str(path), {"a": field}).from_indexed_dataset([(v,) for v in stored])
    got = torch.cat(load_all(path, num_workers=0))
    assert got.dtype == torch.int32 and torch.equal(got, torch.from_numpy(np.stack(stored)))
    assert RaggedArrayField("(2,)<f4", (None, 3)) == RaggedArrayField("<f4", (None, 3, 2))


@pytest.mark.parametrize("dtype,message", [
    ("S", "dtype |S0 has no size: give strings and raw bytes a length"),
    ("U", "dtype <U0 has no size: give strings and raw bytes a length"),
    (object, "dtype object holds Python objects, which cannot be stored as raw bytes; store them with JSONField"),
    ([("a", "O")], "holds Python objects"),
])
def test_dtypes_that_cannot_be_raw_bytes_are_refused_when_the_field_is_declared(dtype, message):
    with pytest.raises(FieldError, match=re.escape(message)):
        NDArrayField(dtype, (3,))


def test_to_tensor_refuses_dtypes_torch_lacks(tmp_path):
    path = tmp_path / "dates.beton"
    stored = [(np.array(["2020-01-01"], "<M8[D]"),)] * 3
    DatasetWriter(str(path), {"d": NDArrayField(np.dtype("<M8[D]"), (1,))}).from_indexed_dataset(stored)
    with pytest.raises(PipelineError, match="torch has no dtype"):
        Loader(str(path), batch_size=2, pipelines={"d": [NDArrayDecoder(), ToTensor()]})


@pytest.mark.parametrize("shape", [(), (3,), (2, 2)])
@pytest.mark.parametrize("name", TORCH_DTYPES)
def test_torch_tensors_of_every_dtype_come_back_unchanged(tmp_path, name, shape):
    dtype = getattr(torch, name)
    stored = [((torch.arange(int(np.prod(shape))).reshape(shape) * (i + 1) - 2).to(dtype),) for i in range(5)]
    path = tmp_path / "tensors.beton"
    DatasetWriter(str(path), {"t": TorchTensorField(dtype, shape)}).from_indexed_dataset(stored)
    got = torch.cat(load_all(path, num_workers=2))
    assert got.dtype == dtype and got.shape == (5, *shape)
    assert torch.equal(got, torch.stack([s[0] for s in stored]))
