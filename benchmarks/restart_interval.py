"""Segments of one MCU against whole rows, for JPEGs whose MCU rows no interval in 2..8 divides: what the rule of
:func:`~beton.codecs.jpeg_restarts.choose_interval` (1 there) costs and saves against the rule before it (the
whole row: no column granularity).

    python benchmarks/restart_interval.py [--images N] [--repeats R] [--output FILE]

On the benchmark suite's photos (``make_jpegs``: ~256 and ~500 px, quality 90, 4:2:0), all of them, each stored
both ways (the images the rule does not concern are the same bytes both ways), one thread, CPU time, rounds
alternating between the two: the stored bytes; the crop decoders' decode and resize (:meth:`decoded_crop`,
:func:`resize_into`) per image for RandomResizedCrop-160 and CenterCrop-224; a whole ``simplejpeg`` decode. Ratios
are new over old, the median of the per-round ratios. Writes benchmarks/results/restart_interval.json.
"""

from __future__ import annotations

import os
import statistics

import numpy as np
import simplejpeg

from beton.codecs.jpeg_restarts import add_restart_markers, choose_interval, with_restart_markers
from beton.decoders import CenterCropRGBImageDecoder, RandomResizedCropRGBImageDecoder
from beton.decoders.rgb_image import resize_into, single_threaded_opencv
from beton.pipeline.operation import Scratch
from beton.random import operation_key
from beton.tools.bench.data import make_jpegs
from beton.tools.bench.report import argument_parser, run_header, save_json
from beton.tools.bench.timing import alternating_cpu_seconds, ratio_quartiles

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "restart_interval.json")
MCU_WIDTH = 16  # the photos are 4:2:0


def stored_both_ways(jpeg: bytes) -> tuple[bytes, bytes]:
    """(whole rows, as the field stores it now) where no interval in 2..8 divides the row; the stored JPEG twice
    otherwise."""
    stored = with_restart_markers(jpeg)
    mcus = -(-simplejpeg.decode_jpeg_header(jpeg)[1] // MCU_WIDTH)
    if choose_interval(mcus) != 1 or mcus == 1:
        return stored, stored
    return add_restart_markers(jpeg, mcus) or jpeg, stored


def crops_runner(decoder, payloads, shapes):
    key = operation_key(0, 0, 0, 0)
    scratch, out = Scratch(), np.empty((*decoder.output_size, 3), np.uint8)
    crops = [decoder.crop(key, index, *shape[:2]) for index, shape in enumerate(shapes)]

    def run() -> None:
        for payload, shape, crop in zip(payloads, shapes, crops):
            image, scaled = decoder.decoded_crop(payload, shape, crop, out.shape, scratch)
            resize_into(image, out, scaled, scratch=scratch)
    return run


def whole_runner(payloads):
    def run() -> None:
        for payload in payloads:
            simplejpeg.decode_jpeg(payload, fastupsample=True)
    return run


def alternating(runs: dict, repeats: int, count: int) -> dict:
    times = {name: [value / count * 1e6 for value in values]
             for name, values in alternating_cpu_seconds(runs, repeats).items()}
    ratio = ratio_quartiles(times["new"], times["old"])
    return {"cpu_us_per_image_median": {name: round(statistics.median(values), 1) for name, values in times.items()},
            "new_over_old_median": ratio["median"], "new_over_old_quartiles": ratio["quartiles"]}


def main() -> None:
    parser = argument_parser(__doc__, images=1000, repeats=15)
    parser.add_argument("--output", default=RESULTS)
    arguments = parser.parse_args()
    single_threaded_opencv()
    result = {**run_header(), "images": arguments.images, "repeats": arguments.repeats, "sides": {}}
    for side in (256, 500):
        pairs = [stored_both_ways(jpeg) for jpeg in make_jpegs(arguments.images, side)]
        old, new = ([np.frombuffer(pair[k], np.uint8) for pair in pairs] for k in (0, 1))
        shapes = [(*simplejpeg.decode_jpeg_header(payload)[:2], 3) for payload in new]
        count = len(pairs)
        steps = {"whole decode": alternating({"old": whole_runner(old), "new": whole_runner(new)},
                                             arguments.repeats, count)}
        for name, decoder in (("RandomResizedCrop-160", RandomResizedCropRGBImageDecoder((160, 160))),
                              ("CenterCrop-224", CenterCropRGBImageDecoder((224, 224), ratio=224 / 256))):
            steps[name] = alternating({"old": crops_runner(decoder, old, shapes),
                                       "new": crops_runner(decoder, new, shapes)}, arguments.repeats, count)
        result["sides"][f"~{side} px"] = {
            "images_concerned": sum(a is not b for a, b in pairs), "images": count,
            "stored_bytes_new_over_old": round(sum(map(len, new)) / sum(map(len, old)), 4), "steps": steps}
        print(f"~{side} px", result["sides"][f"~{side} px"], flush=True)
    save_json(arguments.output, result)


if __name__ == "__main__":
    main()
