"""What keeping batches valid costs: the Loader's default against FFCV's overwriting ring, side by side.

    python benchmarks/kept_batches.py [--images N] [--repeats R]

The default Loader checks, before refilling a slot, whether the loop still references the slot's memory
(``overwrite_kept=False``); ``overwrite_kept=True`` skips the check (FFCV's ring). Both run on every image and
array scenario of ``beton bench``, alternating epochs, and "check / ring" is the median of the per-round ratios
(1.00: no cost). A third contender keeps every batch of the epoch (the validation pattern
``outputs.append(y)``), which makes the default allocate fresh slot memory for each batch.
Writes benchmarks/results/kept_batches.json and prints a Markdown table.
"""

from __future__ import annotations

import os
import statistics
import tempfile
from collections.abc import Callable, Iterator

from beton import Loader
from beton.tools.bench import contenders as c
from beton.tools.bench.data import make_jpegs, make_raw_images
from beton.tools.bench.report import argument_parser, run_header, save_json
from beton.tools.bench.timing import alternating_runs, paired_ratio

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "kept_batches.json")


class KeepEveryBatch:
    """Iterates a Loader like a validation loop that keeps every batch until the epoch ends."""

    def __init__(self, loader: Loader) -> None:
        self.loader = loader

    def __iter__(self) -> Iterator[tuple]:
        kept = list(self.loader)
        yield from kept


def scenarios(directory: str, images: int) -> dict[str, Callable[..., Loader]]:
    small = c.write_beton_images(make_jpegs(images, 256), os.path.join(directory, "small.beton"))
    large = c.write_beton_images(make_jpegs(images // 2, 500), os.path.join(directory, "large.beton"))
    arrays, labels = make_raw_images(images * 10)
    raw = c.write_beton_raw(arrays, labels, os.path.join(directory, "raw.beton"))

    def images_loader(path: str, kind: str, size: int) -> Callable[..., Loader]:
        return lambda **options: c.beton_images(path, c.ImageTask(kind, size, 64), **options)

    return {
        "RRC-160 + flip, ~256 px": images_loader(small, "rrc", 160),
        "RRC-160 + flip, ~500 px": images_loader(large, "rrc", 160),
        "CenterCrop-224, ~256 px": images_loader(small, "center", 224),
        "raw 3x32x32, batch 512": lambda **options: c.beton_raw(raw, 512, **options),
    }


def main() -> None:
    arguments = argument_parser(__doc__, images=600, repeats=7).parse_args()
    result = {**run_header(), "images": arguments.images, "repeats": arguments.repeats, "scenarios": {}}
    rows = ["| scenario | check / ring | keeping every batch / ring | samples/s (check, ring, keep all) |",
            "|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as directory:
        for name, build in scenarios(directory, arguments.images).items():
            loaders = {"check": build(), "ring": build(overwrite_kept=True)}
            contenders = {**loaders, "keep all": KeepEveryBatch(build())}
            runs = alternating_runs(contenders, arguments.repeats)
            for loader in (*loaders.values(), contenders["keep all"].loader):
                loader.close()
            check, keep = paired_ratio(runs["check"], runs["ring"]), paired_ratio(runs["keep all"], runs["ring"])
            medians = {key: round(statistics.median(rates)) for key, rates in runs.items()}
            result["scenarios"][name] = {"check_over_ring": round(check, 3), "keep_all_over_ring": round(keep, 3),
                                         "samples_per_s": medians,
                                         "rounds": {key: [round(r) for r in rates] for key, rates in runs.items()}}
            rows.append(f"| {name} | {check:.3f} | {keep:.3f} | {medians['check']}, {medians['ring']}, "
                        f"{medians['keep all']} |")
            print(rows[-1], flush=True)
    save_json(RESULTS, result)
    print("\n".join(rows))


if __name__ == "__main__":
    main()
