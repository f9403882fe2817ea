"""What restart markers cost when a file is written and save when crops are decoded (docs/images.md, "Only the
part of the JPEG a crop needs").

    python benchmarks/crop_regions.py [--images N] [--repeats R]

On the benchmark suite's photos (``make_jpegs``: ~256 and ~500 px, quality 90, 4:2:0), one thread:

* bytes: the JPEGs as the field stores them (:func:`with_restart_markers`) over the JPEGs given;
* write cost: ``with_restart_markers`` per image, and a full ``simplejpeg`` decode of the same image for scale;
  and a full decode of the image with restart markers over one without (paired), their cost when read;
* pixels decoded: the part of each image the crop decoders decode, over the image, for RandomResizedCrop-160
  (box upsampling) and CenterCrop-224 (triangle upsampling), with restart markers and without (rows above the
  crop's bottom);
* time: the decoder's decode and resize (:meth:`decoded_crop`, :func:`resize_into`) per image, with and without
  restart markers, rounds alternating; "speedup" is the median of the per-round ratios.

Writes benchmarks/results/crop_regions.json.
"""

from __future__ import annotations

import os
import statistics
import time

import cv2
import numpy as np
import simplejpeg

from beton.codecs.jpeg_restarts import with_restart_markers
from beton.decoders import CenterCropRGBImageDecoder, RandomResizedCropRGBImageDecoder
from beton.decoders.rgb_image import choose_dct_factor, resize_into
from beton.pipeline.operation import Scratch
from beton.random import operation_key
from beton.tools.bench.data import make_jpegs
from beton.tools.bench.report import argument_parser, run_header, save_json

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "crop_regions.json")
DECODERS = {"RandomResizedCrop-160": RandomResizedCropRGBImageDecoder((160, 160)),
            "CenterCrop-224": CenterCropRGBImageDecoder((224, 224))}


def per_image_us(function, items) -> float:
    start = time.perf_counter()
    for item in items:
        function(item)
    return (time.perf_counter() - start) / len(items) * 1e6


def crops_pass(decoder, payloads, shapes, crops) -> tuple[float, float]:
    """(µs per image, decoded pixels over image pixels) of one pass of the decoder's decode and resize."""
    scratch, out = Scratch(), np.empty((*decoder.output_size, 3), np.uint8)
    decoded = 0
    start = time.perf_counter()
    for payload, shape, crop in zip(payloads, shapes, crops):
        image, scaled = decoder.decoded_crop(payload, shape, crop, out.shape, scratch)
        resize_into(image, out, scaled, scratch=scratch)
        factor = choose_dct_factor(crop[2], crop[3], *decoder.output_size)
        decoded += image.shape[0] * image.shape[1] * factor * factor
    return (time.perf_counter() - start) / len(payloads) * 1e6, decoded / sum(h * w for h, w, _ in shapes)


def side_figures(jpegs: list[bytes], repeats: int) -> dict:
    stored = [with_restart_markers(jpeg) for jpeg in jpegs]
    shapes = [(*simplejpeg.decode_jpeg_header(jpeg)[:2], 3) for jpeg in jpegs]
    write = {"with_restart_markers": [], "full decode": [], "full decode, restart markers added": []}
    for _ in range(repeats):
        write["with_restart_markers"].append(per_image_us(with_restart_markers, jpegs))
        write["full decode"].append(per_image_us(simplejpeg.decode_jpeg, jpegs))
        write["full decode, restart markers added"].append(per_image_us(simplejpeg.decode_jpeg, stored))
    result = {"stored_bytes_over_given": round(sum(map(len, stored)) / sum(map(len, jpegs)), 4),
              "write_us_per_image_median": {k: round(statistics.median(v), 1) for k, v in write.items()},
              # libjpeg-turbo leaves its fast Huffman path for a JPEG with a restart interval
              "whole_decode_with_markers_over_without_paired_median": round(statistics.median(
                  a / b for a, b in zip(write["full decode, restart markers added"], write["full decode"])), 3),
              "decoders": {}}
    key = operation_key(0, 0, 0, 0)
    for name, decoder in DECODERS.items():
        crops = [decoder.crop(key, index, h, w) for index, (h, w, _) in enumerate(shapes)]
        times = {"without restart markers": [], "with restart markers": []}
        fractions = {}
        for _ in range(repeats):
            for label, data in (("without restart markers", jpegs), ("with restart markers", stored)):
                us, fractions[label] = crops_pass(decoder, [np.frombuffer(d, np.uint8) for d in data], shapes, crops)
                times[label].append(us)
        result["decoders"][name] = {
            "decoded_pixels_over_image": {k: round(v, 3) for k, v in fractions.items()},
            "decode_and_resize_us_per_image_median": {k: round(statistics.median(v), 1) for k, v in times.items()},
            "speedup_paired_median": round(statistics.median(
                a / b for a, b in zip(times["without restart markers"], times["with restart markers"])), 3)}
    return result


def main() -> None:
    parser = argument_parser(__doc__, images=500, repeats=9)
    arguments = parser.parse_args()
    cv2.setNumThreads(1)
    result = {**run_header(), "load_average_1_5_15_min_at_start": [round(v, 1) for v in os.getloadavg()],
              "images": arguments.images, "repeats": arguments.repeats, "sides": {}}
    for side in (256, 500):
        result["sides"][f"~{side} px"] = entry = side_figures(make_jpegs(arguments.images, side), arguments.repeats)
        print(f"~{side} px: {entry}", flush=True)
    result["load_average_1_5_15_min_at_end"] = [round(v, 1) for v in os.getloadavg()]
    save_json(RESULTS, result)


if __name__ == "__main__":
    main()
