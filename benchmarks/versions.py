"""Two versions of beton side by side: loader rates of each, in alternating processes, on the same files.

    git worktree add /tmp/before REV
    python benchmarks/versions.py /tmp/before . [--rounds 6] [--images 2000]

Each round runs one process per version (in turn, the order swapped every round), which measures the median
of three epochs per scenario after a warm-up epoch: RandomResizedCrop-160 and CenterCrop-224 on ~256 px photo
JPEGs, and raw 3x32x32 arrays in batches of 512. "after / before" is the median of the per-round ratios.
The files are written once, by the ``after`` tree, in a format both versions read.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

MEASURE = """
import json, sys
try:
    from beton.tools.bench import contenders as c
    from beton.tools.bench.timing import epoch_rate
except ImportError:  # trees before the tools moved into beton/tools
    from beton.bench import contenders as c
    from beton.bench.timing import epoch_rate
paths = json.loads(sys.argv[1])
builders = {"RRC-160 ~256 px": lambda: c.beton_images(paths["photos"], c.ImageTask("rrc", 160, 64)),
            "CenterCrop-224 ~256 px": lambda: c.beton_images(paths["photos"], c.ImageTask("center", 224, 64)),
            "raw 3x32x32, batch 512": lambda: c.beton_raw(paths["raw"], 512)}
rates = {}
for name, build in builders.items():
    loader = build()
    epoch_rate(loader)
    rates[name] = sorted(epoch_rate(loader) for _ in range(3))[1]
    loader.close()
print(json.dumps(rates))
"""

WRITE = """
import json, sys
try:
    from beton.tools.bench import contenders as c
    from beton.tools.bench.data import make_jpegs, make_raw_images
except ImportError:  # trees before the tools moved into beton/tools
    from beton.bench import contenders as c
    from beton.bench.data import make_jpegs, make_raw_images
paths, images = json.loads(sys.argv[1]), int(sys.argv[2])
c.write_beton_images(make_jpegs(images, 256), paths["photos"])
arrays, labels = make_raw_images(images * 10)
c.write_beton_raw(arrays, labels, paths["raw"])
"""


def run_in(tree: str, script: str, *arguments: str) -> str:
    environment = {**os.environ, "PYTHONPATH": os.path.abspath(tree)}
    result = subprocess.run([sys.executable, "-c", script, *arguments], env=environment, capture_output=True,
                            text=True, check=True, cwd=tempfile.gettempdir())
    return result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", help="source tree of the first version (e.g. a git worktree)")
    parser.add_argument("after", help="source tree of the second version")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--images", type=int, default=2000)
    arguments = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        paths = {"photos": os.path.join(directory, "photos.beton"), "raw": os.path.join(directory, "raw.beton")}
        run_in(arguments.after, WRITE, json.dumps(paths), str(arguments.images))
        rates: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
        for number in range(arguments.rounds):
            order = ("before", "after") if number % 2 == 0 else ("after", "before")
            for version in order:
                tree = arguments.before if version == "before" else arguments.after
                rates[version].append(json.loads(run_in(tree, MEASURE, json.dumps(paths))))
            print(f"round {number}: " + ", ".join(
                f"{name} {rates['after'][-1][name] / rates['before'][-1][name]:.3f}" for name in rates["after"][-1]),
                flush=True)
    print("| scenario | after / before: median [range] | samples/s before, after (medians) |\n|---|---|---|")
    for name in rates["after"][0]:
        ratios = [after[name] / before[name] for before, after in zip(rates["before"], rates["after"])]
        medians = [statistics.median(run[name] for run in rates[version]) for version in ("before", "after")]
        print(f"| {name} | {statistics.median(ratios):.3f} [{min(ratios):.3f}-{max(ratios):.3f}] | "
              f"{medians[0]:.0f}, {medians[1]:.0f} |")


if __name__ == "__main__":
    main()
