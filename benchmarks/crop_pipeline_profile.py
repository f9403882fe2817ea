"""Where a RandomResizedCrop-160 + flip pipeline's time goes, per image: CPU time on one thread, steps added one
at a time, rounds alternating.

    python benchmarks/crop_pipeline_profile.py [--images N] [--repeats R]

On the benchmark suite's photos (``make_jpegs``, ~256 and ~500 px) and its crops (the loader's key for epoch 0):
the decoder's own decode step (:meth:`decoded_crop` on the JPEGs as the field stores them, what the suite's
crop-only limit runs), the decode and the
resize into the batch (:func:`resize_into`), then the Loader with ``num_workers=0`` (the same work plus reading
the file, Python per sample and per batch, and gathering into the batch) with the decoder alone, with the flip,
and with ``ToTensor`` + ``ToTorchImage``. ``time.process_time``: CPU time, which a host loaded by other processes
moves far less than wall time. Writes benchmarks/results/crop_pipeline_profile.json.
"""

from __future__ import annotations

import os
import statistics
import tempfile

import cv2
import numpy as np
import simplejpeg

from beton import Loader, OrderOption
from beton.codecs.jpeg_restarts import with_restart_markers
from beton.decoders import IntDecoder, RandomResizedCropRGBImageDecoder
from beton.decoders.rgb_image import resize_into
from beton.pipeline.operation import Scratch
from beton.random import operation_key
from beton.tools.bench.contenders import write_beton_images
from beton.tools.bench.data import make_jpegs
from beton.tools.bench.report import argument_parser, run_header, save_json
from beton.tools.bench.timing import alternating_cpu_seconds
from beton.transforms import RandomHorizontalFlip, ToTensor, ToTorchImage

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "crop_pipeline_profile.json")


def steps(jpegs: list[bytes], path: str) -> dict:
    """Each step: a function doing one pass over every image."""
    decoder = RandomResizedCropRGBImageDecoder((160, 160))
    key = operation_key(0, 0, 0, 0)  # the loader's key for the image decoder in epoch 0
    payloads = [np.frombuffer(with_restart_markers(jpeg), np.uint8) for jpeg in jpegs]  # as stored
    shapes = [(*simplejpeg.decode_jpeg_header(jpeg)[:2], 3) for jpeg in jpegs]
    scratch, out = Scratch(), np.empty((160, 160, 3), np.uint8)

    def decode(resize: bool) -> None:
        for index, payload in enumerate(payloads):
            crop = decoder.crop(key, index, *shapes[index][:2])
            image, scaled = decoder.decoded_crop(payload, shapes[index], crop, out.shape, scratch)
            if resize:
                resize_into(image, out, scaled, scratch=scratch)

    def loader(*operations) -> callable:
        built = Loader(path, batch_size=64, num_workers=0, order=OrderOption.RANDOM, seed=0, os_cache=True,
                       pipelines={"image": [decoder, *operations], "label": [IntDecoder(), ToTensor()]})
        return lambda: sum(len(labels) for _, labels in built)

    return {"decode (crop only)": lambda: decode(False), "decode + resize": lambda: decode(True),
            "Loader: decoder": loader(), "Loader: decoder + flip": loader(RandomHorizontalFlip()),
            "Loader: decoder + flip + ToTensor + ToTorchImage": loader(RandomHorizontalFlip(), ToTensor(),
                                                                       ToTorchImage())}


def profile(jpegs: list[bytes], path: str, repeats: int) -> dict:
    times = {name: [value / len(jpegs) * 1e6 for value in values]  # after a warm-up: compilation, page cache
             for name, values in alternating_cpu_seconds(steps(jpegs, path), repeats).items()}
    decode = times["decode (crop only)"]
    return {"us_per_image_median": {name: round(statistics.median(values), 1) for name, values in times.items()},
            "over_decode_paired_median": {name: round(statistics.median(v / d for v, d in zip(values, decode)), 3)
                                          for name, values in times.items()}}


def main() -> None:
    parser = argument_parser(__doc__, images=640, repeats=9)
    arguments = parser.parse_args()
    cv2.setNumThreads(1)
    result = {**run_header(), "load_average_1_5_15_min_at_start": [round(v, 1) for v in os.getloadavg()],
              "images": arguments.images, "repeats": arguments.repeats, "sides": {}}
    with tempfile.TemporaryDirectory() as directory:
        for side in (256, 500):
            jpegs = make_jpegs(arguments.images, side)
            path = write_beton_images(jpegs, os.path.join(directory, f"{side}.beton"))
            result["sides"][f"~{side} px"] = entry = profile(jpegs, path, arguments.repeats)
            print(f"~{side} px: {entry}", flush=True)
    result["load_average_1_5_15_min_at_end"] = [round(v, 1) for v in os.getloadavg()]
    save_json(RESULTS, result)


if __name__ == "__main__":
    main()
