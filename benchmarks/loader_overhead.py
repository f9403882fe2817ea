"""What the Loader costs per image beyond the crop decoder's work: RandomResizedCrop-160 (+ flip) with the work
stubbed out, CPU time.

    python benchmarks/loader_overhead.py [--images N] [--repeats R] [--output FILE]

The suite's ~256 px photos in a beton file; in this process the decoder's decode (the splice included) returns a
fixed image and its resize does nothing, so what is left is the rest: the file, the decoder's Python around its
work (metadata record, crop draw, DCT scale choice), the label pipeline, the compiled batch stages, gathering and
hand-offs. The suite's crop-only + resize limit times exactly the stubbed part, so this is beton's cost beyond
that limit, measured in CPU time (steadier than wall time on a shared host). Three pipelines (flip + ToTensor +
ToTorchImage, without the flip, the decoder alone), with ``num_workers`` 0 and 1, rounds alternating; reports
each one's median and fastest round in microseconds of CPU per image. Writes
benchmarks/results/loader_overhead.json.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time

import numpy as np

import beton.decoders.rgb_image as rgb_image
from beton.decoders import IntDecoder
from beton.loader import Loader
from beton.order import OrderOption
from beton.tools.bench import contenders as c
from beton.tools.bench.data import make_jpegs
from beton.tools.bench.report import argument_parser, run_header, save_json
from beton.transforms import RandomHorizontalFlip, ToTensor, ToTorchImage

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "loader_overhead.json")


def stub_the_work() -> None:
    """The decode returns one fixed image (larger than any crop of these photos), the resize does nothing."""
    image = np.zeros((512, 512, 3), np.uint8)
    rgb_image._decode_scaled = lambda payload, shape, factor, fast_upsample, region, scratch: (image, 0, 0)
    rgb_image.resize_into = lambda image, out, crop=None, area_above=None, scratch=None: None


def main() -> None:
    parser = argument_parser(__doc__, images=1000, repeats=15)
    parser.add_argument("--output", default=RESULTS)
    arguments = parser.parse_args()
    task = c.ImageTask("rrc", 160, 64)
    pipelines = {"flip + ToTensor + ToTorchImage": [task.decoder, RandomHorizontalFlip(), ToTensor(), ToTorchImage()],
                 "ToTensor + ToTorchImage": [task.decoder, ToTensor(), ToTorchImage()],
                 "decoder alone": [task.decoder]}
    stub_the_work()
    with tempfile.TemporaryDirectory() as directory:
        path = c.write_beton_images(make_jpegs(arguments.images, 256), os.path.join(directory, "photos.beton"))
        loaders = {f"{name}, num_workers={workers}": Loader(
            path, batch_size=task.batch_size, num_workers=workers, order=OrderOption.RANDOM, seed=0,
            pipelines={"image": image, "label": [IntDecoder(), ToTensor()]})
            for workers in (0, 1) for name, image in pipelines.items()}
        seconds: dict[str, list[float]] = {name: [] for name in loaders}
        for loader in loaders.values():  # warm-up: compilation, page cache
            for _ in loader:
                pass
        for _ in range(arguments.repeats):
            for name, loader in loaders.items():
                start = time.process_time()
                for _ in loader:
                    pass
                seconds[name].append(time.process_time() - start)
    per_image = {name: [value / arguments.images * 1e6 for value in values] for name, values in seconds.items()}
    result = {**run_header(), "images": arguments.images, "repeats": arguments.repeats,
              "cpu_us_per_image": {name: {"median": round(statistics.median(values), 1),
                                          "fastest": round(min(values), 1)} for name, values in per_image.items()}}
    for name, values in result["cpu_us_per_image"].items():
        print(f"{name}: {values}")
    save_json(arguments.output, result)


if __name__ == "__main__":
    main()
