"""Converting an image folder on Ray (``beton.ray.write_dataset``) against ``beton convert imagefolder``, with the
same 2 workers on one node.

    pip install "beton[ray]"
    python benchmarks/ray_build.py [--images 2000] [--repeats 3] [--workers 2] [--per-shard 250]

The folder is benchmarks/convert.py's (10 classes of ImageNet-sized JPEG photos). Two pairs of contenders, each
doing the same work per image:

* stored as they are: ``convert imagefolder`` (``--workers`` writer processes: read, check by a 1/8-scale decode,
  store the JPEG) against Ray (a local Ray of ``--workers`` CPUs: a map step reads the files, each write task
  checks and stores its block's images through the same field into one shard of ``--per-shard`` images);
* resized: ``convert --max-resolution 256`` (decode, shrink, re-encode) against Ray resizing in its map step
  (decode, shrink) and encoding in the write tasks.

The local Ray is started once, before timing (its start and its workers' first imports are a cluster's one-time
cost, not a conversion's); each contender runs once untimed, then the contenders alternate within each round
(the machine is shared: its speed drifts) and the median of the per-round ratios is reported. How busy the
machine was with other work is measured as in benchmarks/convert.py. Writes benchmarks/results/ray_build.json.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time

import cv2
import numpy as np
import ray
import ray.data
import simplejpeg

import beton.convert
from beton.fields import IntField
from beton.ray import write_dataset
from beton.tools.bench.report import argument_parser, run_header, save_json
from beton.tools.convert import ImageFolder
from beton.tools.convert.images import ImageOptions

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from convert import busy_seconds, make_folder  # noqa: E402 - the same folder and load measure as convert.py

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "ray_build.json")
MAX_RESOLUTION = 256


def read_files(batch: dict[str, np.ndarray]) -> dict[str, list]:
    """Ray's map step: each file's bytes (stored as they are, checked by the field in the write task)."""
    images = []
    for path in batch["path"]:
        with open(path, "rb") as file:
            images.append(file.read())
    return {"image": images, "label": batch["label"]}


def read_and_resize(batch: dict[str, np.ndarray]) -> dict[str, list]:
    """Ray's map step: each file decoded and shrunk to at most MAX_RESOLUTION on its longer side, as
    ``--max-resolution`` does."""
    images = []
    for path in batch["path"]:
        with open(path, "rb") as file:
            image = simplejpeg.decode_jpeg(file.read(), colorspace="RGB")
        scale = MAX_RESOLUTION / max(image.shape[:2])
        if scale < 1:
            size = (max(1, round(image.shape[1] * scale)), max(1, round(image.shape[0] * scale)))
            image = cv2.resize(image, size, interpolation=cv2.INTER_AREA)
        images.append(image)
    return {"image": images, "label": batch["label"]}


def ray_build(root: str, output: str, per_shard: int, step, **image_options: object) -> int:
    samples = ImageFolder(root).samples
    rows = [{"path": path, "label": label} for path, label in samples]
    dataset = ray.data.from_items(rows, override_num_blocks=-(-len(rows) // per_shard)).map_batches(
        step, batch_size=None)
    fields = {"image": ImageOptions(**image_options).field(), "label": IntField()}
    return write_dataset(dataset, output, fields, overwrite=True).num_samples


def main() -> None:
    parser = argument_parser(__doc__, images=2000, repeats=3)
    parser.add_argument("--workers", type=int, default=2, help="writer processes, and the local Ray's CPUs")
    parser.add_argument("--per-shard", type=int, default=250, help="images per shard (per Ray block)")
    arguments = parser.parse_args()
    workers, count = arguments.workers, arguments.images
    ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
    try:
        with tempfile.TemporaryDirectory() as directory:
            root = os.path.join(directory, "train")
            input_bytes = make_folder(root, count)
            one_file, shards = os.path.join(directory, "out.beton"), os.path.join(directory, "shards")
            contenders = {
                "convert imagefolder": lambda: beton.convert.imagefolder(
                    root, one_file, num_workers=workers, progress=False).num_samples,
                "ray": lambda: ray_build(root, shards, arguments.per_shard, read_files),
                "convert --max-resolution 256": lambda: beton.convert.imagefolder(
                    root, one_file, num_workers=workers, progress=False, max_resolution=MAX_RESOLUTION).num_samples,
                "ray, resized in the map step": lambda: ray_build(root, shards, arguments.per_shard, read_and_resize,
                                                                  max_resolution=MAX_RESOLUTION),
            }
            for name, run in contenders.items():  # warm-up: page cache, imports, Ray's workers
                if run() != count:
                    raise SystemExit(f"{name} wrote the wrong number of images")
            busy_before, own_before = busy_seconds()
            wall_before = time.perf_counter()
            seconds: dict[str, list[float]] = {name: [] for name in contenders}
            for _ in range(arguments.repeats):
                for name, run in contenders.items():
                    start = time.perf_counter()
                    run()
                    seconds[name].append(time.perf_counter() - start)
            wall = time.perf_counter() - wall_before
            busy_after, own_after = busy_seconds()
    finally:
        ray.shutdown()
    rates = {name: [count / value for value in values] for name, values in seconds.items()}

    def ratio(a: str, b: str) -> float:
        return round(statistics.median(x / y for x, y in zip(rates[a], rates[b])), 3)

    result = {
        **run_header(), "images": count, "input_mb": round(input_bytes / 1e6, 1), "workers": workers,
        "images_per_shard": arguments.per_shard, "repeats": arguments.repeats, "ray": ray.__version__,
        "images_per_s": {name: round(statistics.median(values)) for name, values in rates.items()},
        "ray_relative_to_convert": {"stored as they are": ratio("ray", "convert imagefolder"),
                                    "resized": ratio("ray, resized in the map step", "convert --max-resolution 256")},
        "machine_load": {"others_cores_busy": round(((busy_after - busy_before) - (own_after - own_before)) / wall, 2),
                         "this_benchmark_cores_busy": round((own_after - own_before) / wall, 2),
                         "cores": os.cpu_count(), "seconds": round(wall, 1),
                         "note": "own CPU time counts this process and its children; Ray's workers are not its "
                                 "children, so their work shows as others' (compare with convert.json's figure)"},
        "rerun": "python benchmarks/ray_build.py --images 2000 --repeats 3 --workers 2 --per-shard 250",
    }
    save_json(RESULTS, result)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
