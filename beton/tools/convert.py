"""Converting common dataset layouts into .beton files: image folders, numpy arrays, torch tensors.

Used by ``beton convert``; also callable from Python.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from beton.errors import BetonError, EncodeError, FieldError
from beton.fields import FloatField, IntField, NDArrayField, RGBImageField, TorchTensorField
from beton.fields.base import Field
from beton.storage.writer import DatasetWriter

__all__ = ["ImageFolder", "convert_image_folder", "convert_arrays", "fields_for_arrays"]

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff", ".ppm", ".pgm")
_JPEG_EXTENSIONS = (".jpg", ".jpeg")


class ImageFolder:
    """torchvision's ImageFolder layout without torchvision: ``root/<class>/<image>``, classes sorted by name.

    ``dataset[i]`` is ``(image, label)``: JPEG files as their bytes (stored as they are when possible), other
    formats decoded to RGB arrays with OpenCV.
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = os.fspath(root)
        if not os.path.isdir(self.root):
            raise FileNotFoundError(f"image folder {self.root!r} does not exist")
        self.classes = sorted(entry.name for entry in os.scandir(self.root) if entry.is_dir())
        if not self.classes:
            raise BetonError(f"{self.root!r} has no class folders (expected root/<class>/<image files>)")
        self.samples: list[tuple[str, int]] = []
        for label, name in enumerate(self.classes):
            folder = os.path.join(self.root, name)
            for directory, _, files in sorted(os.walk(folder)):
                for file in sorted(files):
                    if file.lower().endswith(IMAGE_EXTENSIONS):
                        self.samples.append((os.path.join(directory, file), label))
        if not self.samples:
            raise BetonError(f"{self.root!r} has class folders but no images ({', '.join(IMAGE_EXTENSIONS)})")

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        path, label = self.samples[index]
        with open(path, "rb") as file:
            data = file.read()
        if path.lower().endswith(_JPEG_EXTENSIONS):
            return data, label
        import cv2

        image = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
        if image is None:
            raise EncodeError(f"{path!r} cannot be decoded as an image")
        return cv2.cvtColor(image, cv2.COLOR_BGR2RGB), label


def convert_image_folder(source: str, output: str, *, write_mode: str = "jpg", max_resolution: int | None = None,
                         jpeg_quality: int = 90, num_workers: int = -1, progress: bool = True) -> ImageFolder:
    """Write an ImageFolder tree as fields ``image`` (RGBImageField) and ``label`` (IntField)."""
    dataset = ImageFolder(source)
    fields = {"image": RGBImageField(write_mode=write_mode, max_resolution=max_resolution,
                                     jpeg_quality=jpeg_quality), "label": IntField()}
    DatasetWriter(output, fields, num_workers=num_workers, progress=progress).from_indexed_dataset(dataset)
    return dataset


def fields_for_arrays(arrays: Mapping[str, Any]) -> dict[str, Field]:
    """Field per array (first dimension = samples): 1-D integers -> IntField, 1-D floats -> FloatField,
    anything else -> NDArrayField (numpy) or TorchTensorField (torch) of the per-sample shape."""
    fields: dict[str, Field] = {}
    lengths = {name: len(array) for name, array in arrays.items()}
    if len(set(lengths.values())) > 1:
        raise FieldError(f"arrays must have the same length (number of samples), got {lengths}")
    for name, array in arrays.items():
        is_torch = type(array).__module__.startswith("torch")
        kind = _scalar_kind(array, is_torch)
        if array.ndim == 1 and kind == "int":
            fields[name] = IntField()
        elif array.ndim == 1 and kind == "float":
            fields[name] = FloatField()
        elif is_torch:
            fields[name] = TorchTensorField(array.dtype, tuple(array.shape[1:]))
        else:
            fields[name] = NDArrayField(array.dtype, array.shape[1:])
    return fields


def _scalar_kind(array: Any, is_torch: bool) -> str:
    if is_torch:
        if array.dtype.is_floating_point:
            return "float"
        return "other" if array.dtype.is_complex or str(array.dtype) == "torch.bool" else "int"
    if np.issubdtype(array.dtype, np.integer):
        return "int"
    return "float" if np.issubdtype(array.dtype, np.floating) else "other"


class _Columns:
    """Sample i of several same-length arrays, as a tuple."""

    def __init__(self, arrays: Sequence[Any]) -> None:
        self.arrays = arrays

    def __len__(self) -> int:
        return len(self.arrays[0])

    def __getitem__(self, index: int) -> tuple[Any, ...]:
        values = []
        for array in self.arrays:
            value = array[index]
            values.append(value.item() if getattr(value, "ndim", 1) == 0 else value)
        return tuple(values)


def convert_arrays(arrays: Mapping[str, Any], output: str, *, num_workers: int = -1, progress: bool = True) -> None:
    """Write same-length numpy arrays or torch tensors, one field per array (see :func:`fields_for_arrays`)."""
    if not arrays:
        raise FieldError("no arrays to convert")
    fields = fields_for_arrays(arrays)
    DatasetWriter(output, fields, num_workers=num_workers, progress=progress).from_indexed_dataset(
        _Columns([arrays[name] for name in fields]))
