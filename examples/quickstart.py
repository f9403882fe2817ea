"""Quick start: write a dataset of real photos into a .beton file, describe and verify it, then load it
with an augmenting pipeline and save one batch as a PNG grid.

    python examples/quickstart.py [--out DIR] [--samples N]
"""

from __future__ import annotations

import argparse
import os
import tempfile

import cv2
import numpy as np

import beton
from beton import Loader, OrderOption
from beton.fields.decoders import IntDecoder, NDArrayDecoder
from beton.transforms import ToTensor
from beton.transforms.flip import RandomHorizontalFlip
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

    pipelines = {"image": [NDArrayDecoder(), RandomHorizontalFlip(), ToTensor()],
                 "label": [IntDecoder(), ToTensor()], "meta": None}
    with Loader(path, batch_size=32, num_workers=2, order=OrderOption.RANDOM, seed=0, pipelines=pipelines) as loader:
        print(loader.explain().splitlines()[0])
        images, labels = next(iter(loader))
        print(f"first batch: images {tuple(images.shape)} {images.dtype}, labels {labels[:8].tolist()}...")
        grid = save_grid(images.numpy(), os.path.join(arguments.out, "photos_batch.png"))
    print(f"saved a grid of the first batch to {grid}")


def save_grid(images: np.ndarray, path: str, columns: int = 8) -> str:
    """Tile a batch of HxWx3 RGB images into one PNG."""
    rows = -(-len(images) // columns)
    height, width = images.shape[1:3]
    grid = np.zeros((rows * height, columns * width, 3), np.uint8)
    for index, image in enumerate(images):
        row, column = divmod(index, columns)
        grid[row * height : (row + 1) * height, column * width : (column + 1) * width] = image
    cv2.imwrite(path, cv2.cvtColor(grid, cv2.COLOR_RGB2BGR))
    return path


if __name__ == "__main__":
    main()
