"""Image-path benchmark: RandomResizedCrop-160 + flip + ToTensor + ToTorchImage on photo JPEGs, side by side.

    python benchmarks/image_pipeline.py [--images N] [--repeats R] [--quick]

For photo JPEGs (quality 90, crops of real photos) whose shorter side is ~256 px and ~500 px, batch 64,
2 threads/workers, it measures images/s of: beton; FFCV 1.0.2 if importable; a torch DataLoader (2 worker
processes) decoding with simplejpeg and cropping with cv2; and the decode limit: simplejpeg decoding the same
bytes at the same DCT scales, in 2 threads, nothing else. Repetitions alternate; medians are reported.
Writes benchmarks/results/image_pipeline.json and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import tempfile
import threading
import time

import cv2
import numpy as np
import simplejpeg
import torch

import beton
from beton import Loader, OrderOption
from beton.fields import IntField, RGBImageField
from beton.fields.decoders import IntDecoder, RandomResizedCropRGBImageDecoder
from beton.fields.image_crops import random_resized_crop
from beton.fields.rgb_image_decoders import choose_dct_factor
from beton.pipeline.random import operation_key
from beton.sample_photos import photo_crop
from beton.transforms import ToTensor, ToTorchImage
from beton.transforms.flip import RandomHorizontalFlip

from beton.bench.timing import alternating_rates

BATCH_SIZE = 64
WORKERS = 2
OUTPUT = 160
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "image_pipeline.json")


def make_jpegs(count: int, short_side: int) -> list[bytes]:
    rng = np.random.default_rng(short_side)
    images = []
    for index in range(count):
        long_side = int(short_side * rng.uniform(1.0, 1.5))
        height, width = (short_side, long_side) if index % 3 else (long_side, short_side)
        pixels = photo_crop(index, height, width, seed=short_side)
        images.append(simplejpeg.encode_jpeg(pixels, quality=90, colorsubsampling="420"))
    return images


class JpegDataset:
    def __init__(self, jpegs: list[bytes]) -> None:
        self.jpegs = jpegs

    def __len__(self) -> int:
        return len(self.jpegs)

    def __getitem__(self, index: int) -> tuple[bytes, int]:
        return self.jpegs[index], index % 1000


class DecodedDataset(JpegDataset):
    """For FFCV's writer, which wants pixels."""

    def __getitem__(self, index: int) -> tuple[np.ndarray, int]:
        return simplejpeg.decode_jpeg(self.jpegs[index]), index % 1000


class TorchJpegDataset(torch.utils.data.Dataset):
    """A good torch pipeline: simplejpeg decode, torchvision's RRC algorithm, cv2 resize, flip."""

    def __init__(self, jpegs: list[bytes]) -> None:
        self.jpegs = jpegs

    def __len__(self) -> int:
        return len(self.jpegs)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        cv2.setNumThreads(1)
        image = simplejpeg.decode_jpeg(self.jpegs[index])
        key = np.uint64(np.random.randint(0, 2**62))
        top, left, height, width = random_resized_crop(key, index, image.shape[0], image.shape[1], 0.08, 1.0,
                                                       math.log(3 / 4), math.log(4 / 3))
        crop = cv2.resize(image[top : top + height, left : left + width], (OUTPUT, OUTPUT),
                          interpolation=cv2.INTER_LINEAR)
        if np.random.rand() < 0.5:
            crop = crop[:, ::-1]
        return torch.from_numpy(np.ascontiguousarray(crop)).permute(2, 0, 1), index % 1000


class DecodeLimit:
    """simplejpeg alone, at the DCT scale beton's decoder picks for each image of epoch `epoch`, 2 threads."""

    def __init__(self, jpegs: list[bytes], seed: int) -> None:
        self.jpegs, self.seed, self.epoch = jpegs, seed, 0

    def __iter__(self):
        key = operation_key(self.seed, self.epoch, 0, 0)
        self.epoch += 1
        jobs = []
        for index, data in enumerate(self.jpegs):
            height, width, _, _ = simplejpeg.decode_jpeg_header(data)
            _, _, crop_height, crop_width = random_resized_crop(key, index, height, width, 0.08, 1.0,
                                                                math.log(3 / 4), math.log(4 / 3))
            factor = choose_dct_factor(crop_height, crop_width, OUTPUT, OUTPUT)
            jobs.append((data, -(-height // factor), -(-width // factor), factor))

        def decode(part):
            buffer = np.empty(4000 * 4000 * 3, np.uint8)
            for data, min_height, min_width, factor in part:
                simplejpeg.decode_jpeg(data, min_height=min_height, min_width=min_width, min_factor=factor,
                                       buffer=buffer)

        threads = [threading.Thread(target=decode, args=(jobs[k::WORKERS],)) for k in range(WORKERS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return iter([(None, range(len(self.jpegs)))])


def ffcv_loader(jpegs: list[bytes], directory: str, name: str):
    try:
        from ffcv.fields import IntField as FFCVInt, RGBImageField as FFCVImage
        from ffcv.fields.decoders import IntDecoder as FFCVIntDecoder
        from ffcv.fields.rgb_image import RandomResizedCropRGBImageDecoder as FFCVRRC
        from ffcv.loader import Loader as FFCVLoader, OrderOption as FFCVOrder
        from ffcv.transforms import RandomHorizontalFlip as FFCVFlip, ToTensor as FFCVToTensor
        from ffcv.transforms import ToTorchImage as FFCVToTorchImage
        from ffcv.writer import DatasetWriter as FFCVWriter
    except ImportError as error:
        print(f"FFCV skipped: {error}")
        return None
    path = os.path.join(directory, f"ffcv_{name}.beton")
    FFCVWriter(path, {"image": FFCVImage(write_mode="jpg", jpeg_quality=90), "label": FFCVInt()},
               num_workers=WORKERS).from_indexed_dataset(DecodedDataset(jpegs))
    return FFCVLoader(path, batch_size=BATCH_SIZE, num_workers=WORKERS, order=FFCVOrder.RANDOM, os_cache=True,
                      pipelines={"image": [FFCVRRC((OUTPUT, OUTPUT)), FFCVFlip(), FFCVToTensor(),
                                           FFCVToTorchImage()],
                                 "label": [FFCVIntDecoder(), FFCVToTensor()]})


def measure(jpegs: list[bytes], directory: str, name: str, repeats: int) -> dict[str, float]:
    path = os.path.join(directory, f"{name}.beton")
    beton.DatasetWriter(path, {"image": RGBImageField(write_mode="jpg"), "label": IntField()},
                        num_workers=WORKERS, progress=False).from_indexed_dataset(JpegDataset(jpegs))
    contenders = {
        "beton": Loader(path, batch_size=BATCH_SIZE, num_workers=WORKERS, order=OrderOption.RANDOM, seed=0,
                        pipelines={"image": [RandomResizedCropRGBImageDecoder((OUTPUT, OUTPUT)),
                                             RandomHorizontalFlip(), ToTensor(), ToTorchImage()],
                                   "label": [IntDecoder(), ToTensor()]}),
        "decode limit": DecodeLimit(jpegs, seed=0),
        "torch DataLoader": torch.utils.data.DataLoader(TorchJpegDataset(jpegs), batch_size=BATCH_SIZE,
                                                        shuffle=True, num_workers=WORKERS,
                                                        persistent_workers=True),
    }
    ffcv = ffcv_loader(jpegs, directory, name)
    if ffcv is not None:
        contenders["FFCV 1.0.2"] = ffcv
    return alternating_rates(contenders, repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="500 images, 3 repeats")
    arguments = parser.parse_args()
    count = 500 if arguments.quick else arguments.images
    result = {"machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
              "date": time.strftime("%Y-%m-%d"), "images": count, "batch_size": BATCH_SIZE, "scenarios": {}}
    with tempfile.TemporaryDirectory() as directory:
        for short_side in (256, 500):
            jpegs = make_jpegs(count, short_side)
            rates = measure(jpegs, directory, f"side{short_side}", arguments.repeats)
            result["scenarios"][f"~{short_side} px"] = {
                "mean_jpeg_bytes": round(float(np.mean([len(j) for j in jpegs]))),
                "images_per_s": {name: round(value) for name, value in rates.items()},
                "beton_over": {name: round(rates["beton"] / value, 2) for name, value in rates.items()
                               if name != "beton"},
            }
    os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
    with open(RESULTS, "w") as file:
        json.dump(result, file, indent=2)
    print(json.dumps(result, indent=2))
    print("\n| scenario | loader | images/s | beton / it |\n|---|---|---|---|")
    for scenario, values in result["scenarios"].items():
        for name, rate in values["images_per_s"].items():
            ratio = values["beton_over"].get(name, 1.0)
            print(f"| {scenario} | {name} | {rate:,} | {ratio:.2f} |")


if __name__ == "__main__":
    main()
