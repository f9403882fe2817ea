"""Beyond FFCV: progressive-JPEG fidelity, a raw/JPEG mix tuned for this machine, and lossless images.

    python examples/research_features.py [--images N] [--out DIR]

1. Writes photo crops as progressive JPEGs with scan-grouped pages, then loads two epochs through the process
   cache with a fidelity schedule (2 scans, then all): the first epoch reads a fraction of the bytes.
2. Writes the same photos as baseline JPEGs, runs ``beton tune`` for a 400 MB/s store (as if the data sat on a
   network file system), and loads the tuned file with ``OrderOption.BALANCED``: every batch has the same mix.
3. Writes them losslessly and checks that every pixel comes back, at about PNG's size.
"""

from __future__ import annotations

import argparse
import os
import tempfile

import cv2
import numpy as np

import beton
from beton import Loader, OrderOption
from beton.fields import IntField, RGBImageField
from beton.memory import ProcessCache
from beton.decoders import IntDecoder, RandomResizedCropRGBImageDecoder
from beton.tools.sample_photos import photo_crop
from beton.transforms import RandomHorizontalFlip, ToTensor, ToTorchImage
from beton.tools.tune import tune

BATCH = 32


def photos(count: int) -> list[tuple[np.ndarray, int]]:
    return [(photo_crop(index, 256, 320 + 16 * (index % 4)), index % 7) for index in range(count)]


def write(path: str, samples: list, **image_options) -> str:
    beton.DatasetWriter(path, {"image": RGBImageField(**image_options), "label": IntField()}, num_workers=2,
                        progress=False, page_size=1 << 20).from_indexed_dataset(samples)
    return path


def pipelines() -> dict:
    return {"image": [RandomResizedCropRGBImageDecoder((128, 128)), RandomHorizontalFlip(), ToTensor(),
                      ToTorchImage()],
            "label": [IntDecoder(), ToTensor()]}


def fidelity_schedule(directory: str, samples: list) -> None:
    path = write(os.path.join(directory, "progressive.beton"), samples, write_mode="progressive", scan_grouped=True)
    with Loader(path, batch_size=BATCH, num_workers=2, order=OrderOption.QUASI_RANDOM, seed=0,
                memory=ProcessCache(), pipelines=pipelines()) as loader:
        for epoch, scans in enumerate((2, None)):
            loader.set_fidelity(scans)  # low fidelity early in training, all scans later: no rewrite
            count = sum(len(labels) for _, labels in loader)
            read = loader.memory_counters["bytes_read"]
            print(f"  epoch {epoch}, {scans or 'all'} scans: {count} images, {read / 2**20:.1f} MiB read "
                  f"of a {os.path.getsize(path) / 2**20:.1f} MiB file")


def balanced_mix(directory: str, samples: list) -> None:
    jpegs = write(os.path.join(directory, "jpeg.beton"), samples, write_mode="jpg")
    tuned = os.path.join(directory, "balanced.beton")
    _, plan = tune(jpegs, tuned, batch_size=BATCH, read_bandwidth=400e6, output_size=128, progress=False)
    print(f"  {plan.describe()}")
    with beton.Reader(tuned) as reader:
        raw = reader.data_table["image"]["mode"] == 0
    with Loader(tuned, batch_size=BATCH, num_workers=2, order=OrderOption.BALANCED, seed=0,
                memory=ProcessCache(read_bandwidth=400e6), pipelines=pipelines()) as loader:
        mix = [int(raw[samples].sum()) for samples in loader.epoch_batches(0)]
        for _ in loader:
            pass
    print(f"  raw images per batch under OrderOption.BALANCED: {mix}")


def lossless(directory: str, samples: list) -> None:
    path = write(os.path.join(directory, "lossless.beton"), samples, write_mode="lossless")
    png_bytes = sum(len(cv2.imencode(".png", image[:, :, ::-1], [cv2.IMWRITE_PNG_COMPRESSION, 6])[1])
                    for image, _ in samples)
    with beton.Reader(path) as reader:
        exact = all(np.array_equal(reader[i][0], image) for i, (image, _) in enumerate(samples))
        stored = int(reader.allocation_table[:, 0]["size"].sum())
    print(f"  every pixel back: {exact}; {stored / png_bytes:.2f}x the size of the same images as PNG (zlib level 6)")
    if not exact:
        raise SystemExit("lossless round trip failed")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=256)
    parser.add_argument("--out", default=None, help="keep the files in this directory")
    arguments = parser.parse_args()
    samples = photos(arguments.images)
    with tempfile.TemporaryDirectory() as temporary:
        directory = arguments.out or temporary
        os.makedirs(directory, exist_ok=True)
        print("1. progressive JPEGs, scan-grouped pages, a fidelity schedule")
        fidelity_schedule(directory, samples)
        print("2. a raw/JPEG mix tuned for a 400 MB/s store")
        balanced_mix(directory, samples)
        print("3. lossless images")
        lossless(directory, samples)


if __name__ == "__main__":
    main()
