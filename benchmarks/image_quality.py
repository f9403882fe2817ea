"""Which resize after a DCT-scaled decode? Quality (PSNR against a float reference) and cost, measured.

    python benchmarks/image_quality.py [--images N]

For RandomResizedCrop-160 crops of photo JPEGs (~256 and ~500 px), compares against a reference made in
float64 (full decode, crop, antialiased cubic-spline resize with scikit-image):
* FFCV's method: full decode, uint8 INTER_AREA resize;
* beton's: decode at the DCT scale that keeps the crop >= the output, then INTER_LINEAR where the remaining
  shrink is below a threshold and INTER_AREA above it, for several thresholds; and the same with
  libjpeg-turbo's fast chroma upsampling (``fast_upsample=True``, RandomResizedCrop's default) or its fast
  integer IDCT.
Also reports microseconds per image of the decode + resize. Writes benchmarks/results/image_quality.json.
"""

from __future__ import annotations

import json
import math
import os
import time

import cv2
import numpy as np
import simplejpeg

from beton.tools.bench.report import argument_parser, save_json
from beton.decoders.image_crops import random_resized_crop
from beton.decoders.rgb_image import choose_dct_factor
from beton.tools.sample_photos import photo_crop

OUTPUT = 160
THRESHOLDS = (2.0, 3.0, float("inf"))
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "image_quality.json")


def psnr(image: np.ndarray, reference: np.ndarray) -> float:
    error = np.mean((image.astype(np.float64) - reference) ** 2)
    return 99.0 if error == 0 else 10 * math.log10(255.0**2 / error)


def crops(jpeg: bytes, index: int):
    height, width, _, _ = simplejpeg.decode_jpeg_header(jpeg)
    return random_resized_crop(np.uint64(1234), index, height, width, 0.08, 1.0, math.log(3 / 4), math.log(4 / 3))


def full_decode_area(jpeg: bytes, crop) -> np.ndarray:
    top, left, height, width = crop
    image = simplejpeg.decode_jpeg(jpeg)
    return cv2.resize(image[top : top + height, left : left + width], (OUTPUT, OUTPUT), interpolation=cv2.INTER_AREA)


def scaled_decode(jpeg: bytes, crop, threshold: float, **decode_options: bool) -> np.ndarray:
    top, left, crop_height, crop_width = crop
    height, width, _, _ = simplejpeg.decode_jpeg_header(jpeg)
    factor = choose_dct_factor(crop_height, crop_width, OUTPUT, OUTPUT)
    image = simplejpeg.decode_jpeg(jpeg, min_height=-(-height // factor), min_width=-(-width // factor),
                                   min_factor=factor, **decode_options)
    scale_y, scale_x = image.shape[0] / height, image.shape[1] / width
    region = image[int(top * scale_y) : min(image.shape[0], math.ceil((top + crop_height) * scale_y)),
                   int(left * scale_x) : min(image.shape[1], math.ceil((left + crop_width) * scale_x))]
    shrink = max(region.shape[0] / OUTPUT, region.shape[1] / OUTPUT)
    interpolation = cv2.INTER_AREA if shrink >= threshold else cv2.INTER_LINEAR
    return cv2.resize(region, (OUTPUT, OUTPUT), interpolation=interpolation)


def reference(jpeg: bytes, crop) -> np.ndarray:
    """Full decode, crop, then an antialiased cubic-spline resize in float64 (scikit-image)."""
    from skimage.transform import resize

    top, left, height, width = crop
    image = simplejpeg.decode_jpeg(jpeg).astype(np.float64)
    return resize(image[top : top + height, left : left + width], (OUTPUT, OUTPUT), order=3, anti_aliasing=True,
                  preserve_range=True)


def timed(function, jpegs, crop_list) -> float:
    start = time.perf_counter()
    for jpeg, crop in zip(jpegs, crop_list):
        function(jpeg, crop)
    return (time.perf_counter() - start) / len(jpegs) * 1e6


def main() -> None:
    parser = argument_parser(__doc__, images=300)
    arguments = parser.parse_args()
    cv2.setNumThreads(1)
    result = {}
    for side in (256, 500):
        jpegs = [simplejpeg.encode_jpeg(photo_crop(i, side, int(side * 1.3)), quality=90, colorsubsampling="420")
                 for i in range(arguments.images)]
        crop_list = [crops(jpeg, i) for i, jpeg in enumerate(jpegs)]
        references = [reference(jpeg, crop) for jpeg, crop in zip(jpegs, crop_list)]
        ffcv_outputs = [full_decode_area(jpeg, crop) for jpeg, crop in zip(jpegs, crop_list)]
        methods = {"full decode + INTER_AREA (FFCV)": full_decode_area}
        for threshold in THRESHOLDS:
            methods[f"DCT-scaled + LINEAR below shrink {threshold}"] = (
                lambda jpeg, crop, t=threshold: scaled_decode(jpeg, crop, t))
        methods["DCT-scaled + LINEAR below shrink 3.0, fast chroma upsampling (beton's RandomResizedCrop)"] = (
            lambda jpeg, crop: scaled_decode(jpeg, crop, 3.0, fastupsample=True))
        methods["DCT-scaled + LINEAR below shrink 3.0, fast integer IDCT (not used)"] = (
            lambda jpeg, crop: scaled_decode(jpeg, crop, 3.0, fastdct=True))
        scenario = {}
        for name, function in methods.items():
            outputs = [function(jpeg, crop) for jpeg, crop in zip(jpegs, crop_list)]
            scores = [psnr(out, ref) for out, ref in zip(outputs, references)]
            versus_ffcv = [psnr(out, ffcv.astype(np.float64)) for out, ffcv in zip(outputs, ffcv_outputs)]
            scenario[name] = {"mean_psnr_db": round(float(np.mean(scores)), 2),
                              "min_psnr_db": round(float(np.min(scores)), 2),
                              "mean_psnr_vs_ffcv_method_db": round(float(np.mean(versus_ffcv)), 2),
                              "min_psnr_vs_ffcv_method_db": round(float(np.min(versus_ffcv)), 2),
                              "us_per_image": round(timed(function, jpegs, crop_list))}
        result[f"~{side} px"] = scenario
    save_json(RESULTS, result)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
