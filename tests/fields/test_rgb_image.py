"""RGBImageField and the image decoders: storage modes, crops, quality, errors and memory bounds."""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys
import textwrap

import cv2
import numpy as np
import pytest
import simplejpeg
import torch

import beton
from beton import Loader, OrderOption
from beton.codecs.jpeg_restarts import with_restart_markers
from beton.errors import DecodeError, EncodeError, FieldError, PipelineError
from beton.fields import IntField, RGBImageField
from beton.decoders import (
    CenterCropRGBImageDecoder,
    IntDecoder,
    RandomResizedCropRGBImageDecoder,
    SimpleRGBImageDecoder,
)
from beton.decoders.image_crops import center_crop, random_resized_crop
from beton.tools.sample_photos import photo_crop
from beton.transforms import ToTensor
from beton.transforms.flip import RandomHorizontalFlip

from conftest import write


def psnr(a, b):
    error = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return 99.0 if error == 0 else 10 * math.log10(255**2 / error)


PHOTOS = [photo_crop(i, 60 + 13 * (i % 5), 70 + 17 * (i % 4)) for i in range(24)]


@pytest.fixture(scope="module")
def photo_files(tmp_path_factory):
    directory = tmp_path_factory.mktemp("photos")
    samples = [(image, i) for i, image in enumerate(PHOTOS)]
    return {mode: write(directory / f"{mode}.beton", {"image": RGBImageField(write_mode=mode), "label": IntField()},
                        samples, page_size=4096)
            for mode in ("raw", "jpg")}


def test_raw_images_read_back_exactly_and_jpeg_within_jpeg_error(photo_files):
    with beton.Reader(photo_files["raw"]) as reader:
        for i, image in enumerate(PHOTOS):
            np.testing.assert_array_equal(reader[i][0], image)
            assert tuple(reader.data_table["image"][i][["height", "width", "channels"]].item()) == \
                (image.shape[0], image.shape[1], 3)
    with beton.Reader(photo_files["jpg"]) as reader:
        for i, image in enumerate(PHOTOS):
            assert psnr(reader[i][0], image) > 30


@pytest.mark.parametrize("channels, dtype", [(1, "uint8"), (3, "uint8"), (4, "uint8"), (4, "uint16"), (1, "uint16")])
def test_raw_round_trips_for_grayscale_four_channels_and_uint16(tmp_path, channels, dtype):
    rng = np.random.default_rng(channels)
    images = [rng.integers(0, np.iinfo(dtype).max, (5 + i, 7 + 2 * i, channels), dtype=dtype) for i in range(4)]
    path = write(tmp_path / "r.beton", {"image": RGBImageField(channels=channels, dtype=dtype)},
                 [(image,) for image in images])
    with beton.Reader(path) as reader:
        for i, image in enumerate(images):
            assert reader[i][0].dtype == np.dtype(dtype)
            np.testing.assert_array_equal(reader[i][0], image)
    with Loader(path, batch_size=4, num_workers=1,
                pipelines={"image": [CenterCropRGBImageDecoder((5, 5), ratio=1.0), ToTensor()]}) as loader:
        (batch,) = next(iter(loader))
        assert tuple(batch.shape) == (4, 5, 5, channels)


def test_grayscale_jpeg_round_trip(tmp_path):
    gray = [cv2.cvtColor(image, cv2.COLOR_RGB2GRAY) for image in PHOTOS[:5]]
    path = write(tmp_path / "g.beton", {"image": RGBImageField(write_mode="jpg", channels=1)}, [(g,) for g in gray])
    with beton.Reader(path) as reader:
        for i, image in enumerate(gray):
            assert reader[i][0].shape == image.shape + (1,) and psnr(reader[i][0][:, :, 0], image) > 30


def test_existing_jpegs_are_stored_as_they_are(tmp_path):
    jpegs = [simplejpeg.encode_jpeg(image, quality=75) for image in PHOTOS[:6]]
    path = write(tmp_path / "i.beton", {"image": RGBImageField(write_mode="jpg", restart_markers=False)},
                 [(j,) for j in jpegs])
    with beton.Reader(path) as reader:
        assert [reader.payload(i, "image").tobytes() for i in range(6)] == jpegs
    # by default with restart markers added losslessly: their coefficients as they are, so their pixels
    path = write(tmp_path / "j.beton", {"image": RGBImageField(write_mode="jpg")}, [(j,) for j in jpegs])
    with beton.Reader(path) as reader:
        for i in range(6):
            stored = reader.payload(i, "image").tobytes()
            assert stored == with_restart_markers(jpegs[i]) != jpegs[i] and b"\xff\xdd" in stored  # DRI
            np.testing.assert_array_equal(reader[i][0], simplejpeg.decode_jpeg(jpegs[i]))
    # too large for max_resolution: decoded, shrunk and re-encoded
    path = write(tmp_path / "k.beton", {"image": RGBImageField(write_mode="jpg", max_resolution=40)},
                 [(j,) for j in jpegs])
    with beton.Reader(path) as reader:
        for i in range(6):
            assert max(reader[i][0].shape[:2]) == 40 and reader.payload(i, "image").tobytes() != jpegs[i]
    # raw mode decodes them
    path = write(tmp_path / "l.beton", {"image": RGBImageField(write_mode="raw")}, [(j,) for j in jpegs])
    with beton.Reader(path) as reader:
        np.testing.assert_array_equal(reader[2][0], simplejpeg.decode_jpeg(jpegs[2]))


def test_pil_images_are_accepted(tmp_path):
    from PIL import Image

    images = [Image.fromarray(PHOTOS[0]), Image.fromarray(PHOTOS[1]).convert("L"), Image.fromarray(PHOTOS[2]).convert("P")]
    path = write(tmp_path / "p.beton", {"image": RGBImageField()}, [(image,) for image in images])
    with beton.Reader(path) as reader:
        np.testing.assert_array_equal(reader[0][0], PHOTOS[0])
        assert reader[1][0].shape == PHOTOS[1].shape  # grayscale replicated into RGB
        assert reader[2][0].shape == PHOTOS[2].shape


@pytest.mark.parametrize("mode", ["RGBA", "LA", "PA"])
def test_a_pil_image_s_alpha_is_never_dropped_silently(tmp_path, mode):
    """Refused with the two ways out for a field without alpha (LA was once converted to RGB without a word);
    kept by a 4-channel field."""
    from PIL import Image

    image = Image.fromarray(PHOTOS[0]).convert(mode)
    with pytest.raises(EncodeError, match=rf"alpha channel \(mode {mode}\).*convert\('RGB'\).*channels=4"):
        write(tmp_path / "a.beton", {"image": RGBImageField()}, [(image,)])
    path = write(tmp_path / "b.beton", {"image": RGBImageField(write_mode="raw", channels=4)}, [(image,)])
    with beton.Reader(path) as reader:
        np.testing.assert_array_equal(reader[0][0], np.asarray(image.convert("RGBA")))


def test_max_resolution_keeps_the_aspect_ratio(tmp_path):
    image = photo_crop(0, 300, 450)
    path = write(tmp_path / "m.beton", {"image": RGBImageField(max_resolution=150)}, [(image,)])
    with beton.Reader(path) as reader:
        assert reader[0][0].shape == (100, 150, 3)


def test_smart_and_proportion_modes(tmp_path):
    small, large = photo_crop(0, 10, 10), photo_crop(1, 100, 100)
    path = write(tmp_path / "s.beton", {"image": RGBImageField(write_mode="smart", smart_threshold=1000)},
                 [(small,), (large,)])
    with beton.Reader(path) as reader:
        assert reader.data_table["image"]["mode"].tolist() == [0, 1]
    no_threshold = write(tmp_path / "s0.beton", {"image": RGBImageField(write_mode="smart")}, [(small,), (large,)])
    with beton.Reader(no_threshold) as reader:  # FFCV's smart mode stores every image raw without a threshold
        assert reader.data_table["image"]["mode"].tolist() == [0, 0]
    samples = [(photo_crop(i, 20, 20),) for i in range(400)]
    field = {"image": RGBImageField(write_mode="proportion", compress_probability=0.25)}
    first = write(tmp_path / "p1.beton", field, samples)
    second = write(tmp_path / "p2.beton", field, samples, num_workers=2, chunksize=17)
    assert first.read_bytes() == second.read_bytes()
    with beton.Reader(first) as reader:
        assert 0.18 < reader.data_table["image"]["mode"].mean() < 0.32


def test_proportion_draws_once_per_jpeg_given_as_bytes(tmp_path):
    # A JPEG drawn to be stored raw must end up raw, not be re-encoded by a second draw.
    jpegs = [(simplejpeg.encode_jpeg(photo_crop(i, 16, 16), quality=90),) for i in range(400)]
    path = write(tmp_path / "p.beton", {"image": RGBImageField(write_mode="proportion", compress_probability=0.5)},
                 jpegs)
    with beton.Reader(path) as reader:
        modes = reader.data_table["image"]["mode"]
        assert 0.42 < modes.mean() < 0.58
        for i in np.flatnonzero(modes == 1)[:20]:
            assert bytes(reader.payload(int(i), "image")) == with_restart_markers(jpegs[i][0])  # not re-encoded


def test_balanced_mode_keeps_jpeg_bytes_and_stores_pixels_raw(tmp_path):
    jpeg, pixels = simplejpeg.encode_jpeg(photo_crop(0, 16, 24), quality=90), photo_crop(1, 20, 12)
    path = write(tmp_path / "b.beton", {"image": RGBImageField(write_mode="balanced")}, [(jpeg,), (pixels,)])
    with beton.Reader(path) as reader:
        assert reader.data_table["image"]["mode"].tolist() == [1, 0]
        assert bytes(reader.payload(0, "image")) == with_restart_markers(jpeg)  # not re-encoded
        np.testing.assert_array_equal(reader[1][0], pixels)


@pytest.mark.parametrize("kwargs, message", [
    ({"write_mode": "png"}, "write_mode"), ({"write_mode": "jpg", "channels": 4}, "JPEG stores"),
    ({"dtype": "float32"}, "dtype"), ({"jpeg_quality": 0}, "jpeg_quality"), ({"channels": 2}, "channels"),
    ({"jpeg_quality": 90.5}, "whole number"),
    ({"write_mode": "proportion", "compress_probability": None}, "needs a compress_probability"),
])
def test_bad_field_arguments(kwargs, message):
    with pytest.raises(FieldError, match=message):
        RGBImageField(**kwargs)


@pytest.mark.parametrize("value, message", [
    (np.zeros((4, 4, 3), np.float32), "uint8"), (np.zeros((4, 4, 4), np.uint8), "3 channels"),
    (b"\xff\xd8garbage", "JPEG bytes cannot be read"), ("a string", "expected an image"),
    (torch.zeros((3, 4, 4), dtype=torch.uint8), r"expected an image \(numpy array, PIL image or JPEG bytes\), got "
                                                "Tensor"),
    (cv2.imencode(".png", PHOTOS[1])[1].tobytes(), r"got bytes that hold a PNG image, not a JPEG: decode other "
                                                   r"formats first, e.g. np.asarray\(PIL.Image.open"),
    (cv2.imencode(".webp", PHOTOS[1])[1].tobytes(), "hold a WebP image"),
    (bytearray(b"GIF89a\x01\x00"), "got bytearray that hold a GIF image"),
    (b"", r"do not start as a JPEG does \(FF D8\): b''"),
])
def test_bad_images_name_sample_and_field(tmp_path, value, message):
    with pytest.raises(EncodeError, match=message) as caught:
        write(tmp_path / "bad.beton", {"image": RGBImageField(write_mode="jpg")}, [(PHOTOS[0],), (value,)])
    assert caught.value.sample == 1 and caught.value.field == "image"


# ---- crops -------------------------------------------------------------------------------------------------

def test_random_resized_crop_follows_the_scale_and_ratio_distribution():
    key, height, width = np.uint64(99), 1000, 1000
    scale, ratio = (0.08, 1.0), (3 / 4, 4 / 3)
    crops = np.array([random_resized_crop(key, s, height, width, scale[0], scale[1], math.log(ratio[0]),
                                          math.log(ratio[1])) for s in range(20000)])
    tops, lefts, heights, widths = crops.T
    assert (tops >= 0).all() and (lefts >= 0).all()
    assert (tops + heights <= height).all() and (lefts + widths <= width).all()
    areas = heights * widths / (height * width)
    log_ratios = np.log(widths / heights)
    assert areas.min() >= scale[0] * 0.97 and areas.max() <= scale[1]
    assert np.abs(log_ratios).max() <= math.log(4 / 3) + 0.02
    # Accepted crops: the area fraction is uniform on [0.08, 1] except where large areas with extreme ratios
    # do not fit and are redrawn; the log-ratio is uniform and symmetric.
    counts, _ = np.histogram(areas, bins=8, range=(0.08, 0.6))
    assert counts.min() > 0.85 * counts.mean()
    assert abs(np.mean(log_ratios)) < 0.01
    log_counts, _ = np.histogram(log_ratios, bins=6, range=(math.log(3 / 4), math.log(4 / 3)))
    assert log_counts.min() > 0.85 * log_counts.mean()
    # and positions are uniform over the free range
    assert 0.45 < np.mean(tops / np.maximum(1, height - heights)) < 0.55


@pytest.mark.parametrize("height, width", [(10, 1000), (1000, 10), (3, 3)])
def test_random_resized_crop_falls_back_to_a_center_crop_like_torchvision(height, width):
    top, left, crop_height, crop_width = random_resized_crop(np.uint64(1), 0, height, width, 0.9, 1.0,
                                                             math.log(3 / 4), math.log(4 / 3))
    in_ratio = width / height
    if in_ratio < 3 / 4:
        expected = (width, int(round(width / (3 / 4))))
    elif in_ratio > 4 / 3:
        expected = (int(round(height * (4 / 3))), height)
    else:
        expected = (width, height)
    if (crop_width, crop_height) != (width, height) or in_ratio != 1:
        assert (crop_width, crop_height) == expected
        assert (top, left) == ((height - crop_height) // 2, (width - crop_width) // 2)


def bilinear_samples(image, top, left, height, width, size):
    """Independent numpy reference: output pixel (v, u) samples ``image`` bilinearly at the place its centre maps
    to inside the (possibly fractional) rectangle, clamped to the rectangle's whole-pixel hull."""
    def places(start, extent, limit):
        low, high = math.floor(start), min(limit, math.ceil(start + extent)) - 1
        at = np.clip(start + (np.arange(size) + 0.5) * extent / size - 0.5, low, high)
        first = np.floor(at).astype(int)
        return first, np.minimum(first + 1, high), (at - first)[:, None]

    rows, rows_below, fraction_y = places(top, height, image.shape[0])
    columns, columns_right, fraction_x = places(left, width, image.shape[1])
    image = image.astype(np.float64)
    upper = image[rows] * (1 - fraction_y[..., None]) + image[rows_below] * fraction_y[..., None]
    return upper[:, columns] * (1 - fraction_x) + upper[:, columns_right] * fraction_x


def center_crop_reference(reader, label, mode, size):
    """Independent numpy/cv2 reference: the stored image (decoded at the DCT scale for JPEG), center-cropped,
    the crop mapped onto the scaled decode exactly (its pixel j covers the image's pixels [j f, j f + f)): shifted
    by the crop's fraction of a pixel, then sampled bilinearly at exactly the crop's scale."""
    record = reader.data_table["image"][label]
    height, width = int(record["height"]), int(record["width"])
    top, left, crop_height, crop_width = center_crop(height, width, 0.875)
    assert crop_height == crop_width == int(0.875 * min(height, width))
    factor = 1
    if mode == "jpg":
        factor = next(f for f in (8, 4, 2, 1) if f == 1 or crop_height >= 1.25 * f * size)
        image = simplejpeg.decode_jpeg(reader.payload(label, "image").tobytes(), min_height=-(-height // factor),
                                       min_width=-(-width // factor), min_factor=factor)
    else:
        image = reader[label][0]
    if crop_height / factor / size >= 3:
        assert factor == 1  # these photos never need the area filter on a fractional rectangle
        crop = image[top : top + crop_height, left : left + crop_width]
        return cv2.resize(crop, (size, size), interpolation=cv2.INTER_AREA)
    top, left, crop_height, crop_width = top / factor, left / factor, crop_height / factor, crop_width / factor
    # the fraction of a pixel the crop starts at, taken by a two-tap shift (one more pixel, repeated at the edge)
    rows = np.minimum(np.arange(math.floor(top), math.ceil(top + crop_height) + 1), image.shape[0] - 1)
    columns = np.minimum(np.arange(math.floor(left), math.ceil(left + crop_width) + 1), image.shape[1] - 1)
    hull = image[rows][:, columns].astype(np.float64)
    fraction_y, fraction_x = top % 1, left % 1
    shifted = (1 - fraction_x) * hull[:, :-1] + fraction_x * hull[:, 1:]
    shifted = (1 - fraction_y) * shifted[:-1] + fraction_y * shifted[1:]
    return bilinear_samples(shifted, 0, 0, crop_height, crop_width, size)


def test_center_crop_matches_a_cv2_reference_within_one_grey_level(photo_files):
    for mode in ("raw", "jpg"):
        pipelines = {"image": [CenterCropRGBImageDecoder((32, 32), ratio=0.875), ToTensor()]}
        with Loader(photo_files[mode], batch_size=8, num_workers=2, pipelines=pipelines) as loader, \
                beton.Reader(photo_files[mode]) as reader:
            for images, labels in loader:
                for image, label in zip(images.numpy(), labels.tolist()):
                    reference = center_crop_reference(reader, label, mode, 32)
                    assert np.abs(image - reference).max() <= 2


def test_scaled_decode_matches_full_decode_with_area_resize(tmp_path):
    """Real photos at ~500 px: DCT-scaled decode + bilinear vs full decode + INTER_AREA, PSNR >= 30 dB."""
    photos = [photo_crop(i, 480, 560) for i in range(12)]
    jpegs = [simplejpeg.encode_jpeg(p, quality=90, colorsubsampling="420") for p in photos]
    path = write(tmp_path / "big.beton", {"image": RGBImageField(write_mode="jpg"), "label": IntField()},
                 [(j, i) for i, j in enumerate(jpegs)])
    decoder = RandomResizedCropRGBImageDecoder((100, 100), scale=(0.3, 1.0))
    with Loader(path, batch_size=12, num_workers=2, seed=5, pipelines={"image": [decoder, ToTensor()]}) as loader:
        images, labels = next(iter(loader))
        key = loader.plan.stages[0].steps[0]  # the decoder step: recompute its crops for the reference
        from beton.random import operation_key

        op_key = operation_key(loader.seed, 0, key.output, key.position)
    for image, label in zip(images.numpy(), labels.tolist()):
        full = simplejpeg.decode_jpeg(jpegs[label])
        top, left, height, width = decoder.crop(op_key, label, full.shape[0], full.shape[1])
        reference = cv2.resize(full[top : top + height, left : left + width], (100, 100), interpolation=cv2.INTER_AREA)
        assert psnr(image, reference) >= 30


def test_fast_chroma_upsampling_stays_close_to_the_accurate_decode(photo_files):
    def batches(fast):
        decoder = RandomResizedCropRGBImageDecoder((48, 48), fast_upsample=fast)
        with Loader(photo_files["jpg"], batch_size=24, seed=3, copy=True,
                    pipelines={"image": [decoder, ToTensor()]}) as loader:
            return next(iter(loader))[0].numpy()

    fast, accurate = batches(True), batches(False)
    assert not np.array_equal(fast, accurate)  # the option reaches the decoder
    assert min(psnr(a, b) for a, b in zip(fast, accurate)) >= 35
    assert RandomResizedCropRGBImageDecoder((8, 8)).fast_upsample and not CenterCropRGBImageDecoder((8, 8)).fast_upsample


def test_simple_decoder_needs_one_size(tmp_path, photo_files):
    same = [photo_crop(i, 20, 30) for i in range(5)]
    for mode in ("raw", "jpg"):
        path = write(tmp_path / f"same_{mode}.beton", {"image": RGBImageField(write_mode=mode)}, [(s,) for s in same])
        with Loader(path, batch_size=5, num_workers=1) as loader:  # the default pipeline
            (images,) = next(iter(loader))
            assert images.shape == (5, 20, 30, 3)
            if mode == "raw":
                np.testing.assert_array_equal(images.numpy(), np.stack(same))
    with pytest.raises(PipelineError, match="images of one size"):
        Loader(photo_files["raw"], batch_size=4, pipelines={"image": [SimpleRGBImageDecoder()]})


def test_a_corrupt_jpeg_names_the_sample_and_field(tmp_path):
    jpegs = [simplejpeg.encode_jpeg(image, quality=90) for image in PHOTOS[:10]]
    broken = bytearray(jpegs[7])
    broken[len(broken) // 2 : len(broken) // 2 + 200] = bytes(200)  # header intact, entropy data destroyed
    jpegs[7] = bytes(broken[: len(broken) * 3 // 4])
    # stored as given (the default refuses it when written): damage as in a file FFCV wrote
    path = write(tmp_path / "c.beton", {"image": RGBImageField(write_mode="jpg", restart_markers=False),
                                        "label": IntField()},
                 [(j, i) for i, j in enumerate(jpegs)])
    with Loader(path, batch_size=4, num_workers=2,
                pipelines={"image": [RandomResizedCropRGBImageDecoder((16, 16)), ToTensor()]}) as loader:
        with pytest.raises(DecodeError) as caught:
            for _ in loader:
                pass
    assert caught.value.sample == 7 and caught.value.field == "image"
    assert "sample 7" in str(caught.value) and "'image'" in str(caught.value)


def test_image_batches_are_identical_for_any_number_of_workers(photo_files):
    pipelines = {"image": [RandomResizedCropRGBImageDecoder((24, 24)), RandomHorizontalFlip(), ToTensor()],
                 "label": [IntDecoder(), ToTensor()]}

    def run(num_workers):
        with Loader(photo_files["jpg"], batch_size=5, num_workers=num_workers, order=OrderOption.RANDOM, seed=8,
                    pipelines=pipelines, copy=True) as loader:
            return [(images.numpy(), labels.numpy()) for _ in range(2) for images, labels in loader]

    reference = run(1)
    for num_workers in (2, 4):
        for (a, la), (b, lb) in zip(reference, run(num_workers)):
            assert a.tobytes() == b.tobytes() and np.array_equal(la, lb)


BIG_IMAGE_SCRIPT = textwrap.dedent("""
    import resource, sys
    import numpy as np, simplejpeg
    import beton
    from beton import Loader
    from beton.fields import RGBImageField
    from beton.decoders import RandomResizedCropRGBImageDecoder, CenterCropRGBImageDecoder
    from beton.tools.sample_photos import photo_crop
    from beton.transforms import ToTensor

    with_big = sys.argv[2] == "big"
    small = simplejpeg.encode_jpeg(photo_crop(0, 256, 320), quality=90)
    big = simplejpeg.encode_jpeg(np.ascontiguousarray(np.broadcast_to(photo_crop(1, 300, 400), (10, 10, 300, 400, 3))
                                 .transpose(0, 2, 1, 3, 4).reshape(3000, 4000, 3)), quality=90)
    samples = [(big if with_big and i == 37 else small,) for i in range(200)]
    writer = beton.DatasetWriter(sys.argv[1], {"image": RGBImageField(write_mode="jpg")}, num_workers=1,
                                 progress=False)
    writer.from_indexed_dataset(samples)
    del samples, big
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for decoder in (RandomResizedCropRGBImageDecoder((160, 160)), CenterCropRGBImageDecoder((224, 224))):
        with Loader(sys.argv[1], batch_size=64, num_workers=2, pipelines={"image": [decoder, ToTensor()]}) as loader:
            for _ in range(2):
                for batch in loader:
                    pass
    print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024)
""")


def test_one_huge_image_does_not_blow_up_memory(tmp_path):
    """FFCV sizes scratch by the largest image x batch (64 x 36 MB here); beton's grows to one scaled image."""
    growth = {}
    for variant in ("small", "big"):
        run = subprocess.run([sys.executable, "-c", BIG_IMAGE_SCRIPT, str(tmp_path / f"{variant}.beton"), variant],
                             capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr
        growth[variant] = float(run.stdout.split()[-1])
    assert growth["big"] - growth["small"] < 120  # MiB; one full 4000x3000 RGB decode is 34 MiB


def test_ffcv_argument_habits_are_accepted():
    """What FFCV scripts pass from their configuration: compress_probability=None, a float quality."""
    field = RGBImageField(write_mode="smart", compress_probability=None, jpeg_quality=90.0)
    assert field.jpeg_quality == 90 and isinstance(field.jpeg_quality, int)
    assert field.arguments()["jpeg_quality"] == 90


def test_progressive_resizing_sets_the_decoders_output_size_between_epochs(photo_files):
    """ffcv-imagenet sets ``decoder.output_size`` before each epoch: the next epoch decodes at the new size,
    exactly as a Loader built for that size would."""
    decoder = RandomResizedCropRGBImageDecoder((32, 32))
    pipelines = {"image": [decoder, RandomHorizontalFlip(), ToTensor()], "label": [IntDecoder(), ToTensor()]}
    with Loader(photo_files["jpg"], batch_size=4, num_workers=2, order=OrderOption.RANDOM, seed=3,
                pipelines=pipelines) as loader:
        epochs = []
        for size in (32, 48, 40):
            decoder.output_size = (size, size)
            epochs.append(list(loader))
            assert all(images.shape[1:3] == (size, size) for images, _ in epochs[-1])
    for epoch, size in ((1, 48), (2, 40)):
        fresh = {"image": [RandomResizedCropRGBImageDecoder((size, size)), RandomHorizontalFlip(), ToTensor()],
                 "label": [IntDecoder(), ToTensor()]}
        with Loader(photo_files["jpg"], batch_size=4, num_workers=1, order=OrderOption.RANDOM, seed=3,
                    pipelines=fresh) as reference:
            reference.set_epoch(epoch)
            for (images, labels), (expected, expected_labels) in zip(epochs[epoch], reference):
                assert torch.equal(labels, expected_labels) and torch.equal(images, expected)
    with pytest.raises(PipelineError, match="positive integers"):
        decoder.output_size = (0, 10)
    with pytest.raises(dataclasses.FrozenInstanceError):
        decoder.scale = (0.5, 1.0)



@pytest.mark.parametrize("build", [
    lambda: CenterCropRGBImageDecoder(64), lambda: RandomResizedCropRGBImageDecoder(64),
    lambda: CenterCropRGBImageDecoder((64, 0)), lambda: RandomResizedCropRGBImageDecoder((1.5, 2)),
    lambda: CenterCropRGBImageDecoder((64, 64, 3))], ids=["int", "int-rrc", "zero", "floats", "three"])
def test_a_crop_decoder_with_an_output_size_that_is_not_height_and_width_is_refused_when_built(build):
    with pytest.raises(PipelineError, match=r"output_size must be \(height, width\)"):
        build()


@pytest.mark.parametrize("ratio", [1.5, 0, -0.5, float("nan"), True])
def test_a_center_crop_ratio_outside_zero_to_one_is_refused_when_built(ratio):
    """Above 1 the crop starts before the image (raw images: numpy's negative slicing, other pixels than asked);
    0 or nan gave 1-pixel crops."""
    with pytest.raises(PipelineError, match=r"a number in \(0, 1\]"):
        CenterCropRGBImageDecoder((64, 64), ratio=ratio)


@pytest.mark.parametrize("decoder", [RandomResizedCropRGBImageDecoder, CenterCropRGBImageDecoder])
@pytest.mark.parametrize("fast", [True, False])
def test_restart_markers_change_no_pixel_the_loader_serves(tmp_path, decoder, fast):
    """The stored JPEGs differ (restart markers), the crops decoded from a few of their segments do not."""
    jpegs = [simplejpeg.encode_jpeg(photo_crop(i, 90 + 37 * (i % 5), 300 - 41 * (i % 4)), quality=90)
             for i in range(20)]
    paths = [write(tmp_path / f"{markers}.beton", {"image": RGBImageField(write_mode="jpg", restart_markers=markers),
                                                   "label": IntField()}, [(j, i) for i, j in enumerate(jpegs)])
             for markers in (True, False)]

    def batches(path):
        with Loader(path, batch_size=8, num_workers=2, seed=3, copy=True, order=OrderOption.RANDOM,
                    pipelines={"image": [decoder((40, 40), fast_upsample=fast), ToTensor()]}) as loader:
            return [b.numpy() for epoch in range(2) for b, _ in loader]

    with beton.Reader(paths[0]) as reader:
        assert all(b"\xff\xdd" in reader.payload(i, "image").tobytes() for i in range(20))
    for segmented, whole in zip(batches(paths[0]), batches(paths[1])):
        np.testing.assert_array_equal(segmented, whole)


def test_given_jpegs_are_checked_before_markers_are_added_and_encoded_ones_are_not(tmp_path, monkeypatch):
    """A JPEG handed to the field as bytes is decoded strictly once (damage would otherwise be transcoded into a
    clean-looking JPEG); one the field encodes itself needs no check."""
    given = simplejpeg.encode_jpeg(photo_crop(1, 96, 128), quality=90)
    decodes = []
    real_decode = simplejpeg.decode_jpeg
    monkeypatch.setattr(simplejpeg, "decode_jpeg", lambda *args, **kwargs: decodes.append(1) or
                        real_decode(*args, **kwargs))
    path = write(tmp_path / "a.beton", {"image": RGBImageField(write_mode="jpg")},
                 [(given,), (photo_crop(2, 96, 128),)])
    monkeypatch.undo()
    assert len(decodes) == 1  # the given JPEG, once
    with beton.Reader(path) as reader:
        assert bytes(reader.payload(0, "image")) == with_restart_markers(given) != given
        assert b"\xff\xdd" in bytes(reader.payload(1, "image"))


@pytest.mark.parametrize("damage", ["truncated", "zeroed"])
def test_a_damaged_jpeg_is_refused_when_written_naming_its_sample(tmp_path, damage):
    """Refused by the writer, as beton convert refuses it, not stored for the loader to raise on in some epoch;
    restart_markers=False stores the bytes as given (FFCV's way), for the loader to report."""
    given = simplejpeg.encode_jpeg(photo_crop(1, 96, 128), quality=90)
    damaged = bytearray(given)
    if damage == "truncated":
        del damaged[len(damaged) // 2 : -2]
    else:
        damaged[-300:-150] = bytes(150)  # data the transcoder would read as coefficients
    samples = [(given, 0), (bytes(damaged), 1)]
    fields = {"image": RGBImageField(write_mode="jpg"), "label": IntField()}
    with pytest.raises(EncodeError, match=r"field 'image', sample 1: JPEG is truncated or corrupt"):
        write(tmp_path / "a.beton", fields, samples)
    path = write(tmp_path / "b.beton", {**fields, "image": RGBImageField(write_mode="jpg", restart_markers=False)},
                 samples)
    with beton.Reader(path) as reader:
        assert bytes(reader.payload(1, "image")) == bytes(damaged)
        with pytest.raises(DecodeError):
            reader[1]


@pytest.mark.parametrize("progressive", [False, True])
def test_a_given_jpeg_declaring_more_blocks_than_its_bytes_hold_is_refused_undecoded(progressive):
    """A 64x64 JPEG relabelled 40000x40000: the field's check refuses it before its decode would allocate for the
    declared size (75 MB at 1/8 scale)."""
    import tracemalloc

    from beton.fields.base import EncodeContext

    flags = [cv2.IMWRITE_JPEG_QUALITY, 90, cv2.IMWRITE_JPEG_PROGRESSIVE, int(progressive)]
    data = bytearray(cv2.imencode(".jpg", photo_crop(3, 64, 64), flags)[1].tobytes())
    frame = data.index(b"\xff\xc2" if progressive else b"\xff\xc0")
    data[frame + 5 : frame + 9] = (40000).to_bytes(2, "big") * 2
    field, context = RGBImageField(write_mode="jpg"), EncodeContext(0, 0, 0)
    field.encode(simplejpeg.encode_jpeg(photo_crop(3, 64, 64)), context)  # compiled code loaded first
    tracemalloc.start()
    try:
        with pytest.raises(EncodeError, match=r"declares 40000x40000 pixels, more 8x8 blocks than"):
            field.encode(bytes(data), context)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20
