"""``convert imagefolder`` throughput on a 2,000-photo folder, against simply reading the same files.

    python benchmarks/convert.py [--images 2000] [--repeats 3] [--workers 2]

The folder: 10 class folders of JPEG photos (quality 90, shorter side 375 and longer 375-560 px, like ImageNet's
average photo), made from crops, rescales and mirrors of scikit-image's bundled photos. Contenders, run in
alternating rounds after one warm-up each:

* ``read files``: open and read every file, one process: what any tool pays to look at the data; from the page
  cache, and from the disk (``cold``: each file dropped from the page cache first with posix_fadvise);
* ``read + check (1 thread)``: the same, plus the check every stored JPEG gets (header, 1/8-scale decode);
* ``convert imagefolder``: ``beton.convert.imagefolder`` with ``--workers`` writer processes (each JPEG checked,
  then given restart markers, losslessly) into a file in the same temporary folder, from the page cache and from
  the disk;
* ``convert, no restart markers``: the same with ``restart_markers=False``: JPEGs checked and stored byte for
  byte, so that the transcode's cost shows;
* ``DatasetWriter, unchecked``: the same files through a plain ``RGBImageField(restart_markers=False)``, which
  stores JPEG bytes without decoding them: what the check costs;
* ``convert --max-resolution 256``: every photo decoded, shrunk and re-encoded.

Ratios are taken within each round (the machine's speed drifts: it is shared) and the median is reported.
How busy the machine was with other work during the run is measured from /proc/stat minus this process's own
CPU time. Writes benchmarks/results/convert.json and prints a Markdown table.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time

import numpy as np
import simplejpeg

import beton.convert
from beton import DatasetWriter
from beton.fields import IntField, RGBImageField
from beton.tools.bench.report import argument_parser, run_header, save_json
from beton.tools.convert import ImageFolder
from beton.tools.sample_photos import photo_crop

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "convert.json")
CLASSES = 10


def make_folder(root: str, count: int) -> int:
    """``count`` JPEG photos in ``CLASSES`` class folders; returns their total size in bytes."""
    rng = np.random.default_rng(2000)
    total = 0
    for index in range(count):
        long_side = int(375 * rng.uniform(1.0, 1.5))
        height, width = (375, long_side) if index % 3 else (long_side, 375)
        folder = os.path.join(root, f"class{index % CLASSES:02d}")
        os.makedirs(folder, exist_ok=True)
        data = simplejpeg.encode_jpeg(photo_crop(index, height, width, seed=2000), quality=90)
        with open(os.path.join(folder, f"{index:05d}.jpg"), "wb") as file:
            file.write(data)
        total += len(data)
    return total


def read_files(paths: list[str], check: bool = False) -> None:
    for path in paths:
        with open(path, "rb") as file:
            data = file.read()
        if check:
            simplejpeg.decode_jpeg_header(data)
            simplejpeg.decode_jpeg(data, min_factor=8, min_width=1)


def drop_from_cache(paths: list[str]) -> None:
    """Ask the kernel to forget the files' cached pages, so the next read comes from the disk."""
    for path in paths:
        descriptor = os.open(path, os.O_RDONLY)
        try:
            os.fsync(descriptor)  # dirty pages (a file just written) would stay
            os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(descriptor)


def busy_seconds() -> tuple[float, float]:
    """(CPU seconds every process on the machine has run, this process's and its children's), so far."""
    with open("/proc/stat") as stat:
        fields = [int(value) for value in stat.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle and iowait
    ticks = os.sysconf("SC_CLK_TCK")
    times = os.times()
    return (sum(fields[:8]) - idle) / ticks, times.user + times.system + times.children_user + times.children_system


def main() -> None:
    parser = argument_parser(__doc__, images=2000, repeats=3)
    parser.add_argument("--workers", type=int, default=2, help="writer processes for the conversions")
    arguments = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        root = os.path.join(directory, "train")
        input_bytes = make_folder(root, arguments.images)
        paths = [path for path, _ in ImageFolder(root).samples]
        output = os.path.join(directory, "out.beton")
        workers = arguments.workers

        def unchecked() -> None:
            folder = ImageFolder(root)
            fields = {"image": RGBImageField(write_mode="jpg", restart_markers=False), "label": IntField()}
            DatasetWriter(output, fields, num_workers=workers, progress=False).from_indexed_dataset(folder)

        def convert(**options: object) -> None:
            beton.convert.imagefolder(root, output, num_workers=workers, progress=False, **options)

        cold = lambda: drop_from_cache(paths)  # noqa: E731 - untimed preparation of the cold runs
        contenders = {  # name -> (untimed preparation, timed run)
            "read files": (None, lambda: read_files(paths)),
            "read files, cold": (cold, lambda: read_files(paths)),
            "read + check (1 thread)": (None, lambda: read_files(paths, check=True)),
            "convert imagefolder": (None, convert),
            "convert imagefolder, cold": (cold, convert),
            "convert, no restart markers": (None, lambda: convert(restart_markers=False)),
            "DatasetWriter, unchecked": (None, unchecked),
            "convert --max-resolution 256": (None, lambda: convert(max_resolution=256)),
        }
        for _, run in contenders.values():
            run()  # warm-up: page cache, imports, worker start
        busy_before, own_before = busy_seconds()
        wall_before = time.perf_counter()
        seconds: dict[str, list[float]] = {name: [] for name in contenders}
        for _ in range(arguments.repeats):
            for name, (prepare, run) in contenders.items():
                if prepare is not None:
                    prepare()
                start = time.perf_counter()
                run()
                seconds[name].append(time.perf_counter() - start)
        wall = time.perf_counter() - wall_before
        busy_after, own_after = busy_seconds()
        output_bytes = os.path.getsize(output)
    count = arguments.images
    rates = {name: [count / value for value in values] for name, values in seconds.items()}
    read, cold_read = rates["read files"], rates["read files, cold"]
    result = {
        **run_header(), "images": count, "input_mb": round(input_bytes / 1e6, 1), "writer_processes": workers,
        "images_per_s": {name: round(statistics.median(values)) for name, values in rates.items()},
        "input_mb_per_s": {name: round(statistics.median(values) * input_bytes / count / 1e6, 1)
                           for name, values in rates.items()},
        "relative_to_read_files": {name: round(statistics.median(a / b for a, b in zip(values, read)), 4)
                                   for name, values in rates.items()},
        "relative_to_read_files_cold": {name: round(statistics.median(a / b for a, b in zip(values, cold_read)), 3)
                                        for name, values in rates.items()},
        "check_cost": round(statistics.median(a / b for a, b in zip(rates["DatasetWriter, unchecked"],
                                                                     rates["convert, no restart markers"])), 3),
        "restart_markers_cost": round(statistics.median(a / b for a, b in zip(rates["convert, no restart markers"],
                                                                               rates["convert imagefolder"])), 3),
        "machine_load": {"others_cores_busy": round(((busy_after - busy_before) - (own_after - own_before)) / wall, 2),
                         "this_benchmark_cores_busy": round((own_after - own_before) / wall, 2),
                         "cores": os.cpu_count(), "seconds": round(wall, 1)},
        "last_output_mb": round(output_bytes / 1e6, 1),
    }
    save_json(RESULTS, result)
    print(json.dumps(result, indent=2))
    print("\n| contender | images/s | input MB/s | vs reading the files (cached) | vs reading them from disk |\n"
          "|---|---|---|---|---|")
    for name in contenders:
        print(f"| {name} | {result['images_per_s'][name]:,} | {result['input_mb_per_s'][name]:,} | "
              f"{result['relative_to_read_files'][name]:.3f} | {result['relative_to_read_files_cold'][name]:.3f} |")


if __name__ == "__main__":
    main()
