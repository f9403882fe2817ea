"""Two versions of beton side by side: loader rates of each, in alternating processes, on the same files.

    git worktree add /tmp/before REV
    python benchmarks/versions.py /tmp/before . [--rounds 6] [--images 2000] [--process-cache | --engine]

Each round runs one process per version (in turn, the order swapped every round), which measures the median
of three epochs per scenario after a warm-up epoch: RandomResizedCrop-160 and CenterCrop-224 on ~256 px photo
JPEGs, and raw 3x32x32 arrays in batches of 512. "after / before" is the median of the per-round ratios.
The files are written once, by the ``after`` tree, in a format both versions read.

``--process-cache`` reads every scenario through the process cache (``os_cache=False``, a spelling every
version takes; RandomResizedCrop in QUASI_RANDOM order). ``--engine`` measures the engine's own per-batch
work instead: raw 3x32x32 arrays in batches of 32, batches per CPU-second of the process (all its threads),
median of nine epochs, computed in the loop's thread (``num_workers=0``: no thread hand-offs) and by two
workers, for both memory layers. CPU time depends less than wall time on what else a shared host runs.
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
from beton import OrderOption
paths, mode = json.loads(sys.argv[1]), sys.argv[2]
os_cache = mode != "process-cache"
order = OrderOption.RANDOM if os_cache else OrderOption.QUASI_RANDOM
builders = {"RRC-160 ~256 px": lambda: c.beton_images(paths["photos"], c.ImageTask("rrc", 160, 64),
                                                      os_cache=os_cache, order=order),
            "CenterCrop-224 ~256 px": lambda: c.beton_images(paths["photos"], c.ImageTask("center", 224, 64),
                                                             os_cache=os_cache),
            "raw 3x32x32, batch 512": lambda: c.beton_raw(paths["raw"], 512, os_cache=os_cache)}
rates = {}
for name, build in builders.items():
    loader = build()
    epoch_rate(loader)
    rates[name] = sorted(epoch_rate(loader) for _ in range(3))[1]
    loader.close()
print(json.dumps(rates))
"""

ENGINE = """
import json, sys, time
from beton import Loader, OrderOption
paths = json.loads(sys.argv[1])
rates = {}
for workers in (0, 2):
    for os_cache in (True, False):
        loader = Loader(paths["raw"], batch_size=32, num_workers=workers, os_cache=os_cache,
                        order=OrderOption.RANDOM, seed=0)
        for _ in loader:
            pass
        seconds = []
        for _ in range(9):
            start = time.process_time()
            for _ in loader:
                pass
            seconds.append(time.process_time() - start)
        name = f"batches per CPU-s, {'OS' if os_cache else 'process'} cache, num_workers={workers}"
        rates[name] = len(loader) / sorted(seconds)[4]
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
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--process-cache", action="store_true", help="read through the process cache")
    mode.add_argument("--engine", action="store_true", help="the engine's per-batch CPU work (see above)")
    arguments = parser.parse_args()
    script = ENGINE if arguments.engine else MEASURE
    mode_name = "process-cache" if arguments.process_cache else "os-cache"
    with tempfile.TemporaryDirectory() as directory:
        paths = {"photos": os.path.join(directory, "photos.beton"), "raw": os.path.join(directory, "raw.beton")}
        run_in(arguments.after, WRITE, json.dumps(paths), str(arguments.images))
        rates: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
        for number in range(arguments.rounds):
            order = ("before", "after") if number % 2 == 0 else ("after", "before")
            for version in order:
                tree = arguments.before if version == "before" else arguments.after
                rates[version].append(json.loads(run_in(tree, script, json.dumps(paths), mode_name)))
            print(f"round {number}: " + ", ".join(
                f"{name} {rates['after'][-1][name] / rates['before'][-1][name]:.3f}" for name in rates["after"][-1]),
                flush=True)
    print("| scenario | after / before: median [range] | rates before, after (medians) |\n|---|---|---|")
    for name in rates["after"][0]:
        ratios = [after[name] / before[name] for before, after in zip(rates["before"], rates["after"])]
        medians = [statistics.median(run[name] for run in rates[version]) for version in ("before", "after")]
        print(f"| {name} | {statistics.median(ratios):.3f} [{min(ratios):.3f}-{max(ratios):.3f}] | "
              f"{medians[0]:.0f}, {medians[1]:.0f} |")


if __name__ == "__main__":
    main()
