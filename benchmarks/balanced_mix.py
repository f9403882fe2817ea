"""Balanced raw/JPEG mix (``beton tune``) against all-JPEG, all-raw and FFCV-style ``proportion`` files.

    python benchmarks/balanced_mix.py [--images N] [--repeats R] [--bandwidths MB/s ...]

Photo JPEGs (q90, shorter side 256) are loaded with RandomResizedCrop-160 + flip, batch 64, 2 threads, through
the process cache (``memory=ProcessCache(...)``) so that reads can be throttled to a given rate
(``read_bandwidth``): the storage a training job might sit on. Files use 2 MiB pages and windows of 4 pages
(QUASI_RANDOM and BALANCED), so each batch needs a few pages and reading overlaps decoding. For each rate,
``beton tune`` plans the raw fraction for that rate and writes a balanced file (read with ``OrderOption.BALANCED``); a ``proportion`` file with the same raw
fraction, drawn at random per image, is read with QUASI_RANDOM (its batches' mix varies). All-JPEG and
all-raw files are read with QUASI_RANDOM. Epochs alternate between contenders; medians are reported. Writes
benchmarks/results/balanced_mix.json and prints a Markdown table.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import tempfile

import cv2

from beton import DatasetWriter, Loader, OrderOption
from beton.memory import ProcessCache
from beton.tools.bench.data import DecodedJpegDataset, JpegDataset, make_jpegs
from beton.tools.bench.report import argument_parser, run_header, save_json
from beton.tools.bench.timing import epoch_rate
from beton.fields import IntField, RGBImageField
from beton.decoders import IntDecoder, RandomResizedCropRGBImageDecoder
from beton.transforms import RandomHorizontalFlip, ToTensor, ToTorchImage
from beton.tools.tune import tune

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "balanced_mix.json")


PAGE_SIZE = 2 << 20  # 2 MiB pages and 4-page windows: each batch needs a few pages, so reading and decoding overlap
WINDOW_PAGES = 4


def write(path: str, dataset, **field_options) -> str:
    DatasetWriter(path, {"image": RGBImageField(**field_options), "label": IntField()}, num_workers=2,
                  page_size=PAGE_SIZE, progress=False).from_indexed_dataset(dataset)
    return path


def loader(path: str, order: OrderOption, bandwidth: float | None) -> Loader:
    return Loader(path, batch_size=64, num_workers=2, order=order, seed=0,
                  memory=ProcessCache(read_bandwidth=bandwidth), order_kwargs={"window_pages": WINDOW_PAGES},
                  pipelines={"image": [RandomResizedCropRGBImageDecoder((160, 160)), RandomHorizontalFlip(),
                                       ToTensor(), ToTorchImage()],
                             "label": [IntDecoder(), ToTensor()]})


def measure(loaders: dict[str, Loader], repeats: int) -> dict[str, dict]:
    for each in loaders.values():
        epoch_rate(each)  # compile, warm up
    rates: dict[str, list[float]] = {name: [] for name in loaders}
    read: dict[str, list[int]] = {name: [] for name in loaders}
    for _ in range(repeats):
        for name, each in loaders.items():
            rates[name].append(epoch_rate(each))
            read[name].append(each.memory_counters["bytes_read"])
    return {name: {"images_per_s": round(statistics.median(rates[name])),
                   "mb_read_per_epoch": round(statistics.median(read[name]) / 1e6, 1)} for name in loaders}


def main() -> None:
    parser = argument_parser(__doc__, images=2000, repeats=3)
    parser.add_argument("--bandwidths", type=float, nargs="+", default=[150.0, 400.0, 1000.0],
                        help="read rates in MB/s (the page cache, unthrottled, is always measured too)")
    arguments = parser.parse_args()
    cv2.setNumThreads(1)
    jpegs = make_jpegs(arguments.images, 256)
    result: dict = {**run_header(), "images": arguments.images, "rates": {}}
    with tempfile.TemporaryDirectory() as directory:
        jpeg_file = write(os.path.join(directory, "jpeg.beton"), JpegDataset(jpegs), write_mode="jpg")
        raw_file = write(os.path.join(directory, "raw.beton"), DecodedJpegDataset(jpegs), write_mode="raw")
        for megabytes in [None, *arguments.bandwidths]:
            bandwidth = megabytes * 1e6 if megabytes is not None else None
            balanced_file = os.path.join(directory, f"balanced-{megabytes}.beton")
            profile, plan = tune(jpeg_file, balanced_file, batch_size=64, read_bandwidth=bandwidth, output_size=160,
                                 progress=False)
            proportion_file = write(os.path.join(directory, f"proportion-{megabytes}.beton"), JpegDataset(jpegs),
                                    write_mode="proportion", compress_probability=1 - plan.raw_fraction)
            loaders = {"all JPEG": loader(jpeg_file, OrderOption.QUASI_RANDOM, bandwidth),
                       "all raw": loader(raw_file, OrderOption.QUASI_RANDOM, bandwidth),
                       "proportion (same fraction)": loader(proportion_file, OrderOption.QUASI_RANDOM, bandwidth),
                       "balanced (beton tune)": loader(balanced_file, OrderOption.BALANCED, bandwidth)}
            measured = measure(loaders, arguments.repeats)
            for each in loaders.values():
                each.close()
            best_single = max(measured["all JPEG"]["images_per_s"], measured["all raw"]["images_per_s"])
            result["rates"]["page cache" if megabytes is None else f"{megabytes:g} MB/s"] = {
                "planned_raw_fraction": round(plan.raw_fraction, 3),
                "host_profile": dataclasses.asdict(profile),
                "predicted_images_per_s": {k: round(v) for k, v in plan.predicted_images_per_s.items()},
                "measured_read_mb_per_s": round(profile.read_bytes_per_second / 1e6),
                "contenders": measured,
                "balanced_vs_best_single_format": round(measured["balanced (beton tune)"]["images_per_s"] / best_single, 2),
                "balanced_vs_proportion": round(measured["balanced (beton tune)"]["images_per_s"]
                                                / measured["proportion (same fraction)"]["images_per_s"], 2),
            }
            print(json.dumps(result["rates"], indent=2)[-1500:])
    save_json(RESULTS, result)
    print(markdown(result))


def markdown(result: dict) -> str:
    lines = ["| read rate | raw fraction | all JPEG | all raw | proportion | balanced | balanced / best single | "
             "balanced / proportion |", "|---|---|---|---|---|---|---|---|"]
    for rate, row in result["rates"].items():
        c = row["contenders"]
        lines.append(f"| {rate} | {row['planned_raw_fraction']:.0%} | {c['all JPEG']['images_per_s']} | "
                     f"{c['all raw']['images_per_s']} | {c['proportion (same fraction)']['images_per_s']} | "
                     f"{c['balanced (beton tune)']['images_per_s']} | {row['balanced_vs_best_single_format']} | "
                     f"{row['balanced_vs_proportion']} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
