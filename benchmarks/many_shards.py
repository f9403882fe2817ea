"""A dataset of very many tiny shards, read under the common descriptor limit, against one merged file.

    python benchmarks/many_shards.py [--shards 100000] [--limit 1024] [--without-tables] [--output FILE.json]

``--shards`` files of 2 samples each (a 16-byte array and a label: per-shard costs dominate) are listed in a
manifest file; one file holds the same samples in the same order. Shards are copies of 97 distinct files
(writing 100,000 files costs minutes; copying them, seconds). The manifest and its tables file (every shard's header
and tables in one file) are written by ``beton index`` (:func:`beton.dataset.index`, timed: every shard validated,
in one process), the manifest without a tables file from the shards' known header hashes. Each measurement runs in a fresh process
whose descriptor limit is lowered to ``--limit`` (as a login shell's default): the manifest's read and the
dataset's opening (the tables file read and checked; with ``--without-tables``, also a manifest without one, whose
opening reads and checks every shard's tables; no shard left open), one epoch of each order
(samples/s, the peak of open descriptors sampled every batch), and the process's peak RSS. The same epochs over
the merged file give the ratio. The page cache is warm (the files were just written); the machine is shared
(2 cores, other jobs running), so figures are indicative and the ratios matter more than the absolute values.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

import beton
from beton.dataset.manifest import Manifest, field_specs, header_digest
from beton.dataset import index
from beton.fields import IntField, NDArrayField
from beton.storage.reader import read_head

TEMPLATES = 97
SAMPLES_PER_SHARD = 2
FIELDS = {"values": NDArrayField(np.dtype("<u2"), (8,)), "label": IntField()}
ORDERS = ("SEQUENTIAL", "RANDOM")


class Samples:
    """Sample i of template t: an array and a label that name both."""

    def __init__(self, templates: list[int]) -> None:
        self.templates = templates

    def __len__(self) -> int:
        return len(self.templates) * SAMPLES_PER_SHARD

    def __getitem__(self, index: int) -> tuple[np.ndarray, int]:
        template, sample = divmod(index, SAMPLES_PER_SHARD)
        label = self.templates[template] * SAMPLES_PER_SHARD + sample
        return np.arange(8, dtype="<u2") + label, label


def build(directory: str, shards: int) -> tuple[str, str, str, float]:
    """The shards, their manifest file with its tables file (by ``beton index``) and one without, and the merged
    file. Returns (manifest path, manifest without tables file, merged path, seconds ``beton index`` took)."""
    options = {"num_workers": 0, "progress": False}
    templates = []
    for t in range(TEMPLATES):
        templates.append(os.path.join(directory, f"template-{t:03d}.beton"))
        beton.DatasetWriter(templates[-1], FIELDS, **options).from_indexed_dataset(Samples([t]))
    heads = [read_head(path) for path in templates]
    entries = []
    for k in range(shards):
        folder = os.path.join(directory, "shards", f"{k // 1000:04d}")
        if k % 1000 == 0:
            os.makedirs(folder)
        path = os.path.join(folder, f"part-{k:06d}.beton")
        shutil.copyfile(templates[k % TEMPLATES], path)
        entries.append((path, SAMPLES_PER_SHARD, header_digest(heads[k % TEMPLATES].header)))
    manifest_path, without_tables = os.path.join(directory, "dataset.json"), os.path.join(directory, "plain.json")
    Manifest.of(entries, field_specs(heads[0].descriptors)).write(without_tables)
    start = time.perf_counter()
    index(manifest_path, [path for path, _, _ in entries])
    indexed = time.perf_counter() - start
    merged = os.path.join(directory, "merged.beton")
    beton.DatasetWriter(merged, FIELDS, **options).from_indexed_dataset(
        Samples([k % TEMPLATES for k in range(shards)]), chunksize=10_000)
    return manifest_path, without_tables, merged, indexed


MEASURE = """
import json, os, resource, sys, time
limit, path, orders = int(sys.argv[1]), sys.argv[2], sys.argv[3].split(",")
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
import beton
from beton.dataset import read_manifest
from beton.dataset.union import open_dataset
def descriptors():
    return len(os.listdir("/proc/self/fd"))
result = {"descriptors at start": descriptors()}
if path.endswith(".json"):
    start = time.perf_counter()
    manifest = read_manifest(path)
    opened = time.perf_counter()
    dataset = open_dataset(manifest)
    result["manifest read (s)"], result["open (s)"] = opened - start, time.perf_counter() - opened
    result["descriptors after open"] = descriptors()
    dataset.close()
    source = manifest
else:
    source = path
for order in orders:
    start = time.perf_counter()
    loader = beton.Loader(source, batch_size=256, num_workers=2, order=beton.OrderOption[order], seed=1)
    built, peak, samples, labels = time.perf_counter() - start, descriptors(), 0, 0
    start = time.perf_counter()
    for values, label in loader:
        samples += len(label)
        labels += int(label.sum())
        peak = max(peak, descriptors())
    elapsed = time.perf_counter() - start
    loader.close()
    result[order] = {"Loader built (s)": built, "epoch (s)": elapsed, "samples/s": samples / elapsed,
                     "samples": samples, "sum of labels": labels, "peak descriptors": peak,
                     "descriptors after close": descriptors()}
result["peak RSS (MiB)"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps(result))
"""


def measure(path: str, limit: int) -> dict:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    result = subprocess.run([sys.executable, "-c", MEASURE, str(limit), path, ",".join(ORDERS)], env=environment,
                            capture_output=True, text=True, check=False)
    if result.returncode:
        raise RuntimeError(result.stderr[-4000:])
    return json.loads(result.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=100_000)
    parser.add_argument("--limit", type=int, default=1024, help="the measuring processes' descriptor limit")
    parser.add_argument("--output", default=None)
    parser.add_argument("--without-tables", action="store_true",
                        help="also measure the manifest without its tables file (every shard's tables read on opening)")
    arguments = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="beton-many-shards-") as directory:
        start = time.perf_counter()
        manifest, without_tables, merged, indexed = build(directory, arguments.shards)
        built = time.perf_counter() - start - indexed
        shards = measure(manifest, arguments.limit)
        plain = measure(without_tables, arguments.limit) if arguments.without_tables else None
        single = measure(merged, arguments.limit)
    for order in ORDERS:
        if any(result[order]["sum of labels"] != single[order]["sum of labels"]
               for result in (shards, plain) if result):
            raise SystemExit(f"{order}: the shards' labels differ from the merged file's")
    report = {
        "command": "python benchmarks/many_shards.py " + " ".join(sys.argv[1:]),
        "machine": {"python": platform.python_version(), "machine": platform.machine(), "cores": os.cpu_count(),
                    "note": "shared machine, other jobs running: indicative figures"},
        "date": time.strftime("%Y-%m-%d"),
        "shards": arguments.shards, "samples": arguments.shards * SAMPLES_PER_SHARD,
        "descriptor limit": arguments.limit, "files built (s)": built, "beton index (s)": indexed,
        "default max open shards": beton.dataset.union.DEFAULT_OPEN_SHARDS,
        "manifest of shards (with its tables file)": shards,
        **({"manifest of shards without a tables file": plain} if plain else {}), "one merged file": single,
        "samples/s, shards / merged": {order: shards[order]["samples/s"] / single[order]["samples/s"]
                                       for order in ORDERS},
    }
    text = json.dumps(report, indent=1)
    print(text)
    if arguments.output:
        with open(arguments.output, "w") as file:
            file.write(text + "\n")


if __name__ == "__main__":
    main()
