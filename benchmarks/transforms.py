"""Cost of each compiled image transform: microseconds per 160x160x3 uint8 image, one thread.

    python benchmarks/transforms.py [--repeats R]

Each kernel runs as the loader runs it (one call per sample, in place or into its own buffer) over a batch of
64 photo crops, with probability 1 where it has one, so every image pays the full cost; ImageMixup (a batch
operation) runs once per batch and is reported per image. Median over R passes.
Writes benchmarks/results/transforms.json and prints a Markdown table. Figures to compare with: a 256 px JPEG
decode costs ~250 us here, cv2's bilinear resize to 160x160 ~55 us.
"""

from __future__ import annotations

import os
import statistics
import time

import numpy as np

from beton import transforms as t
from beton.tools.bench.report import argument_parser, run_header, save_json
from beton.pipeline.operation import BatchContext, JitOperation, Scratch, State
from beton.random import operation_key
from beton.tools.sample_photos import photo_crop

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "transforms.json")
SIZE, BATCH = 160, 64

OPERATIONS = [t.RandomHorizontalFlip(1.0), t.RandomVerticalFlip(1.0), t.Cutout(40), t.RandomErasing(p=1.0),
              t.RandomTranslate(8), t.RandomBrightness(1.0, 0.2), t.RandomContrast(1.0, 0.2),
              t.RandomSaturation(1.0, 0.2), t.RandomSolarization(1.0, 128),
              t.NormalizeImage((123.7, 116.3, 103.5), (58.4, 57.1, 57.4))]


def microseconds_per_image(operation: JitOperation, batch: np.ndarray, repeats: int) -> float:
    state = State((SIZE, SIZE, 3), np.dtype(np.uint8))
    output = operation.output_state(state)
    kernel, arguments = operation.kernel(), operation.kernel_arguments(state)
    key = operation_key(0, 0, 0, 0)
    destination = batch if operation.in_place(state) else np.empty((BATCH, *output.shape), output.dtype)
    kernel(batch, destination, 0, 0, key, arguments)  # compile (or load from the cache)
    passes = []
    for _ in range(repeats):
        start = time.perf_counter()
        for i in range(BATCH):
            kernel(batch, destination, i, i, key, arguments)
        passes.append((time.perf_counter() - start) / BATCH * 1e6)
    return statistics.median(passes)


def mixup_microseconds_per_image(batch: np.ndarray, repeats: int) -> float:
    context = BatchContext(np.arange(BATCH), 0, operation_key(0, 0, 0, 0), 0, 0, Scratch())
    mixup, passes = t.ImageMixup(), []
    for _ in range(repeats + 1):  # the first pass compiles (or loads from the cache)
        start = time.perf_counter()
        mixup.apply(batch, context)
        passes.append((time.perf_counter() - start) / BATCH * 1e6)
    return statistics.median(passes[1:])


def main() -> None:
    arguments = argument_parser(__doc__, repeats=20).parse_args()
    batch = np.stack([photo_crop(i, SIZE, SIZE) for i in range(BATCH)])
    costs = {type(op).__name__: round(microseconds_per_image(op, batch, arguments.repeats), 1) for op in OPERATIONS}
    costs["ImageMixup"] = round(mixup_microseconds_per_image(batch, arguments.repeats), 1)
    save_json(RESULTS, {**run_header(), "image": f"{SIZE}x{SIZE}x3 uint8", "microseconds_per_image": costs})
    print("| transform | µs per image |\n|---|---|")
    for name, cost in costs.items():
        print(f"| {name} | {cost} |")


if __name__ == "__main__":
    main()
