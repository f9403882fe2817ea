"""Crop decoders against the reference a user would write: full decode, the same crop, cv2 INTER_AREA.

Where a JPEG is decoded at a DCT scale (1/2, 1/4, 1/8), the crop must land on the same pixels as at full scale:
the decoders map it onto the scaled image with sub-pixel precision. Held per shrink class (crop side over output
side) on real photos, for center and random-resized crops, and for the same pixels stored raw and as JPEG (what
``beton tune`` does to a file), at every DCT scale.
"""

from __future__ import annotations

import math

import cv2
import numpy as np
import pytest
import simplejpeg

from beton import Loader
from beton.decoders import CenterCropRGBImageDecoder, IntDecoder, RandomResizedCropRGBImageDecoder
from beton.decoders.rgb_image import choose_dct_factor, resize_into
from beton.fields import IntField, RGBImageField
from beton.random import operation_key
from beton.tools.sample_photos import PHOTO_NAMES, photo_crop
from beton.transforms import ToTensor

from conftest import write

MEAN_DB, WORST_DB = 32.0, 28.0
SIDES = (256, 500)  # the shorter side; portrait and landscape alternate
CENTER_OUTPUTS = (32, 64, 96, 160, 224)
RANDOM_OUTPUTS = (48, 112)
SEED = 3


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    error = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return 99.0 if error == 0 else 10 * math.log10(255**2 / error)


def shrink_class(crop_height: int, crop_width: int, out: int) -> str:
    shrink = max(crop_height, crop_width) / out
    return "< 2x" if shrink < 2 else "2-4x" if shrink < 4 else ">= 4x"


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """Each photo as a quality-90 4:2:0 JPEG, stored twice: as it is and as its decoded pixels (raw)."""
    jpegs = []
    for side in SIDES:
        for index in range(len(PHOTO_NAMES)):
            shape = (side, side * 4 // 3) if index % 2 else (side * 4 // 3, side)
            jpegs.append(simplejpeg.encode_jpeg(photo_crop(index, *shape), quality=90, colorsubsampling="420"))
    full = [simplejpeg.decode_jpeg(jpeg) for jpeg in jpegs]
    path = write(tmp_path_factory.mktemp("fidelity") / "photos.beton",
                 {"jpeg": RGBImageField(write_mode="jpg"), "raw": RGBImageField(write_mode="raw"),
                  "label": IntField()},
                 [(jpeg, pixels, i) for i, (jpeg, pixels) in enumerate(zip(jpegs, full))])
    return path, full


def decoded(path, decoder_for) -> tuple[dict[str, np.ndarray], np.ndarray, Loader]:
    pipelines = {"jpeg": [decoder_for(), ToTensor()], "raw": [decoder_for(), ToTensor()],
                 "label": [IntDecoder(), ToTensor()]}
    with Loader(path, batch_size=len(SIDES) * len(PHOTO_NAMES), num_workers=2, seed=SEED,
                pipelines=pipelines) as loader:
        jpeg, raw, labels = next(iter(loader))
        return {"jpeg": jpeg.numpy(), "raw": raw.numpy()}, labels.numpy().ravel(), loader


def test_center_and_random_crops_match_a_full_decode_at_every_scale(photos):
    path, full = photos
    scores: dict[str, dict[str, list[float]]] = {}
    factors = set()

    def score(name: str, image: np.ndarray, pixels: np.ndarray, crop, out: int) -> None:
        top, left, height, width = crop
        reference = cv2.resize(pixels[top : top + height, left : left + width], (out, out),
                               interpolation=cv2.INTER_AREA)
        scores.setdefault(name, {}).setdefault(shrink_class(height, width, out), []).append(psnr(image, reference))

    for out in CENTER_OUTPUTS:
        decoder = CenterCropRGBImageDecoder((out, out))
        images, labels, _ = decoded(path, lambda: decoder)
        for i, label in enumerate(labels):
            crop = decoder.crop(np.uint64(0), label, *full[label].shape[:2])
            factors.add(choose_dct_factor(crop[2], crop[3], out, out))
            for storage in ("jpeg", "raw"):
                score(f"center, {storage}", images[storage][i], full[label], crop, out)
            scores.setdefault("center, raw vs jpeg", {}).setdefault(shrink_class(crop[2], crop[3], out), []).append(
                psnr(images["raw"][i], images["jpeg"][i]))
    for out in RANDOM_OUTPUTS:
        decoder = RandomResizedCropRGBImageDecoder((out, out))
        images, labels, loader = decoded(path, lambda: RandomResizedCropRGBImageDecoder((out, out)))
        for storage in ("jpeg", "raw"):
            key = operation_key(SEED, 0, loader.plan.output_names.index(storage), 0)
            for i, label in enumerate(labels):
                crop = decoder.crop(key, label, *full[label].shape[:2])
                factors.add(choose_dct_factor(crop[2], crop[3], out, out))
                score(f"random, {storage}", images[storage][i], full[label], crop, out)

    assert factors == {1, 2, 4, 8}
    for name, classes in scores.items():
        assert set(classes) == {"< 2x", "2-4x", ">= 4x"} or name.startswith("random"), (name, set(classes))
        for shrink, values in classes.items():
            assert np.mean(values) >= MEAN_DB and min(values) >= WORST_DB, \
                (name, shrink, round(float(np.mean(values)), 1), round(min(values), 1))


@pytest.mark.parametrize("factor, out", [(2, 40), (2, 12), (4, 40), (4, 12)])
def test_resize_into_samples_a_fractional_rectangle_where_it_lies(factor, out):
    """An image box-averaged by ``factor`` (pixel j covers [j f, j f + f)), the crop mapped onto it exactly: close
    to the full-resolution crop's INTER_AREA resize, bilinear (remaining shrink < 3) and area paths alike, and
    clearly closer than the rectangle widened to whole pixels."""
    exact, widened = [], []
    for index in range(len(PHOTO_NAMES)):
        photo = photo_crop(index, 480, 480)
        small = cv2.resize(photo, (480 // factor, 480 // factor), interpolation=cv2.INTER_AREA)
        rng = np.random.default_rng(index)
        for _ in range(4):
            height, width = (int(side) for side in rng.integers(300, 400, 2))
            top, left = int(rng.integers(0, 480 - height)), int(rng.integers(0, 480 - width))
            reference = cv2.resize(photo[top : top + height, left : left + width], (out, out),
                                   interpolation=cv2.INTER_AREA)
            image = np.empty((out, out, 3), np.uint8)
            resize_into(small, image, (top / factor, left / factor, height / factor, width / factor))
            exact.append(psnr(image, reference))
            resize_into(small[top // factor : -(-(top + height) // factor),
                              left // factor : -(-(left + width) // factor)], image)
            widened.append(psnr(image, reference))
    assert np.mean(exact) >= 38 and min(exact) >= 30, (np.mean(exact), min(exact))
    assert np.mean(exact) >= np.mean(widened) + 2, (np.mean(exact), np.mean(widened))
