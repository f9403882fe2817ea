"""Every input kind ``beton convert`` documents, converted and then read by a Loader with each field's default
pipeline (no ``pipelines=``): the values the source held come back."""

from __future__ import annotations

import io
import json
import tarfile

import numpy as np
import pytest
import torch
from PIL import Image

import beton
import beton.convert
from beton.tools.cli import main
from beton.tools.sample_photos import photo_crop

pa = pytest.importorskip("pyarrow", reason="convert parquet needs pyarrow (the 'parquet' extra)")
import pyarrow.parquet as pq  # noqa: E402

N = 7  # batches of 3, 3 and 1
HEIGHT, WIDTH = 24, 32  # one size: the default image pipeline (SimpleRGBImageDecoder) needs it


def load(path, num_workers: int = 2) -> dict[str, object]:
    """Every field of the file through its default pipeline: name -> all samples (a tensor, an array or a list)."""
    with beton.Reader(str(path)) as reader:
        names = reader.field_names
    loader = beton.Loader(str(path), batch_size=3, num_workers=num_workers)
    try:
        batches = list(loader)
    finally:
        loader.close()
    assert len(batches) == 3 and all(len(batch) == len(names) for batch in batches)
    return {name: _concatenate([batch[k] for batch in batches]) for k, name in enumerate(names)}


def _concatenate(parts: list) -> object:
    if isinstance(parts[0], torch.Tensor):
        return torch.cat(parts)
    if isinstance(parts[0], np.ndarray):
        return np.concatenate(parts)
    assert all(isinstance(part, list) for part in parts), [type(part) for part in parts]
    return [value for part in parts for value in part]


def same(got: object, expected: np.ndarray, torch_dtype: torch.dtype | None) -> None:
    """``got`` holds ``expected``'s values: a tensor of ``torch_dtype``, or (None) a numpy array of its dtype."""
    if torch_dtype is None:
        assert isinstance(got, np.ndarray) and got.dtype == expected.dtype, type(got)
    else:
        assert isinstance(got, torch.Tensor) and got.dtype == torch_dtype, (type(got), getattr(got, "dtype", None))
        got = got.numpy()
    assert got.shape == expected.shape
    np.testing.assert_array_equal(got, expected)


def png(i: int) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(photo_crop(i, HEIGHT, WIDTH)).save(buffer, "PNG")
    return buffer.getvalue()


def photos() -> np.ndarray:
    return np.stack([photo_crop(i, HEIGHT, WIDTH) for i in range(N)])


# name -> (array of N samples, what the default pipeline gives: a torch dtype, None for numpy batches of the
# array's own dtype, or list for a list of Python values); 1-D arrays become fields of shape ()
ARRAYS = {
    "uint64": (np.array([2**64 - 1, 0, 1, 2, 3, 4, 2**63], np.uint64), torch.uint64),
    "complex64": (np.arange(N, dtype=np.complex64) * (0.5 - 1j), torch.complex64),
    "complex128": (np.arange(N) / 3 * (1 + 2j), torch.complex128),
    "longdouble": (np.arange(N, dtype=np.longdouble) / np.longdouble(3), None),  # torch has no long double
    "clongdouble": (np.arange(N, dtype=np.clongdouble) / np.longdouble(3) * 1j, None),
    "datetime64": (np.arange("2024-01-01", "2024-01-08", dtype="datetime64[D]"), None),
    "structured": (np.array([(i, i / 2) for i in range(N)], [("a", "<i4"), ("b", "<f8")]), None),
    "int8": (np.arange(-3, 4, dtype=np.int8), torch.int64),  # IntField: int64 batches
    "bool": (np.arange(N) % 2 == 0, torch.int64),
    "uint32": (np.array([2**32 - 1, 0, 1, 2, 3, 4, 5], np.uint32), torch.int64),
    "float16": (np.linspace(-1, 1, N).astype(np.float16), torch.float64),  # FloatField: float64 batches
    "str": (np.array(["a", "bé", "", "写真", "e" * 9, "f", "g"]), list),  # JSONField
    "bytes": (np.array([b"a", b"bc", b"", b"\x00x", b"e", b"f", b"g"]), list),  # BytesField
    "images": (photos(), torch.uint8),
    "uint64-matrices": (np.arange(N * 4, dtype=np.uint64).reshape(N, 2, 2) * (2**60 + 1), torch.uint64),
    "longdouble-rows": (np.arange(N * 3, dtype=np.longdouble).reshape(N, 3) / np.longdouble(7), None),
    "float16-rows": (np.linspace(0, 1, N * 3).astype(np.float16).reshape(N, 3), torch.float16),
}


def check_arrays(loaded: dict[str, object]) -> None:
    assert set(loaded) == set(ARRAYS)
    for name, (array, kind) in ARRAYS.items():
        got = loaded[name]
        if kind is list:
            assert got == array.tolist(), name
        elif kind in (torch.int64, torch.float64) and array.ndim == 1:  # an IntField or FloatField: the values
            same(got, array.astype(np.int64 if kind is torch.int64 else np.float64), kind)
        else:
            same(got, array, kind)


@pytest.mark.parametrize("how", ["npz", "arrays"])
def test_numpy_arrays_load_with_the_default_pipelines(tmp_path, how):
    target = tmp_path / "arrays.beton"
    if how == "npz":
        np.savez(tmp_path / "arrays.npz", **{name: array for name, (array, _) in ARRAYS.items()})
        beton.convert.numpy(tmp_path / "arrays.npz", target, num_workers=0, progress=False)
    else:
        beton.convert.arrays({name: array for name, (array, _) in ARRAYS.items()}, target, num_workers=0,
                             progress=False)
    check_arrays(load(target))


@pytest.mark.parametrize("dtype,kind", [(np.uint64, torch.uint64), (np.clongdouble, None), (np.float32, torch.float64)])
def test_a_npy_file_converted_by_the_command_loads(tmp_path, dtype, kind):
    array = (np.arange(N) * 3).astype(dtype)
    np.save(tmp_path / "x.npy", array)
    assert main(["convert", "numpy", str(tmp_path / "x.npy"), str(tmp_path / "x.beton"), "--name", "x",
                 "--no-progress"]) == 0
    same(load(tmp_path / "x.beton", num_workers=0)["x"], array.astype(np.float64) if dtype == np.float32 else array,
         kind)


def test_torch_tensors_load_with_the_default_pipelines(tmp_path):
    tensors = {
        "bfloat16": torch.linspace(-2, 2, N * 3).reshape(N, 3).to(torch.bfloat16),
        "complex64": torch.arange(N).to(torch.complex64) * (1 - 1j),  # one per sample: shape ()
        "labels": torch.arange(N) * 5 - 9,
        "masks": torch.arange(N * 4).reshape(N, 2, 2) % 3 == 0,
        "half": torch.linspace(0, 1, N).half(),
        "images": torch.from_numpy(photos()),
    }
    torch.save(tensors, tmp_path / "tensors.pt")
    beton.convert.torch(tmp_path / "tensors.pt", tmp_path / "tensors.beton", num_workers=0, progress=False)
    loaded = load(tmp_path / "tensors.beton")
    assert set(loaded) == set(tensors)
    for name in ("bfloat16", "complex64", "masks", "images"):
        assert loaded[name].dtype == tensors[name].dtype and torch.equal(loaded[name], tensors[name]), name
    assert loaded["labels"].dtype == torch.int64 and torch.equal(loaded["labels"], tensors["labels"])
    assert loaded["half"].dtype == torch.float64 and torch.equal(loaded["half"], tensors["half"].double())


def test_parquet_columns_load_with_the_default_pipelines(tmp_path):
    rows = range(N)
    pq.write_table(pa.table({
        "image": pa.array([png(i) for i in rows], pa.binary()),
        "label": pa.array([i % 3 for i in rows], pa.int16()),
        "score": pa.array([i / 4 for i in rows], pa.float32()),
        "caption": pa.array([f"photo {i} ü" for i in rows]),
        "vector": pa.array([[i, -i, 0.5] for i in rows], pa.list_(pa.float32(), 3)),
        "blob": pa.array([bytes([i]) * i for i in rows], pa.binary()),
    }), tmp_path / "t.parquet", row_group_size=3)
    beton.convert.parquet(tmp_path / "t.parquet", tmp_path / "t.beton", write_mode="lossless", num_workers=0,
                          progress=False)
    loaded = load(tmp_path / "t.beton")
    same(loaded["image"], photos(), torch.uint8)
    same(loaded["label"], np.arange(N) % 3, torch.int64)
    same(loaded["score"], np.arange(N) / 4, torch.float64)
    assert loaded["caption"] == [f"photo {i} ü" for i in rows]
    same(loaded["vector"], np.array([[i, -i, 0.5] for i in rows], np.float32), torch.float32)
    assert loaded["blob"] == [bytes([i]) * i for i in rows]


def test_parquet_lists_of_varying_length_ask_for_a_bound_by_name(tmp_path):
    """RaggedArrayField has no default pipeline on purpose: a batch's size must not follow the longest sample.
    The Loader says which decoder to add instead of failing somewhere inside."""
    pq.write_table(pa.table({"tokens": pa.array([list(range(i)) for i in range(N)], pa.list_(pa.int32()))}),
                   tmp_path / "r.parquet")
    beton.convert.parquet(tmp_path / "r.parquet", tmp_path / "r.beton", num_workers=0, progress=False)
    with pytest.raises(beton.PipelineError, match=r"field 'tokens'.*RaggedDecoder\(max_length=\.\.\.\)"):
        beton.Loader(str(tmp_path / "r.beton"), batch_size=3)


def test_hugging_face_datasets_load_with_the_default_pipelines(tmp_path):
    datasets = pytest.importorskip("datasets", reason="the Hugging Face datasets package is not installed")
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=["cat", "dog"]),
                                  "embedding": datasets.Array2D((2, 3), "float32"), "text": datasets.Value("string")})
    embeddings = [np.arange(6, dtype=np.float32).reshape(2, 3) * i for i in range(N)]
    dataset = datasets.Dataset.from_dict({
        "image": [Image.fromarray(image) for image in photos()], "label": [i % 2 for i in range(N)],
        "embedding": embeddings, "text": [f"t{i}" for i in range(N)]}, features=features)
    dataset.to_parquet(str(tmp_path / "hf.parquet"))
    beton.convert.parquet(tmp_path / "hf.parquet", tmp_path / "hf.beton", write_mode="lossless", num_workers=0,
                          progress=False)
    loaded = load(tmp_path / "hf.beton")
    same(loaded["image"], photos(), torch.uint8)
    same(loaded["label"], np.arange(N) % 2, torch.int64)
    same(loaded["embedding"], np.stack(embeddings), torch.float32)
    assert loaded["text"] == [f"t{i}" for i in range(N)]


def test_webdataset_shards_load_with_the_default_pipelines(tmp_path):
    shards = []
    for s, samples in enumerate([range(0, 4), range(4, N)]):
        shards.append(str(tmp_path / f"train-{s}.tar"))
        with tarfile.open(shards[-1], "w") as archive:
            for i in samples:
                members = {"png": png(i), "cls": f"{i % 4}\n".encode(), "json": json.dumps({"i": i}).encode()}
                for extension, data in members.items():
                    info = tarfile.TarInfo(f"s{i:04d}.{extension}")
                    info.size = len(data)
                    archive.addfile(info, io.BytesIO(data))
    beton.convert.webdataset(shards, tmp_path / "w.beton", write_mode="lossless", num_workers=0, progress=False)
    loaded = load(tmp_path / "w.beton")
    same(loaded["png"], photos(), torch.uint8)
    same(loaded["cls"], np.arange(N) % 4, torch.int64)
    assert loaded["json"] == [{"i": i} for i in range(N)]
    assert loaded["__key__"] == [f"s{i:04d}" for i in range(N)]


def test_an_image_folder_loads_with_the_default_pipelines(tmp_path):
    for i in range(N):
        folder = tmp_path / "train" / ["cat", "dog"][i % 2]
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{i}.png").write_bytes(png(i))
    beton.convert.imagefolder(tmp_path / "train", tmp_path / "f.beton", write_mode="lossless", num_workers=0,
                              progress=False)
    loaded = load(tmp_path / "f.beton", num_workers=0)
    order = [i for label in (0, 1) for i in range(N) if i % 2 == label]  # class folders in sorted order
    same(loaded["image"], photos()[order], torch.uint8)
    same(loaded["label"], np.array(order) % 2, torch.int64)
