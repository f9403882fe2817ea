"""Arrays to fields: numpy ``.npy``/``.npz`` files, torch ``.pt`` files, or same-length arrays in memory.

The first dimension of every array counts samples; each array becomes one field (:func:`fields_for_arrays`):

==========================================  ======================================================
one value per sample of dtype               field (read back as)
==========================================  ======================================================
signed integers, uint8/16/32, bool          IntField (``int``; the loader gives int64)
float16/32/64, bfloat16                     FloatField (``float``; the loader gives float64)
numpy strings (``U``) / bytes (``S``)       JSONField (``str``) / BytesField (``bytes``)
anything else NDArrayField/TorchTensorField stores (uint64, long double, complex, datetime64,
timedelta64, structured...)                 NDArrayField or TorchTensorField of shape () (exact dtype)
==========================================  ======================================================

Arrays with more dimensions become an NDArrayField (numpy) or TorchTensorField (torch) of the per-sample
shape, with the exact dtype. What cannot be stored is refused naming the entry: Python objects, strings with
more than one per sample, torch dtypes TorchTensorField lacks, sparse tensors, values that are not arrays.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from beton.fields import BytesField, FloatField, IntField, JSONField, NDArrayField, TorchTensorField
from beton.fields.base import Field
from beton.fields.ndarray import TORCH_DTYPES
from beton.storage import format as fmt
from beton.tools.convert.report import ConversionError, ConversionReport, base_metadata, write
from beton.storage.remote.options import RemoteOptions

__all__ = ["fields_for_arrays", "arrays", "numpy_file", "torch_file"]

_SCALAR_FIELDS = (IntField, FloatField, JSONField, BytesField)  # values handed over as Python objects


def fields_for_arrays(arrays: Mapping[str, Any]) -> dict[str, Field]:
    """One field per array, chosen from its dtype and per-sample shape (see the module docstring);
    ConversionError naming the entry for anything that cannot be stored."""
    if not arrays:
        raise ConversionError("no arrays to convert")
    lengths = {}
    for name, array in arrays.items():
        _check_entry(name, array)
        lengths[name] = len(array)
    if len(set(lengths.values())) > 1:
        described = ", ".join(f"{name!r}: {length}" for name, length in lengths.items())
        raise ConversionError(f"arrays must have the same length (number of samples), got {described}")
    return {name: _field_for(name, array) for name, array in arrays.items()}


def _is_torch(array: Any) -> bool:
    return type(array).__module__.split(".")[0] == "torch"


def _check_entry(name: str, array: Any) -> None:
    if _is_torch(array):
        import torch

        if not isinstance(array, torch.Tensor):
            raise ConversionError(f"entry {name!r} is a {type(array).__name__}, expected a tensor")
        if array.layout != torch.strided:
            raise ConversionError(f"entry {name!r} is a {array.layout} tensor; convert it with .to_dense()")
        dtype = str(array.dtype).removeprefix("torch.")
        if dtype not in TORCH_DTYPES:
            raise ConversionError(f"entry {name!r} has dtype torch.{dtype}, which cannot be stored; supported: "
                                  f"{', '.join(TORCH_DTYPES)}")
    elif not isinstance(array, np.ndarray):
        raise ConversionError(f"entry {name!r} is a {type(array).__name__}, expected an array (a tensor or numpy "
                              "array with one value per sample along its first dimension)")
    elif array.dtype.hasobject:
        raise ConversionError(f"entry {name!r} holds Python objects (dtype {array.dtype}), which a file cannot store; "
                              "convert it to numbers or fixed-width strings")
    elif array.dtype.kind in "US" and array.ndim != 1:
        raise ConversionError(f"entry {name!r} holds {array.shape[1:]} strings per sample; strings are stored one "
                              "per sample (a 1-D array)")
    elif array.dtype.itemsize == 0:
        raise ConversionError(f"entry {name!r} has dtype {array.dtype}, whose values take no bytes")
    if array.ndim == 0:
        raise ConversionError(f"entry {name!r} is a single value (0-d); every entry needs a first dimension that "
                              "counts samples")


def _field_for(name: str, array: Any) -> Field:
    per_sample = tuple(array.shape[1:])
    if _is_torch(array):
        dtype = str(array.dtype).removeprefix("torch.")
        if not per_sample and (dtype == "bool" or dtype.startswith(("int", "uint8"))):
            return IntField()
        if not per_sample and dtype in ("float16", "bfloat16", "float32", "float64"):
            return FloatField()
        return TorchTensorField(dtype, per_sample)
    dtype = array.dtype
    if not per_sample:
        if dtype.kind == "b" or (dtype.kind == "i") or (dtype.kind == "u" and dtype.itemsize < 8):
            return IntField()
        if dtype.kind == "f" and dtype.itemsize <= 8:
            return FloatField()
        if dtype.kind == "U":
            return JSONField()
        if dtype.kind == "S":
            return BytesField()
    return NDArrayField(dtype, per_sample)


class _Columns:
    """Sample i of several same-length arrays, as a tuple of the values their fields take."""

    def __init__(self, arrays: Sequence[Any], fields: Sequence[Field]) -> None:
        self.arrays = arrays
        self.scalar = [isinstance(field, _SCALAR_FIELDS) for field in fields]
        self.kinds = [type(field) for field in fields]

    def __len__(self) -> int:
        return len(self.arrays[0])

    def __getitem__(self, index: int) -> tuple[Any, ...]:
        values = []
        for array, scalar, kind in zip(self.arrays, self.scalar, self.kinds):
            if not scalar:
                values.append(array[index, ...] if not _is_torch(array) else array[index])  # keeps a 0-d array's dtype
            elif kind is BytesField:
                values.append(bytes(array[index]))
            else:
                values.append(array[index].item())
        return tuple(values)


def arrays(arrays: Mapping[str, Any], output: str | os.PathLike[str], *, metadata: Mapping[str, Any] | None = None,
           num_workers: int = -1, page_size: int = fmt.DEFAULT_PAGE_SIZE, progress: bool = True,
           source: Mapping[str, Any] | None = None, remote: RemoteOptions | None = None) -> ConversionReport:
    """Write same-length numpy arrays or torch tensors, one field per entry (see :func:`fields_for_arrays`);
    ``output`` may be a URL, reached as ``remote`` says (as for :class:`~beton.DatasetWriter`)."""
    fields = fields_for_arrays(arrays)
    kind = "torch" if any(_is_torch(array) for array in arrays.values()) else "numpy"
    columns = _Columns([arrays[name] for name in fields], list(fields.values()))
    return write(output, fields, columns, indexed=True, source_name=lambda index: f"sample {index}",
                 metadata=base_metadata(kind, source or {}, None, metadata), num_workers=num_workers,
                 page_size=page_size, progress=progress, remote=remote)


def numpy_file(source: str | os.PathLike[str], output: str | os.PathLike[str], *, name: str = "data",
               **options: Any) -> ConversionReport:
    """Write a ``.npy`` file (one field, ``name``) or a ``.npz`` file (one field per array); options as for
    :func:`arrays`. A ``.npy`` file is memory-mapped, not read into memory."""
    path = os.fspath(source)
    try:
        loaded = np.load(path, mmap_mode="r", allow_pickle=False)
    except ValueError as error:  # object arrays need pickle, which a data file must not run
        raise ConversionError(f"{path}: {error} (object arrays are refused: loading them runs pickle)") from None
    if isinstance(loaded, np.ndarray):
        entries = {name: loaded}
    else:
        with loaded:
            entries = {}
            for key in loaded.files:
                try:
                    entries[key] = loaded[key]
                except ValueError as error:
                    raise ConversionError(f"{path}: entry {key!r}: {error} (object arrays are refused: loading them "
                                          "runs pickle)") from None
    return arrays(entries, output, source={"file": os.path.abspath(path)}, **options)


def torch_file(source: str | os.PathLike[str], output: str | os.PathLike[str], *, name: str = "data",
               **options: Any) -> ConversionReport:
    """Write a ``.pt`` file holding a tensor (one field, ``name``), a dict of tensors (one field per key) or a
    list/tuple of tensors (fields ``f0``, ``f1``, ...); options as for :func:`arrays`. Loaded with
    ``weights_only=True``: the file cannot run code."""
    import pickle

    import torch

    path = os.fspath(source)
    try:
        loaded = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError) as error:
        raise ConversionError(f"{path} cannot be loaded as tensors (weights_only=True): "
                              f"{' '.join(str(error).split())[:300]}") from None
    if isinstance(loaded, torch.Tensor):
        entries = {name: loaded}
    elif isinstance(loaded, dict):
        bad = [key for key in loaded if not isinstance(key, str) or not key]
        if bad:
            raise ConversionError(f"{path}: dict keys name the fields and must be non-empty strings, got {bad[0]!r}")
        entries = dict(loaded)
    elif isinstance(loaded, (list, tuple)):
        entries = {f"f{index}": value for index, value in enumerate(loaded)}
    else:
        raise ConversionError(f"{path} holds a {type(loaded).__name__}; expected a tensor, or tensors in a dict, "
                              "list or tuple")
    return arrays(entries, output, source={"file": os.path.abspath(path)}, **options)
