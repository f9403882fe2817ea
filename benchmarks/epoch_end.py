"""What idle workers helping finish the epoch's last batches gains: the Loader as it is, against the same Loader
with helping switched off, side by side.

    python benchmarks/epoch_end.py [--repeats R]

RandomResizedCrop-160 + flip on ~256 px photo JPEGs, the suite's 2 workers, batches of 64, epochs of 5 batches
(320 images: the last batch alone while the other workers wait, without helping), 16 batches (1,000: the
suite's) and 64 (4,096). One process, the two arms alternating epoch by epoch; "helping / not" is the median of
the per-round ratios (1.00: no gain), with the quartiles. The arm without helping replaces the worker's wait for
a stage to help with by "nothing to help with" (``_EpochState.loop_to_help``): this benchmark's switch, not an
option of the Loader.
Writes benchmarks/results/epoch_end.json.
"""

from __future__ import annotations

import os
import statistics
import tempfile

from beton import Loader
from beton.loader import epoch
from beton.tools.bench import contenders as c
from beton.tools.bench.data import make_jpegs
from beton.tools.bench.report import argument_parser, run_header, save_json
from beton.tools.bench.timing import epoch_rate

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "epoch_end.json")
HELPING = epoch._EpochState.loop_to_help


def _no_help(state: epoch._EpochState) -> None:
    return None


def paired(loader: Loader, repeats: int) -> dict:
    """Samples/s of each arm per round, alternating which goes first; the median ratio and its quartiles."""
    rates: dict[str, list[float]] = {"helping": [], "not": []}
    arms = {"helping": HELPING, "not": _no_help}
    try:
        for name in arms:  # warm-up
            epoch._EpochState.loop_to_help = arms[name]
            epoch_rate(loader)
        for round_ in range(repeats):
            for name in (("helping", "not") if round_ % 2 == 0 else ("not", "helping")):
                epoch._EpochState.loop_to_help = arms[name]
                rates[name].append(epoch_rate(loader))
    finally:
        epoch._EpochState.loop_to_help = HELPING
    ratios = sorted(a / b for a, b in zip(rates["helping"], rates["not"]))
    return {"helping_over_not": round(statistics.median(ratios), 3),
            "quartiles": [round(ratios[len(ratios) // 4], 3), round(ratios[3 * len(ratios) // 4], 3)],
            "images_per_s": {name: round(statistics.median(values)) for name, values in rates.items()},
            "rounds": {name: [round(value) for value in values] for name, values in rates.items()}}


def main() -> None:
    arguments = argument_parser(__doc__, repeats=41).parse_args()
    result = {**run_header(), "repeats": arguments.repeats, "workers": c.WORKERS, "scenarios": {}}
    task = c.ImageTask("rrc", 160, 64)
    for images in (320, 1000, 4096):
        with tempfile.TemporaryDirectory() as directory:
            path = c.write_beton_images(make_jpegs(images, 256), os.path.join(directory, "photos.beton"))
            with c.beton_images(path, task) as loader:
                found = paired(loader, arguments.repeats)
        result["scenarios"][f"{images} images, {-(-images // 64)} batches"] = found
        print(f"{images} images: helping / not {found['helping_over_not']} (quartiles {found['quartiles']}), "
              f"{found['images_per_s']}", flush=True)
    save_json(RESULTS, result)


if __name__ == "__main__":
    main()
