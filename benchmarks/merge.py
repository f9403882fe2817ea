"""What ``beton merge`` costs next to writing the dataset once, and what ``beton index`` costs.

    python benchmarks/merge.py [--shards 4] [--repeats 3] [--output benchmarks/results/merge.json]

Two datasets, each written once as one file and once as shards (``from_indexed_dataset(shard=(k, n))``, one
process each, as if on separate machines):

* ``photo-sized``: 4,000 samples of a 48 KiB byte string (the size of a ~500 px JPEG) and a label (~188 MiB);
* ``small samples``: 1,000,000 samples of a label and an 8-byte string (per-sample overhead dominates).

For each: the single write, the merge of the shards (which also checks every page's CRC32 and, for these
fields, every payload), ``index`` (every shard opened and validated) and ``dataset_manifest`` of a glob (headers
only), medians over ``--repeats`` rounds (the ratio of merge to single write: the median of the ratios within
each round); the merged file is checked to be byte-identical to the single write.
Writes use ``num_workers=0``; the page cache is warm (the shards were just written).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time

import numpy as np

import beton
from beton.fields import BytesField, IntField
from beton.dataset import dataset_manifest, index, merge


class Blobs:
    """Sample i: a byte string of ``size`` bytes (a rotation of one random block) and a label."""

    def __init__(self, count: int, size: int) -> None:
        self.count, self.size = count, size
        self.block = np.random.default_rng(0).integers(0, 256, size + 4096, dtype=np.uint8).tobytes()

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> tuple[bytes, int]:
        start = index % 4096
        return self.block[start : start + self.size], index % 1000


DATASETS = {"photo-sized": (4_000, 48 * 1024), "small samples": (1_000_000, 8)}
FIELDS = {"blob": BytesField(), "label": IntField()}


def timed(action) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def run(name: str, shards: int, repeats: int, directory: str) -> dict:
    count, size = DATASETS[name]
    dataset = Blobs(count, size)
    whole = os.path.join(directory, f"{name}.beton")

    def write_whole() -> None:
        beton.DatasetWriter(whole, FIELDS, num_workers=0, progress=False).from_indexed_dataset(dataset, chunksize=1000)

    paths = [os.path.join(directory, f"{name}-{k:05d}-of-{shards:05d}.beton") for k in range(shards)]
    for k, path in enumerate(paths):
        beton.DatasetWriter(path, FIELDS, num_workers=0, progress=False).from_indexed_dataset(
            dataset, shard=(k, shards), chunksize=1000)
    merged = os.path.join(directory, f"{name}-merged.beton")
    manifest = os.path.join(directory, f"{name}.json")
    rounds = []
    for _ in range(repeats):
        rounds.append({
            "write once (s)": timed(write_whole),
            "merge (s)": timed(lambda: merge(merged, paths)),
            "index (s)": timed(lambda: index(manifest, paths)),
            "dataset_manifest of a glob (s)": timed(lambda: dataset_manifest(
                os.path.join(directory, f"{name}-*-of-{shards:05d}.beton"))),
        })
    with open(merged, "rb") as a, open(whole, "rb") as b:
        identical = a.read() == b.read()
    file_bytes = os.path.getsize(whole)
    medians = {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
    return {"dataset": name, "samples": count, "payload_bytes": size, "shards": shards, "file_bytes": file_bytes,
            "merged_identical_to_single_write": identical, "medians": medians,
            "merge MB/s": file_bytes / medians["merge (s)"] / 1e6,
            # paired within each round: the shared host's speed drifts between rounds
            "merge / write once": statistics.median(r["merge (s)"] / r["write once (s)"] for r in rounds),
            "rounds": rounds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--output", default=None, help="write the results as JSON here")
    arguments = parser.parse_args()
    results = {"machine": {"python": platform.python_version(), "machine": platform.machine(),
                           "cores": os.cpu_count()}, "date": time.strftime("%Y-%m-%d"), "runs": []}
    with tempfile.TemporaryDirectory() as directory:
        for name in DATASETS:
            result = run(name, arguments.shards, arguments.repeats, directory)
            results["runs"].append(result)
            print(f"{name}: {result['samples']} samples, {result['file_bytes'] / 2**20:.1f} MiB, "
                  f"{result['shards']} shards; identical: {result['merged_identical_to_single_write']}")
            for key, value in result["medians"].items():
                print(f"  {key:34s} {value:8.3f}")
            print(f"  merge: {result['merge MB/s']:.0f} MB/s, {result['merge / write once']:.2f}x the single write")
    if arguments.output:
        with open(arguments.output, "w") as file:
            json.dump(results, file, indent=1)


if __name__ == "__main__":
    main()
