"""The crop decoders' per-image path of another checkout against this one, in one process: did a change to it
cost or save time?

    python benchmarks/crop_decode_paired.py OLD_TREE [--images N] [--repeats R] [--output FILE]

``OLD_TREE`` is a checkout (``git worktree add /tmp/old <commit>``) whose ``beton/decoders/rgb_image.py`` and
``jpeg_regions.py`` are loaded beside this tree's, the rest of beton shared. Separate processes, as
``benchmarks/paired_trees.py`` runs, differ by up to 1.4x on this host from one process to the next, far more
than a few percent of change; rounds alternating in one process differ by a few percent. For the benchmark suite's
photos (``make_jpegs``, ~256 and ~500 px, restart markers as the field stores them), RandomResizedCrop-160 crops
(the loader's key for epoch 0) and CenterCrop-224: :meth:`decoded_crop` and :func:`resize_into` on every image,
one thread, rounds alternating between the two sides; for RandomResizedCrop also with libjpeg-turbo's decode
replaced by a no-op, which leaves the Python and compiled work around it. Reports each tree's fastest round (microseconds per image) and the median
of the per-round ratios new/old with quartiles. Writes benchmarks/results/crop_decode_paired.json.
"""

from __future__ import annotations

import importlib.util
import os
import statistics
import sys
import time
from types import ModuleType

import numpy as np
import simplejpeg

import beton.decoders.jpeg_regions
import beton.decoders.rgb_image
from beton.codecs.jpeg_restarts import with_restart_markers
from beton.pipeline.operation import Scratch
from beton.random import operation_key
from beton.tools.bench.data import make_jpegs
from beton.tools.bench.report import argument_parser, run_header, save_json

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "crop_decode_paired.json")


def _load(name: str, path: str, replacing: dict[str, ModuleType]) -> ModuleType:
    """The module at ``path`` under ``name``, its imports of the modules in ``replacing`` given those instead."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is made
    saved = {key: sys.modules[key] for key in replacing}
    sys.modules.update(replacing)
    try:
        spec.loader.exec_module(module)
    finally:
        sys.modules.update(saved)
    return module


def old_modules(tree: str) -> tuple[ModuleType, ModuleType]:
    """``tree``'s jpeg_regions and rgb_image, the second importing the first."""
    regions = _load("old_jpeg_regions", os.path.join(tree, "beton", "decoders", "jpeg_regions.py"), {})
    return regions, _load("old_rgb_image", os.path.join(tree, "beton", "decoders", "rgb_image.py"),
                          {"beton.decoders.jpeg_regions": regions})


def _no_decode(data, buffer=None, **options):
    return buffer


def measure(side: int, images: int, repeats: int, old: tuple[ModuleType, ModuleType], center: bool,
            decode: bool) -> dict:
    """Rounds alternating between the old tree's modules and this tree's."""
    payloads = [np.frombuffer(with_restart_markers(jpeg), np.uint8) for jpeg in make_jpegs(images, side)]
    shapes = [(*simplejpeg.decode_jpeg_header(payload)[:2], 3) for payload in payloads]
    key = operation_key(0, 0, 0, 0)
    new = (beton.decoders.jpeg_regions, beton.decoders.rgb_image)
    stand_in = type("NoDecode", (), {"decode_jpeg": staticmethod(_no_decode),
                                     "decode_jpeg_header": staticmethod(simplejpeg.decode_jpeg_header)})
    modules = (*new, *old)
    if not decode:
        for module in modules:
            module.simplejpeg = stand_in

    def runner(rgb_image: ModuleType):
        size = 224 if center else 160
        decoder = rgb_image.CenterCropRGBImageDecoder((size, size)) if center else \
            rgb_image.RandomResizedCropRGBImageDecoder((size, size))
        scratch, out = Scratch(), np.empty((size, size, 3), np.uint8)
        crops = [decoder.crop(key, index, *shape[:2]) for index, shape in enumerate(shapes)]

        def run() -> None:
            for payload, shape, crop in zip(payloads, shapes, crops):
                image, scaled = decoder.decoded_crop(payload, shape, crop, out.shape, scratch)
                if decode:
                    rgb_image.resize_into(image, out, scaled, scratch=scratch)
        return run

    runs = {"old": runner(old[1]), "new": runner(new[1])}
    try:
        for run in runs.values():  # compiles
            run()
        times: dict[str, list[float]] = {name: [] for name in runs}
        for _ in range(repeats):
            for name, run in runs.items():
                start = time.perf_counter()
                run()
                times[name].append((time.perf_counter() - start) / images * 1e6)
    finally:
        for module in modules:
            module.simplejpeg = simplejpeg
    ratios = [new_time / old_time for new_time, old_time in zip(times["new"], times["old"])]
    return {"us_per_image_fastest_round": {name: round(min(values), 1) for name, values in times.items()},
            "new_over_old_median": round(statistics.median(ratios), 3),
            "new_over_old_quartiles": [round(q, 3) for q in statistics.quantiles(ratios, n=4)]}


def main() -> None:
    parser = argument_parser(__doc__, images=640, repeats=15)
    parser.add_argument("old_tree")
    parser.add_argument("--output", default=RESULTS)
    args = parser.parse_args()
    old = old_modules(args.old_tree)
    result = {**run_header(), "old": os.path.abspath(args.old_tree), "images": args.images, "repeats": args.repeats,
              "steps": {}}
    for side in (256, 500):
        for center, decode in ((False, True), (False, False), (True, True)):
            label = f"~{side} px, {'CenterCrop-224' if center else 'RandomResizedCrop-160'}, " + (
                "decode + resize" if decode else "libjpeg-turbo's decode a no-op, no resize")
            result["steps"][label] = measure(side, args.images, args.repeats, old, center, decode)
            print(label, result["steps"][label], flush=True)
    save_json(args.output, result)


if __name__ == "__main__":
    main()
