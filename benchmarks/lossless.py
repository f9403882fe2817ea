"""The lossless image mode against PNG and raw pixels: file size and RandomResizedCrop-160 images/s.

    python benchmarks/lossless.py [--images N] [--repeats R]

Photo crops of ~500 px (shorter side 375, longer 375-560) are stored three ways: beton's lossless mode, raw
pixels in a .beton file, and PNG (zlib level 6, what PIL writes; cv2's default level 1 is reported too).
Contenders, side by side in alternating epochs (2 threads or workers, batch 64, RRC-160 + flip):
beton lossless, beton raw, and a torch DataLoader decoding PNG with cv2 (2 workers). A decode-only line times
whole-image decoding on one thread (beton lossless vs cv2 PNG) to separate codec speed from the crop's saving.
Writes benchmarks/results/lossless.json and prints a Markdown table.
"""

from __future__ import annotations

import json
import os
import tempfile
import time

import cv2
import numpy as np

from beton import DatasetWriter
from beton.tools.bench.contenders import ImageTask, beton_images, torch_images
from beton.tools.bench.data import ArrayDataset
from beton.tools.bench.report import argument_parser, run_header, save_json
from beton.tools.bench.timing import alternating_rates
from beton.fields import IntField, RGBImageField
from beton.codecs.lossless import decode_lossless, encode_lossless
from beton.tools.sample_photos import photo_crop

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "lossless.json")


def make_photos(count: int, short_side: int = 375) -> list[np.ndarray]:
    rng = np.random.default_rng(short_side)
    photos = []
    for index in range(count):
        long_side = int(short_side * rng.uniform(1.0, 1.5))
        height, width = (short_side, long_side) if index % 3 else (long_side, short_side)
        photos.append(photo_crop(index, height, width, seed=short_side))
    return photos


def png_bytes(image: np.ndarray, level: int) -> bytes:
    return cv2.imencode(".png", cv2.cvtColor(image, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_PNG_COMPRESSION, level])[1].tobytes()


def write(path: str, photos: list[np.ndarray], mode: str) -> int:
    labels = np.arange(len(photos)) % 1000
    DatasetWriter(path, {"image": RGBImageField(write_mode=mode), "label": IntField()}, num_workers=2,
                  progress=False).from_indexed_dataset(ArrayDataset(photos, labels))
    return os.path.getsize(path)


def decode_rates(photos: list[np.ndarray], pngs: list[bytes], repeats: int) -> dict[str, float]:
    """Whole-image decodes per second on one thread, alternating the two codecs."""
    encoded = [np.frombuffer(encode_lossless(image), np.uint8) for image in photos]
    timings: dict[str, list[float]] = {"beton lossless": [], "cv2 PNG": []}
    for _ in range(repeats):
        start = time.perf_counter()
        for image, payload in zip(photos, encoded):
            decode_lossless(payload, image.shape[0], image.shape[1], 3)
        timings["beton lossless"].append(len(photos) / (time.perf_counter() - start))
        start = time.perf_counter()
        for data in pngs:
            cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
        timings["cv2 PNG"].append(len(photos) / (time.perf_counter() - start))
    return {name: float(np.median(values)) for name, values in timings.items()}


def main() -> None:
    parser = argument_parser(__doc__, images=1000, repeats=3)
    arguments = parser.parse_args()
    cv2.setNumThreads(1)
    photos = make_photos(arguments.images)
    pngs = [png_bytes(image, 6) for image in photos]
    raw_bytes = sum(image.nbytes for image in photos)
    sizes = {"png_level6": sum(map(len, pngs)), "png_level1": sum(len(png_bytes(image, 1)) for image in photos),
             "raw_pixels": raw_bytes}
    task = ImageTask("rrc", 160, 64)
    with tempfile.TemporaryDirectory() as directory:
        paths = {mode: os.path.join(directory, f"{mode}.beton") for mode in ("lossless", "raw")}
        for mode, path in paths.items():
            sizes[f"beton_{mode}_file"] = write(path, photos, mode)
        loaders = {"beton lossless": beton_images(paths["lossless"], task),
                   "beton raw": beton_images(paths["raw"], task),
                   "torch DataLoader + cv2 PNG": torch_images(pngs, task, decoder="png")}
        rates = alternating_rates(loaders, arguments.repeats)
        for loader in loaders.values():
            getattr(loader, "close", lambda: None)()
    result = {**run_header(), "images": arguments.images, "bytes": sizes,
              "size_vs_png_level6": sizes["beton_lossless_file"] / sizes["png_level6"],
              "rrc160_images_per_s": {name: round(rate) for name, rate in rates.items()},
              "rrc160_lossless_vs_png": rates["beton lossless"] / rates["torch DataLoader + cv2 PNG"],
              "decode_whole_image_per_s_one_thread": {name: round(rate) for name, rate in
                                                      decode_rates(photos[:300], pngs[:300], arguments.repeats).items()}}
    save_json(RESULTS, result)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
