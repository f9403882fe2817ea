"""Quick start: write a small dataset of real photos into a .beton file, then describe and verify it.

    python examples/quickstart.py [--out DIR] [--samples N]
"""

from __future__ import annotations

import argparse
import os
import tempfile

import numpy as np

import beton
from beton.cli import describe
from beton.fields import IntField, JSONField, NDArrayField
from beton.sample_photos import PHOTO_NAMES, photo_crop


class PhotoCrops:
    """An indexed dataset: 128x128 crops of bundled photos, labelled by which photo they come from."""

    def __init__(self, count: int) -> None:
        self.count = count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> tuple[np.ndarray, int, dict]:
        label = index % len(PHOTO_NAMES)
        return photo_crop(index, 128, 128), label, {"photo": PHOTO_NAMES[label], "index": index}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=tempfile.gettempdir(), help="directory for photos.beton")
    parser.add_argument("--samples", type=int, default=300)
    arguments = parser.parse_args()

    path = os.path.join(arguments.out, "photos.beton")
    fields = {"image": NDArrayField(np.uint8, (128, 128, 3)), "label": IntField(), "meta": JSONField()}
    beton.DatasetWriter(path, fields, num_workers=2, page_size=1 << 20).from_indexed_dataset(
        PhotoCrops(arguments.samples)
    )
    with beton.Reader(path) as reader:
        print(describe(reader))
        image, label, meta = reader[7]
        print(f"sample 7: image {image.shape} {image.dtype}, label {label}, meta {meta}")
    report = beton.verify(path)
    print(f"verified {report.num_pages} pages of {report.path}")


if __name__ == "__main__":
    main()
