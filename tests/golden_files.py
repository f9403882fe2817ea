"""Datasets whose written bytes are pinned (tests/data/golden): one per field kind and image write mode.

``python tests/golden_files.py OUT_DIR`` writes them with whatever beton is on the path; the files in
tests/data/golden hold the bytes the format promises, and test_golden_files checks that today's writer
produces the same bytes. Only the public API is used here, so
the same script runs against old and new trees.
"""

from __future__ import annotations

import pathlib
import sys

import numpy as np

from beton import DatasetWriter
from beton.fields import BytesField, FloatField, IntField, JSONField, NDArrayField, RGBImageField, TorchTensorField


def photos(count: int, size: int = 48) -> list[np.ndarray]:
    """Smooth deterministic images (gradients and rings) that compress like photos, without package data."""
    y, x = np.mgrid[0:size, 0:size].astype(np.float64)
    images = []
    for i in range(count):
        rings = np.sin((x - 7 * i) ** 2 / 90 + (y + 3 * i) ** 2 / 60)
        channels = [rings, np.cos(x / (5 + i)) * np.sin(y / 7), (x + y) / size - 1]
        images.append(((np.stack(channels, axis=2) + 1) * 127.5).clip(0, 255).astype(np.uint8)[: size - i])
    return images


def datasets() -> dict[str, tuple[dict, list[tuple]]]:
    rng = np.random.default_rng(7)
    images = photos(6)
    basic = [(i, i / 3, rng.standard_normal((3, 2)).astype(np.float32), bytes(range(i * 5)), {"i": i, "s": "é" * i},
              np.arange(i + 2, dtype=np.int16).reshape(1, -1)[:, :2])
             for i in range(6)]
    import torch

    basic_fields = {"label": IntField(), "value": FloatField(), "array": NDArrayField(np.dtype(np.float32), (3, 2)),
                    "blob": BytesField(), "meta": JSONField(), "small": NDArrayField(np.dtype(np.int16), (1, 2))}
    tensors = [(torch.arange(4, dtype=torch.bfloat16) * i,) for i in range(4)]
    found = {"basic": (basic_fields, basic),
             "tensor": ({"t": TorchTensorField(torch.bfloat16, (4,))}, tensors)}
    for mode, extra in [("raw", {}), ("jpg", {}), ("proportion", {"compress_probability": 0.5}),
                        ("smart", {"smart_threshold": 4000}), ("progressive", {}),
                        ("progressive-grouped", {"scan_grouped": True}), ("lossless", {})]:
        write_mode = mode.split("-")[0]
        fields = {"image": RGBImageField(write_mode=write_mode, jpeg_quality=85, **extra), "label": IntField()}
        found[f"image-{mode}"] = (fields, [(image, i) for i, image in enumerate(images)])
    return found


def write_all(out: pathlib.Path) -> list[pathlib.Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, (fields, samples) in datasets().items():
        path = out / f"{name}.beton"
        DatasetWriter(str(path), fields, num_workers=1, page_size=4096).from_indexed_dataset(samples)
        written.append(path)
    return written


if __name__ == "__main__":
    for path in write_all(pathlib.Path(sys.argv[1])):
        print(path)
