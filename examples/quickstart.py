"""Quick start: write a dataset of real photos into a .beton file, describe and verify it, then load it
with an augmenting pipeline and save one batch as a PNG grid.

    python examples/quickstart.py [--out DIR] [--samples N]

The photos are crops, flips and rescales of scikit-image's bundled pictures: half about 256 px, half about
500 px on the shorter side, stored as JPEG (quality 90) with a label (which picture) and JSON metadata.
"""

from __future__ import annotations

import argparse
import os
import tempfile

import cv2
import numpy as np

import beton
from beton import Loader, OrderOption
from beton.tools.cli import describe
from beton.fields import IntField, JSONField, RGBImageField
from beton.decoders import IntDecoder, RandomResizedCropRGBImageDecoder
from beton.tools.sample_photos import PHOTO_NAMES, photo_crop
from beton.transforms import RandomBrightness, RandomHorizontalFlip, ToTensor


class Photos:
    """An indexed dataset of photo crops, labelled by which bundled picture they come from."""

    def __init__(self, count: int) -> None:
        self.count = count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> tuple[np.ndarray, int, dict]:
        label = index % len(PHOTO_NAMES)
        short_side = 256 if index % 2 else 500
        long_side = short_side + 37 * (index % 5) * short_side // 128
        height, width = (short_side, long_side) if index % 3 else (long_side, short_side)
        return photo_crop(index, height, width), label, {"photo": PHOTO_NAMES[label], "size": [height, width]}


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=tempfile.gettempdir(), help="directory for photos.beton and the PNG")
    parser.add_argument("--samples", type=int, default=300)
    arguments = parser.parse_args()

    path = os.path.join(arguments.out, "photos.beton")
    fields = {"image": RGBImageField(write_mode="jpg", jpeg_quality=90), "label": IntField(), "meta": JSONField()}
    beton.DatasetWriter(path, fields, num_workers=2, page_size=1 << 22).from_indexed_dataset(Photos(arguments.samples))
    with beton.Reader(path) as reader:
        print(describe(reader))
        image, label, meta = reader[7]
        print(f"sample 7: image {image.shape} {image.dtype}, label {label}, meta {meta}")
    report = beton.verify(path)
    print(f"verified {report.num_pages} pages of {report.path}")

    pipelines = {
        "image": [RandomResizedCropRGBImageDecoder((128, 128)), RandomHorizontalFlip(), RandomBrightness(0.3),
                  ToTensor()],
        "label": [IntDecoder(), ToTensor()],
        "meta": None,
    }
    with Loader(path, batch_size=32, num_workers=2, order=OrderOption.RANDOM, seed=0, pipelines=pipelines) as loader:
        print("\n".join(line for line in loader.explain().splitlines() if line.startswith(("stage", "output"))))
        images, labels = next(iter(loader))
        print(f"first batch: images {tuple(images.shape)} {images.dtype}, labels {labels[:8].tolist()}...")
        grid = save_grid(images.numpy(), os.path.join(arguments.out, "photos_batch.png"))
    print(f"saved a grid of the first batch to {grid}")


if __name__ == "__main__":
    main()
