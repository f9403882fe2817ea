"""Two source trees of beton on one image pipeline, in alternating fresh processes: did a change cost speed?

    python benchmarks/paired_trees.py TREE_A TREE_B [--pairs 10] [--side 256] [--task rrc|center]
        [--size 160] [--images 2000] [--epochs 3] [--output results.json]

Each tree is a checkout (``git worktree add /tmp/old <commit>``). The same photo JPEGs (``make_jpegs`` of
the tree running this script) are written once per tree by that tree's own writer; then each pair runs one
process per tree (order alternating between pairs), each a warm-up epoch and ``--epochs`` timed ones (their
median). The result is the median over pairs of B's rate / A's rate, with its quartiles: a shared host's speed drifts
between pairs far more than within one. Rates are images per second of wall time and per second of CPU time (all of the
process's threads): on a host loaded by others, the second moves far less. Uses only the FFCV-compatible public
names, which every tree has.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import subprocess
import sys
import tempfile

_CHILD = r"""
import pickle, statistics, sys, time
import cv2
cv2.setNumThreads(1)
from beton import Loader, OrderOption
from beton.fields import IntField, RGBImageField
from beton.fields.decoders import CenterCropRGBImageDecoder, IntDecoder, RandomResizedCropRGBImageDecoder
from beton.transforms import RandomHorizontalFlip, ToTensor, ToTorchImage
from beton.writer import DatasetWriter

command, path = sys.argv[1], sys.argv[2]
if command == "write":
    with open(sys.argv[3], "rb") as file:
        jpegs = pickle.load(file)
    DatasetWriter(path, {"image": RGBImageField(write_mode="jpg"), "label": IntField()}, num_workers=2,
                  progress=False).from_indexed_dataset([(jpeg, i) for i, jpeg in enumerate(jpegs)])
    sys.exit()
task, size, epochs = sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
if task == "rrc":
    image = [RandomResizedCropRGBImageDecoder((size, size)), RandomHorizontalFlip(), ToTensor(), ToTorchImage()]
else:
    image = [CenterCropRGBImageDecoder((size, size), ratio=224 / 256), ToTensor(), ToTorchImage()]
loader = Loader(path, batch_size=64, num_workers=2, order=OrderOption.RANDOM, seed=0, os_cache=True,
                pipelines={"image": image, "label": [IntDecoder(), ToTensor()]})
rates, cpu_rates = [], []
for epoch in range(epochs + 1):
    start, cpu_start = time.perf_counter(), time.process_time()
    count = sum(len(labels) for _, labels in loader)
    rates.append(count / (time.perf_counter() - start))
    cpu_rates.append(count / (time.process_time() - cpu_start))
print(statistics.median(rates[1:]), statistics.median(cpu_rates[1:]))
"""


def _run(tree: str, *arguments: str) -> str:
    environment = {**os.environ, "PYTHONPATH": os.path.abspath(tree)}
    done = subprocess.run([sys.executable, "-c", _CHILD, *arguments], env=environment, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{tree} {arguments[0]} failed:\n{done.stderr}")
    return done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trees", nargs=2)
    parser.add_argument("--pairs", type=int, default=10)
    parser.add_argument("--side", type=int, default=256)
    parser.add_argument("--task", choices=("rrc", "center"), default="rrc")
    parser.add_argument("--size", type=int, default=160)
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--output", default=None)
    arguments = parser.parse_args()
    from beton.tools.bench.data import make_jpegs

    jpegs = make_jpegs(arguments.images, arguments.side)
    rates: dict[str, dict[str, list[float]]] = {tree: {"wall": [], "cpu": []} for tree in arguments.trees}
    with tempfile.TemporaryDirectory() as directory:
        source = os.path.join(directory, "jpegs.pickle")
        with open(source, "wb") as file:
            pickle.dump(jpegs, file)
        paths = {tree: os.path.join(directory, f"{k}.beton") for k, tree in enumerate(arguments.trees)}
        for tree, path in paths.items():
            _run(tree, "write", path, source)
        for pair in range(arguments.pairs):
            order = arguments.trees if pair % 2 == 0 else arguments.trees[::-1]
            for tree in order:
                wall, cpu = _run(tree, "time", paths[tree], arguments.task, str(arguments.size),
                                 str(arguments.epochs)).split()
                rates[tree]["wall"].append(float(wall))
                rates[tree]["cpu"].append(float(cpu))
            print(f"pair {pair}: " + ", ".join(f"{rates[t]['wall'][-1]:.0f}/s ({rates[t]['cpu'][-1]:.0f}/CPU-s)"
                                               for t in arguments.trees), flush=True)
    first, second = (rates[tree] for tree in arguments.trees)
    result = {"trees": arguments.trees, "task": arguments.task, "size": arguments.size, "side": arguments.side,
              "images": arguments.images, "epochs_per_process": arguments.epochs,
              "load_average_1_5_15_min": os.getloadavg()}
    for clock in ("wall", "cpu"):
        ratios = [b / a for a, b in zip(first[clock], second[clock])]
        result[f"images_per_{clock}_s"] = {tree: [round(rate) for rate in rates[tree][clock]]
                                           for tree in arguments.trees}
        result[f"median_ratio_b_over_a_{clock}"] = round(statistics.median(ratios), 3)
        if len(ratios) >= 4:  # the spread: a median alone hides how far apart the pairs were
            result[f"quartiles_ratio_b_over_a_{clock}"] = [round(q, 3) for q in statistics.quantiles(ratios, n=4)]
        result[f"ratios_{clock}"] = [round(ratio, 3) for ratio in ratios]
    print(json.dumps(result, indent=2))
    if arguments.output:
        with open(arguments.output, "w") as file:
            json.dump(result, file, indent=2)


if __name__ == "__main__":
    main()
