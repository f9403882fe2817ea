"""What checking content digests on read costs (issue #25 item 6): ``python benchmarks/content_check.py [--quick]``.

The image benchmark's scenario a (``beton bench``: RandomResizedCrop-160 of ~256 px JPEGs, batches of 64, the
bench's workers) read with ``verify_content=False`` and ``verify_content=True``, through the OS cache and the
process cache. A Loader hashes each page once, the first time it loads it, so the cost falls on a Loader's first
epoch: every measured epoch here is the first of a fresh Loader (built inside the timing, on both sides), the two
sides alternating round by round, and the result is the paired ratio (median over rounds of checked/plain time):
the cost of hashing the whole dataset once, as a share of an epoch. Later epochs of the same Loader hash nothing.
Also the raw BLAKE2b-256 rate of this machine, for scale. Results: benchmarks/results/content_check.json.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import tempfile
import time

import numpy as np

from beton.tools.bench import contenders as c
from beton.tools.bench.data import make_jpegs
from beton.tools.bench.report import run_header, save_json
from beton.tools.bench.timing import alternating_runs, paired_ratio

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "content_check.json")


class FreshLoaders:
    """An iterable whose every pass is the first epoch of a new Loader (built within the pass)."""

    def __init__(self, path: str, task: c.ImageTask, **options: object) -> None:
        self.path, self.task, self.options = path, task, options

    def __iter__(self):
        with c.beton_images(self.path, self.task, **self.options) as loader:
            yield from loader


def blake2b_rate(megabytes: int = 256) -> float:
    data = np.random.default_rng(0).integers(0, 256, 8 << 20, dtype=np.uint8)
    start = time.perf_counter()
    for _ in range(megabytes // 8):
        hashlib.blake2b(data, digest_size=32).digest()
    return megabytes / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer images and rounds")
    parser.add_argument("--images", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--output", default=RESULTS)
    arguments = parser.parse_args()
    count = arguments.images or (500 if arguments.quick else 2000)
    repeats = arguments.repeats or (3 if arguments.quick else 7)
    task = c.ImageTask("rrc", 160, 64)
    result = {**run_header(), "images": count, "repeats": repeats, "scenario": "a. RRC-160, ~256 px JPEGs",
              "blake2b_MB_per_s": round(blake2b_rate())}
    with tempfile.TemporaryDirectory() as directory:
        path = c.write_beton_images(make_jpegs(count, 256), os.path.join(directory, "small.beton"))
        result["file_MB"] = round(os.path.getsize(path) / 1e6, 1)
        for name, os_cache in (("os_cache", True), ("process_cache", False)):
            runs = alternating_runs({"plain": FreshLoaders(path, task, os_cache=os_cache),
                                     "checked": FreshLoaders(path, task, os_cache=os_cache, verify_content=True)},
                                    repeats)
            ratio = paired_ratio(runs["plain"], runs["checked"])  # rates: plain/checked = checked time / plain time
            result[name] = {"images_per_s": {side: round(statistics.median(rates)) for side, rates in runs.items()},
                            "first_epoch_cost_percent": round(100 * (ratio - 1), 1),
                            "rounds": {side: [round(rate) for rate in rates] for side, rates in runs.items()}}
            print(name, result[name], flush=True)
    save_json(arguments.output, result)
    print(result)


if __name__ == "__main__":
    main()
