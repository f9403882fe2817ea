"""What checking content digests on read costs (issue #25 item 6): ``python benchmarks/content_check.py [--quick]``.

The image benchmark's scenario a (``beton bench``: RandomResizedCrop-160 of ~256 px JPEGs, batches of 64, the
bench's workers) read with ``verify_content=False`` and ``verify_content=True``, through the OS cache and the
process cache. A Loader hashes each page once, the first time it loads it, so the cost falls on a Loader's first
epoch: every measured epoch here is the first of a fresh Loader (built inside the timing, on both sides), the two
sides alternating round by round, and the result is the paired ratio (median over rounds of checked/plain time):
the cost of hashing the whole dataset once, as a share of an epoch, with the quartiles of the rounds' costs for
its spread. Later epochs of the same Loader hash nothing. Where the time goes: ``first_batch_later_s``, how much
later (medians) a checked epoch's first batch arrives, since its pages are hashed before its payloads are read.

Each epoch's wall time and the process's CPU time (every thread's: the workers and the page reader are threads)
are recorded. On a machine shared with other jobs the CPU time is the steadier figure: other jobs stretch an epoch's
wall time by however long they hold the cores, but not the CPU time this process spends. Steadier still, and what
the cost is made of: one more checked first epoch is run with the hash function counted (``hashing``: bytes hashed,
which is the file's heap once if each page is hashed once, and the hashing threads' own CPU time, which other jobs
do not stretch), its CPU share of a plain first epoch (``hashing_cpu_share_percent``). Also the raw SHA-256 rate
of this machine in thread CPU time, for scale (and BLAKE2b-256's, for comparison).
``--output`` names the results file (default benchmarks/results/content_check.json).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import tempfile
import threading
import time

import numpy as np

import beton.storage.digests as digests
from beton.tools.bench import contenders as c
from beton.tools.bench.data import make_jpegs
from beton.tools.bench.report import run_header, save_json

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "content_check.json")


class FreshLoaders:
    """An iterable whose every pass is the first epoch of a new Loader (built within the pass)."""

    def __init__(self, path: str, task: c.ImageTask, **options: object) -> None:
        self.path, self.task, self.options = path, task, options

    def __iter__(self):
        with c.beton_images(self.path, self.task, **self.options) as loader:
            yield from loader


def first_epochs(sides: dict[str, FreshLoaders], repeats: int) -> dict[str, dict[str, list[float]]]:
    """Per side, the wall and CPU seconds of ``repeats`` first epochs, and the wall seconds until each one's first
    batch (a Loader built and its first batch's pages hashed), the sides alternating round by round (after one
    warm-up epoch each: compilation, page cache, worker start)."""
    times: dict[str, dict[str, list[float]]] = {name: {"wall_s": [], "cpu_s": [], "first_batch_s": []}
                                                for name in sides}
    for warm_up in sides.values():
        sum(1 for _ in warm_up)
    for _ in range(repeats):
        for name, loaders in sides.items():
            wall, cpu = time.perf_counter(), time.process_time()
            batches = iter(loaders)
            next(batches)
            times[name]["first_batch_s"].append(time.perf_counter() - wall)
            for _ in batches:
                pass
            times[name]["wall_s"].append(time.perf_counter() - wall)
            times[name]["cpu_s"].append(time.process_time() - cpu)
    return times


def paired_cost(plain: list[float], checked: list[float]) -> float:
    """Percent more time checked than plain: the median over rounds of the ratio within each round."""
    return round(100 * (statistics.median(b / a for a, b in zip(plain, checked)) - 1), 1)


def paired_quartiles(plain: list[float], checked: list[float]) -> list[float]:
    """The first and third quartiles of the rounds' costs (percent), for the spread around :func:`paired_cost`."""
    low, _, high = statistics.quantiles([100 * (b / a - 1) for a, b in zip(plain, checked)], n=4)
    return [round(low, 1), round(high, 1)]


def hash_rate(name: str, megabytes: int = 256) -> float:
    """MB per second of this thread's CPU time that ``hashlib.new(name)`` hashes (32-byte digests)."""
    data = np.random.default_rng(0).integers(0, 256, 8 << 20, dtype=np.uint8)
    start = time.thread_time()
    for _ in range(megabytes // 8):
        (hashlib.blake2b(data, digest_size=32) if name == "blake2b" else hashlib.new(name, data)).digest()
    return megabytes / (time.thread_time() - start)


def hashing(loaders: FreshLoaders) -> dict[str, float]:
    """One first epoch with the hash function counted: calls, MB hashed and the CPU seconds of the threads while
    they hashed (each thread's own CPU time, summed)."""
    honest, lock, totals = digests.digest, threading.Lock(), {"calls": 0, "MB": 0.0, "cpu_s": 0.0}

    def counted(data):
        start = time.thread_time()
        value = honest(data)
        spent = time.thread_time() - start
        with lock:
            totals["calls"] += 1
            totals["MB"] += memoryview(data).nbytes / 1e6
            totals["cpu_s"] += spent
        return value

    digests.digest = counted
    try:
        for _ in loaders:
            pass
    finally:
        digests.digest = honest
    return {name: round(value, 3) for name, value in totals.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer images and rounds")
    parser.add_argument("--images", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--output", default=RESULTS)
    arguments = parser.parse_args()
    count = arguments.images or (500 if arguments.quick else 2000)
    repeats = arguments.repeats or (3 if arguments.quick else 15)
    task = c.ImageTask("rrc", 160, 64)
    result = {**run_header(), "load_average_1min_at_start": round(os.getloadavg()[0], 1), "images": count, "repeats": repeats, "scenario": "a. RRC-160, ~256 px JPEGs",
              "blake2b_MB_per_s": round(hash_rate("blake2b")),
              "sha256_MB_per_s": round(hash_rate("sha256"))}  # the format's digest, and BLAKE2b for comparison
    with tempfile.TemporaryDirectory() as directory:
        path = c.write_beton_images(make_jpegs(count, 256), os.path.join(directory, "small.beton"))
        result["file_MB"] = round(os.path.getsize(path) / 1e6, 1)
        for name, os_cache in (("os_cache", True), ("process_cache", False)):
            times = first_epochs({"plain": FreshLoaders(path, task, os_cache=os_cache),
                                  "checked": FreshLoaders(path, task, os_cache=os_cache, verify_content=True)},
                                 repeats)
            hashed = hashing(FreshLoaders(path, task, os_cache=os_cache, verify_content=True))
            result[name] = {
                "hashing": hashed,
                "hashing_cpu_share_percent": round(100 * hashed["cpu_s"] / statistics.median(times["plain"]["cpu_s"]),
                                                   1),
                **{f"first_epoch_{kind}_cost_percent": paired_cost(times["plain"][kind], times["checked"][kind])
                   for kind in ("wall_s", "cpu_s")},
                **{f"first_epoch_{kind}_cost_quartiles": paired_quartiles(times["plain"][kind], times["checked"][kind])
                   for kind in ("wall_s", "cpu_s")},
                "first_batch_later_s": round(statistics.median(times["checked"]["first_batch_s"])
                                             - statistics.median(times["plain"]["first_batch_s"]), 3),
                "median_s": {side: {kind: round(statistics.median(values), 3) for kind, values in kinds.items()}
                             for side, kinds in times.items()},
                "rounds": {side: {kind: [round(value, 3) for value in values] for kind, values in kinds.items()}
                           for side, kinds in times.items()}}
            print(name, result[name], flush=True)
    save_json(arguments.output, result)
    print(result)


if __name__ == "__main__":
    main()
