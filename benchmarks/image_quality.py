"""Which resize after a DCT-scaled decode? Quality (PSNR against a float reference) and cost, measured; and
where the crop lands at every DCT scale, per shrink class.

    python benchmarks/image_quality.py [--images N] [--fidelity-images M]

For RandomResizedCrop-160 crops of photo JPEGs (~256 and ~500 px), compares against a reference made in
float64 (full decode, crop, antialiased cubic-spline resize with scikit-image):
* FFCV's method: full decode, uint8 INTER_AREA resize;
* beton's: decode at the DCT scale that keeps the crop >= the output, then INTER_LINEAR where the remaining
  shrink is below a threshold and INTER_AREA above it, for several thresholds; and the same with
  libjpeg-turbo's fast chroma upsampling (``fast_upsample=True``, RandomResizedCrop's default) or its fast
  integer IDCT.
Also reports microseconds per image of the decode + resize.

The crop-fidelity part holds the crop decoders (their own decode and resize, as the loader runs them) to the
reference a user would write: full decode, the same crop, cv2 INTER_AREA; center crops (224/256) and
RandomResizedCrops of ~256 and ~500 px photos, outputs 32 to 224, grouped by shrink (crop side / output side:
< 2x, 2-4x, >= 4x), for the crop mapped exactly onto the DCT-scaled decode (beton) and widened to whole scaled
pixels (beton before issue 28), and for the same pixels stored raw (the full decode) against JPEG.
Writes benchmarks/results/image_quality.json.
"""

from __future__ import annotations

import json
import math
import os
import time

import cv2
import numpy as np
import simplejpeg

from beton.tools.bench.report import argument_parser, run_header, save_json
from beton.decoders.image_crops import center_crop, random_resized_crop
from beton.decoders.rgb_image import choose_dct_factor, resize_into
from beton.tools.sample_photos import photo_crop

OUTPUT = 160
THRESHOLDS = (2.0, 3.0, float("inf"))
FIDELITY_OUTPUTS = (32, 64, 96, 160, 224)
SHRINK_CLASSES = ("< 2x", "2-4x", ">= 4x")
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


def scaled_decode(jpeg: bytes, crop, threshold: float, output: int = OUTPUT, whole_pixels: bool = False,
                  **decode_options: bool) -> np.ndarray:
    """beton's method: DCT-scaled decode, the crop mapped onto it exactly (``whole_pixels``: widened to whole
    scaled pixels, as before issue 28), bilinear below ``threshold`` shrink, area averaging above."""
    top, left, crop_height, crop_width = crop
    height, width, _, _ = simplejpeg.decode_jpeg_header(jpeg)
    factor = choose_dct_factor(crop_height, crop_width, output, output)
    image = simplejpeg.decode_jpeg(jpeg, min_height=-(-height // factor), min_width=-(-width // factor),
                                   min_factor=factor, **decode_options)
    scaled = (top / factor, left / factor, crop_height / factor, crop_width / factor)
    if whole_pixels:
        bottom, right = math.ceil((top + crop_height) * image.shape[0] / height), \
            math.ceil((left + crop_width) * image.shape[1] / width)
        y0, x0 = int(top * image.shape[0] / height), int(left * image.shape[1] / width)
        scaled = (y0, x0, min(image.shape[0], bottom) - y0, min(image.shape[1], right) - x0)
    out = np.empty((output, output, image.shape[2]), np.uint8)
    resize_into(image, out, scaled, area_above=threshold)
    return out


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


def shrink_class(crop, output: int) -> str:
    shrink = max(crop[2], crop[3]) / output
    return SHRINK_CLASSES[0] if shrink < 2 else SHRINK_CLASSES[1] if shrink < 4 else SHRINK_CLASSES[2]


def crop_fidelity(count: int) -> dict:
    """PSNR per shrink class against full decode + the same crop + INTER_AREA (see the module docstring)."""
    scores: dict[str, dict[str, list[float]]] = {}
    factors: dict[str, set[int]] = {}
    for side in (256, 500):
        for index in range(count):
            shape = (side, side * 4 // 3) if index % 2 else (side * 4 // 3, side)
            jpeg = simplejpeg.encode_jpeg(photo_crop(index, *shape, seed=side), quality=90, colorsubsampling="420")
            full = simplejpeg.decode_jpeg(jpeg)
            for output in FIDELITY_OUTPUTS:
                crop_list = [center_crop(*shape, 224 / 256)] + [
                    random_resized_crop(np.uint64(side), index * 8 + k, *shape, 0.08, 1.0, math.log(3 / 4),
                                        math.log(4 / 3)) for k in range(2)]
                for crop in crop_list:
                    top, left, height, width = crop
                    reference = cv2.resize(full[top : top + height, left : left + width], (output, output),
                                           interpolation=cv2.INTER_AREA)
                    raw = np.empty_like(reference)
                    resize_into(full, raw, crop)  # the raw-stored image's path
                    exact = scaled_decode(jpeg, crop, 3.0, output)
                    shrink = shrink_class(crop, output)
                    factors.setdefault(shrink, set()).add(choose_dct_factor(height, width, output, output))
                    for name, image, versus in (
                            ("JPEG, exact mapping (beton)", exact, reference),
                            ("JPEG, whole scaled pixels (before)", scaled_decode(jpeg, crop, 3.0, output, True),
                             reference),
                            ("raw", raw, reference), ("raw vs JPEG (beton)", raw, exact)):
                        scores.setdefault(name, {}).setdefault(shrink, []).append(psnr(image, versus))
    result = {name: {shrink: {"mean_psnr_db": round(float(np.mean(values)), 2),
                              "min_psnr_db": round(float(np.min(values)), 2), "crops": len(values)}
                     for shrink, values in sorted(classes.items(), key=lambda item: SHRINK_CLASSES.index(item[0]))}
              for name, classes in scores.items()}
    result["dct_factors"] = {shrink: sorted(values) for shrink, values in factors.items()}
    return result


def main() -> None:
    parser = argument_parser(__doc__, images=300)
    parser.add_argument("--fidelity-images", type=int, default=24)
    arguments = parser.parse_args()
    cv2.setNumThreads(1)
    # timings mean little on a loaded host: the load is recorded with them
    result = {**run_header(), "load_average_1_5_15_min_at_start": [round(v, 1) for v in os.getloadavg()]}
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
    result["crop fidelity vs full decode + INTER_AREA, per shrink class"] = crop_fidelity(arguments.fidelity_images)
    save_json(RESULTS, result)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
