"""The window a crop decodes with smooth chroma upsampling (CenterCrop's default): one chroma sample past the crop
(since 05c1dec) against one restart segment more on every side (before), paired in one process.

    git worktree add /tmp/old 05c1dec~1
    NUMBA_CACHE_DIR=$(mktemp -d) python benchmarks/chroma_margin.py /tmp/old [--images N] [--repeats R]

On the benchmark suite's photos (``make_jpegs``, ~256 and ~500 px, restart markers as the field adds them) and
CenterCrop-224's crops: the old tree's ``beton/decoders/jpeg_regions.py`` (loaded under another name) and this
tree's splice each crop's window, which is decoded (``fastupsample=False``) and resized into the output; one
thread, CPU time, rounds alternating which goes first (after a warm-up of each). Reports the pixels each decodes
as a share of the images' and the median ratio of new over old CPU time with its quartiles. Writes
benchmarks/results/chroma_margin.json.
(The fresh NUMBA_CACHE_DIR: numba's cache cannot reload a module loaded under a name of its own.)
"""

from __future__ import annotations

import importlib.util
import os
import statistics
import time

import numpy as np
import simplejpeg

import beton.decoders.jpeg_regions as new_regions
from beton.codecs.jpeg_restarts import with_restart_markers
from beton.decoders import CenterCropRGBImageDecoder
from beton.decoders.jpeg_regions import decode_spliced, uint64_words
from beton.decoders.rgb_image import choose_dct_factor, resize_into, single_threaded_opencv
from beton.random import operation_key
from beton.tools.bench.data import make_jpegs
from beton.tools.bench.report import argument_parser, run_header, save_json
from beton.tools.bench.timing import alternating_cpu_seconds, ratio_quartiles

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "chroma_margin.json")


def load_old(tree: str):
    path = os.path.join(tree, "beton", "decoders", "jpeg_regions.py")
    spec = importlib.util.spec_from_file_location("old_jpeg_regions", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def scenario(side: int, images: int, repeats: int, old) -> dict:
    decoder = CenterCropRGBImageDecoder((224, 224), ratio=224 / 256)
    jpegs = make_jpegs(images, side)
    payloads = [np.frombuffer(with_restart_markers(jpeg), np.uint8) for jpeg in jpegs]
    words = [uint64_words(payload) for payload in payloads]
    shapes = [tuple(simplejpeg.decode_jpeg_header(jpeg)[:2]) for jpeg in jpegs]
    out = np.empty((224, 224, 3), np.uint8)
    spliced = np.empty(max(payload.size for payload in payloads), np.uint8)
    key = operation_key(0, 0, 0, 0)
    jobs = []
    for index, (height, width) in enumerate(shapes):
        top, left, crop_height, crop_width = decoder.crop(key, index, height, width)
        factor = choose_dct_factor(crop_height, crop_width, 224, 224)
        region = (top - top % factor, top + crop_height + (factor if top % factor else 0),
                  left - left % factor, left + crop_width + (factor if left % factor else 0))
        jobs.append((index, height, width, region, factor, (top, left, crop_height, crop_width)))

    def run(module) -> int:
        """Decode and resize every crop with ``module``'s window; the pixels decoded."""
        pixels = 0
        for index, height, width, region, factor, (top, left, crop_height, crop_width) in jobs:
            window = module.splice_crop(payloads[index], words[index], height, width, *region, factor, True, spliced)
            length, window_top, window_left, window_height, window_width = window[4:]
            if length < 0:  # the whole image
                image = simplejpeg.decode_jpeg(payloads[index], min_factor=factor, fastupsample=False)
                window_top = window_left = 0
                pixels += height * width
            else:
                image = np.empty((-(-window_height // factor), -(-window_width // factor), 3), np.uint8)
                decode_spliced(spliced[:length], image, min_width=image.shape[1], colorspace="RGB",
                               min_factor=factor, fastupsample=False)
                pixels += window_height * window_width
            resize_into(image, out, ((top - window_top) / factor, (left - window_left) / factor,
                                     crop_height / factor, crop_width / factor))
        return pixels

    total = sum(height * width for height, width in shapes)
    shares = {"old": run(old) / total, "new": run(new_regions) / total}
    seconds = alternating_cpu_seconds({"old": lambda: run(old), "new": lambda: run(new_regions)}, repeats,
                                      clock=time.thread_time)
    ratio = ratio_quartiles(seconds["new"], seconds["old"])
    return {"pixels_decoded_share": {name: round(share, 3) for name, share in shares.items()},
            "us_per_image_median": {name: round(statistics.median(values) / images * 1e6, 1)
                                    for name, values in seconds.items()},
            "new_over_old_median": ratio["median"], "new_over_old_quartiles": ratio["quartiles"]}


def main() -> None:
    parser = argument_parser(__doc__, images=500, repeats=15)
    parser.add_argument("old_tree")
    parser.add_argument("--output", default=RESULTS)
    arguments = parser.parse_args()
    single_threaded_opencv()
    old = load_old(arguments.old_tree)
    result = {**run_header(), "images": arguments.images, "repeats": arguments.repeats, "scenarios": {}}
    for side in (256, 500):
        result["scenarios"][f"CenterCrop-224, ~{side} px"] = outcome = scenario(side, arguments.images,
                                                                               arguments.repeats, old)
        print(f"~{side} px: {outcome}", flush=True)
    save_json(arguments.output, result)


if __name__ == "__main__":
    main()
