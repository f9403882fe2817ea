"""Loader engine benchmark: raw 3x32x32 uint8 images + int labels, batch 512, side by side in one run.

    python benchmarks/loader_raw.py [--samples N] [--repeats R] [--quick]

Measures, alternating repetitions and reporting medians:
* beton Loader (RANDOM, 2 threads, default pipelines) vs a torch DataLoader (2 worker processes, shuffle)
  over a memory-mapped numpy array of the same data, and vs FFCV 1.0.2 if it is importable;
* a 4-operation compilable pipeline (decode, two flips, normalize) fused into one stage vs the same
  operations compiled as separate stages;
* time from process start to the first batch in a fresh process, cold (empty kernel cache) and warm.
Images are crops of real photos. Writes benchmarks/results/loader_raw.json and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap

import numpy as np

import beton
from beton import Loader, OrderOption
from beton.loader import CompileOptions
from beton.tools.bench import contenders
from beton.tools.bench.data import ArrayDataset, make_raw_images
from beton.tools.bench.report import run_header, save_json
from beton.tools.bench.timing import alternating_rates
from beton.fields import IntField, NDArrayField
from beton.decoders import IntDecoder, NDArrayDecoder
from beton.transforms import ToTensor
from beton.transforms.flip import RandomHorizontalFlip, RandomVerticalFlip
from beton.transforms.normalize import NormalizeImage

BATCH_SIZE = 512
WORKERS = 2
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "loader_raw.json")


FIRST_BATCH_SCRIPT = textwrap.dedent("""
    import time, sys
    start = time.perf_counter()
    from beton import Loader
    from beton.loader import CompileOptions
    from beton.decoders import NDArrayDecoder
    from beton.transforms import ToTensor
    from beton.transforms.flip import RandomHorizontalFlip
    imported = time.perf_counter()
    loader = Loader(sys.argv[1], batch_size=512, num_workers=2, compile_options=CompileOptions(sys.argv[2]),
                    pipelines={"image": [NDArrayDecoder(), RandomHorizontalFlip(), ToTensor()]})
    next(iter(loader))
    done = time.perf_counter()
    print(done - start, done - imported)
""")


def first_batch_seconds(path: str, cache_dir: str) -> tuple[float, float]:
    run = subprocess.run([sys.executable, "-c", FIRST_BATCH_SCRIPT, path, cache_dir], capture_output=True,
                         text=True, check=True)
    total, after_import = map(float, run.stdout.split())
    return total, after_import


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=50_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="10,000 samples, 3 repeats")
    arguments = parser.parse_args()
    samples = 10_000 if arguments.quick else arguments.samples
    images, labels = make_raw_images(samples)
    with tempfile.TemporaryDirectory() as directory:
        path = contenders.write_beton_raw(images, labels, os.path.join(directory, "raw.beton"))
        loaders = {"beton": contenders.beton_raw(path, BATCH_SIZE),
                   "torch DataLoader": contenders.torch_raw(images, labels, directory, BATCH_SIZE)}
        ffcv = contenders.ffcv_raw(images, labels, directory, BATCH_SIZE)
        if isinstance(ffcv, str):
            print(f"FFCV skipped: {ffcv}")
        else:
            loaders["FFCV 1.0.2"] = ffcv
        throughput = alternating_rates(loaders, arguments.repeats)

        hwc_path = os.path.join(directory, "hwc.beton")
        beton.DatasetWriter(hwc_path, {"image": NDArrayField(np.uint8, (32, 32, 3)), "label": IntField()},
                            num_workers=WORKERS, progress=False).from_indexed_dataset(
            ArrayDataset(np.ascontiguousarray(images.transpose(0, 2, 3, 1)), labels))
        four_ops = {"image": [NDArrayDecoder(), RandomHorizontalFlip(), RandomVerticalFlip(),
                              NormalizeImage([125.0, 123.0, 114.0], [63.0, 62.0, 66.0]), ToTensor()],
                    "label": [IntDecoder(), ToTensor()]}
        fusion = alternating_rates({
            "fused": Loader(hwc_path, batch_size=BATCH_SIZE, num_workers=WORKERS, order=OrderOption.RANDOM,
                            seed=0, pipelines=four_ops),
            "separate": Loader(hwc_path, batch_size=BATCH_SIZE, num_workers=WORKERS, order=OrderOption.RANDOM,
                               seed=0, pipelines=four_ops,
                               compile_options=CompileOptions(fuse_stages=False)),
        }, arguments.repeats)

        cold_cache = os.path.join(directory, "cold-kernels")
        cold = first_batch_seconds(path, cold_cache)
        warm = first_batch_seconds(path, cold_cache)
    result = {
        **run_header(),
        "samples": samples,
        "batch_size": BATCH_SIZE,
        "samples_per_s": {name: round(value) for name, value in throughput.items()},
        "ratios_vs_beton": {name: round(throughput["beton"] / value, 2) for name, value in throughput.items()},
        "fusion_samples_per_s": {name: round(value) for name, value in fusion.items()},
        "fused_over_separate": round(fusion["fused"] / fusion["separate"], 2),
        "first_batch_s": {"cold_total": round(cold[0], 2), "cold_after_import": round(cold[1], 2),
                          "warm_total": round(warm[0], 2), "warm_after_import": round(warm[1], 2)},
    }
    save_json(RESULTS, result)
    print(json.dumps(result, indent=2))
    print("\n| loader | samples/s | beton is ×faster |\n|---|---|---|")
    for name, value in throughput.items():
        print(f"| {name} | {value:,.0f} | {throughput['beton'] / value:.2f} |")


if __name__ == "__main__":
    main()
