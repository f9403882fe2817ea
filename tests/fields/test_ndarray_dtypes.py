"""Every dtype NDArrayField stores comes back from a Loader with the same values, compiled or not."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from beton import DatasetWriter, Loader, PipelineError
from beton.decoders import NDArrayDecoder
from beton.fields import NDArrayField, TorchTensorField
from beton.transforms import ToTensor

DTYPES = ["|b1", "<i1", "<u2", ">i4", "<i8", ">u8", "<f2", ">f2", "<f4", ">f8", "<c8", ">c16",
          "<M8[s]", ">m8[ms]", "|S3", "<U2", ">U2", "|V3"]


def values(dtype: np.dtype, count: int) -> list[np.ndarray]:
    raw = np.random.default_rng(1).integers(0, 256, (count, 2, 3 * dtype.itemsize), dtype=np.uint8)
    if dtype.kind in "fc":  # keep NaN payloads out: NaN != NaN would hide a correct copy
        return [(np.arange(6).reshape(2, 3) * (i + 0.5)).astype(dtype) for i in range(count)]
    if dtype.kind == "U":
        return [np.array([["ab", "é"][i % 2]] * 6, dtype).reshape(2, 3) for i in range(count)]
    if dtype.kind == "b":
        return [(row.view(np.uint8)[:, ::dtype.itemsize] & 1).astype(dtype) for row in raw]
    return [np.ascontiguousarray(row).view(dtype).reshape(2, 3) for row in raw]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("os_cache", [True, False])
def test_values_come_back_unchanged(tmp_path, dtype, os_cache):
    dtype = np.dtype(dtype)
    stored = values(dtype, 10)
    path = tmp_path / "arrays.beton"
    DatasetWriter(str(path), {"a": NDArrayField(dtype, (2, 3))}, num_workers=1).from_indexed_dataset(
        [(value,) for value in stored])
    loader = Loader(str(path), batch_size=4, num_workers=2, os_cache=os_cache)
    batches = [a for (a,) in loader]
    loader.close()
    got = np.concatenate([b.numpy() if isinstance(b, torch.Tensor) else b for b in batches])
    assert got.shape == (10, 2, 3)
    assert got.dtype == dtype or got.dtype == dtype.newbyteorder("=")
    np.testing.assert_array_equal(got, np.stack(stored))


def test_to_tensor_refuses_dtypes_torch_lacks(tmp_path):
    path = tmp_path / "dates.beton"
    stored = [(np.array(["2020-01-01"], "<M8[D]"),)] * 3
    DatasetWriter(str(path), {"d": NDArrayField(np.dtype("<M8[D]"), (1,))}).from_indexed_dataset(stored)
    with pytest.raises(PipelineError, match="torch has no dtype"):
        Loader(str(path), batch_size=2, pipelines={"d": [NDArrayDecoder(), ToTensor()]})


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.bool, torch.int16, torch.complex64])
def test_torch_tensors_of_every_dtype_come_back_unchanged(tmp_path, dtype):
    stored = [((torch.arange(6).reshape(2, 3) * (i + 1)).to(dtype),) for i in range(5)]
    path = tmp_path / "tensors.beton"
    DatasetWriter(str(path), {"t": TorchTensorField(dtype, (2, 3))}).from_indexed_dataset(stored)
    loader = Loader(str(path), batch_size=2, num_workers=2)
    got = torch.cat([t for (t,) in loader])
    loader.close()
    assert got.dtype == dtype
    assert torch.equal(got, torch.stack([s[0] for s in stored]))
