"""What mapping crops exactly onto DCT-scaled decodes costs: CPU time per image, old and new resize, paired.

    python benchmarks/crop_mapping_cost.py [--images N] [--repeats R]

For the benchmark suite's photos (``make_jpegs``, ~256 and ~500 px) and its crops (RandomResizedCrop-160 with
the loader's key for epoch 0, CenterCrop-224 and -160), decodes each image once as the crop decoder does
(:meth:`decoded_crop`), then times on one thread (``time.thread_time``: CPU time, which a host loaded by other
processes moves far less than wall time) the resize as it is (:func:`resize_into`, the crop mapped exactly)
against the resize before issue 28 (the crop widened to whole decoded pixels, a plain ``cv2.resize``), rounds
alternating, and the decode itself. Each resize reads an image just copied into one buffer, as in the decoder,
which resizes the pixels it has just decoded, still in the CPU's cache. The cost is reported per image and as a share of decode + resize.
Writes benchmarks/results/crop_mapping_cost.json.
"""

from __future__ import annotations

import math
import os
import statistics
import time

import cv2
import numpy as np
import simplejpeg

from beton.decoders import CenterCropRGBImageDecoder, RandomResizedCropRGBImageDecoder
from beton.decoders.rgb_image import choose_dct_factor, resize_into
from beton.pipeline.operation import Scratch
from beton.random import operation_key
from beton.tools.bench.data import make_jpegs
from beton.tools.bench.report import argument_parser, run_header, save_json

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "crop_mapping_cost.json")


def widened_resize(image: np.ndarray, crop, shape: tuple[int, int], factor: int, out: np.ndarray) -> None:
    """The resize before issue 28: the crop's bounds floored and ceiled at the decoded scale."""
    top, left, height, width = crop
    scale_y, scale_x = -(-shape[0] // factor) / shape[0], -(-shape[1] // factor) / shape[1]
    y0, x0 = int(top * scale_y), int(left * scale_x)
    region = image[y0 : min(image.shape[0], math.ceil((top + height) * scale_y)),
                   x0 : min(image.shape[1], math.ceil((left + width) * scale_x))]
    shrink = max(region.shape[0] / out.shape[0], region.shape[1] / out.shape[1])
    cv2.resize(region, out.shape[1::-1], dst=out, interpolation=cv2.INTER_AREA if shrink >= 3 else cv2.INTER_LINEAR)


def cpu_per_image(function, count: int) -> float:
    start = time.thread_time()
    function()
    return (time.thread_time() - start) / count * 1e6


def scenario(jpegs: list[bytes], decoder, repeats: int) -> dict:
    key = operation_key(0, 0, 0, 0)  # the loader's key for the image decoder in epoch 0
    out = np.empty((*decoder.output_size, 3), np.uint8)
    scratch = Scratch()
    items = []
    for index, jpeg in enumerate(jpegs):
        payload = np.frombuffer(jpeg, np.uint8)
        shape = tuple(simplejpeg.decode_jpeg_header(jpeg)[:2])
        crop = decoder.crop(key, index, *shape)
        image, scaled = decoder.decoded_crop(payload, (*shape, 3), crop, out.shape, scratch)
        factor = choose_dct_factor(crop[2], crop[3], *decoder.output_size)
        items.append((payload, shape, crop, image.copy(), scaled, factor))

    def decode() -> None:
        for payload, shape, crop, _, _, _ in items:
            decoder.decoded_crop(payload, (*shape, 3), crop, out.shape, scratch)

    def just_decoded(image: np.ndarray) -> np.ndarray:
        """``image`` copied into the slot's decode buffer: in the CPU's cache, as a decoder's output is when the
        decoder resizes it (read from the 200 stored copies instead, each resize would pay the cache misses of
        its first pass, which the shift takes from the resize where there is one). Both sides pay the copy."""
        hot = scratch(image.nbytes, "decoded").reshape(image.shape)
        hot[...] = image
        return hot

    def exact() -> None:
        for _, _, _, image, scaled, _ in items:
            resize_into(just_decoded(image), out, scaled, scratch=scratch)  # as the decoder calls it

    def widened() -> None:
        for _, shape, crop, image, _, factor in items:
            widened_resize(just_decoded(image), crop, shape, factor, out)

    functions = {"decode": decode, "resize, exact mapping": exact, "resize, widened (before)": widened}
    for function in functions.values():
        function()
    times: dict[str, list[float]] = {name: [] for name in functions}
    for _ in range(repeats):
        for name, function in functions.items():
            times[name].append(cpu_per_image(function, len(items)))
    extra = [e - w for e, w in zip(times["resize, exact mapping"], times["resize, widened (before)"])]
    total = [d + w for d, w in zip(times["decode"], times["resize, widened (before)"])]
    return {"us_per_image_median": {name: round(statistics.median(values), 1) for name, values in times.items()},
            "extra_us_per_image_median": round(statistics.median(extra), 1),
            "extra_share_of_decode_and_resize": round(statistics.median(e / t for e, t in zip(extra, total)), 4),
            "images_with_fractional_crop": round(sum(
                any(float(v) != int(v) for v in item[4]) for item in items) / len(items), 3)}


def main() -> None:
    parser = argument_parser(__doc__, images=500, repeats=9)
    arguments = parser.parse_args()
    cv2.setNumThreads(1)
    result = {**run_header(), "load_average_1_5_15_min_at_start": [round(v, 1) for v in os.getloadavg()],
              "images": arguments.images, "repeats": arguments.repeats, "scenarios": {}}
    for side in (256, 500):
        jpegs = make_jpegs(arguments.images, side)
        for name, decoder in (("RandomResizedCrop-160", RandomResizedCropRGBImageDecoder((160, 160))),
                              ("CenterCrop-224", CenterCropRGBImageDecoder((224, 224))),
                              ("CenterCrop-160", CenterCropRGBImageDecoder((160, 160)))):
            entry = scenario(jpegs, decoder, arguments.repeats)
            result["scenarios"][f"{name}, ~{side} px"] = entry
            print(f"{name}, ~{side} px: {entry}", flush=True)
    save_json(RESULTS, result)


if __name__ == "__main__":
    main()
