"""The lossless image mode: exact round trips, region decode, corrupt data, loader use."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import beton
from beton import Loader, OrderOption
from beton.errors import DecodeError, FieldError
from beton.fields import IntField, RGBImageField
from beton.decoders import CenterCropRGBImageDecoder, RandomResizedCropRGBImageDecoder, SimpleRGBImageDecoder
from beton.codecs.lossless import decode_lossless, decode_lossless_region, encode_lossless
from beton.tools.sample_photos import photo_crop
from beton.transforms import ToTensor

from conftest import write


def fresh_scratch(nbytes: int, purpose: str = "default") -> np.ndarray:
    return np.empty(nbytes, np.uint8)


def as_payload(data: bytes, misalign: int = 1) -> np.ndarray:
    """The bytes at an odd address, as payloads in a page are."""
    buffer = np.zeros(len(data) + misalign, np.uint8)
    buffer[misalign:] = np.frombuffer(data, np.uint8)
    return buffer[misalign:]


KINDS = ("noise", "flat", "gradient", "photo")


def make_image(kind: str, height: int, width: int, channels: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if kind == "noise":
        return rng.integers(0, 256, (height, width, channels), dtype=np.uint8)
    if kind == "flat":
        return np.full((height, width, channels), rng.integers(0, 256), np.uint8)
    if kind == "gradient":
        ramp = (np.arange(height)[:, None, None] * 3 + np.arange(width)[None, :, None] * 5
                + np.arange(channels)[None, None, :] * 40)
        return (ramp % 256).astype(np.uint8)
    photo = photo_crop(seed, height, width)
    if channels == 1:
        return photo[:, :, 1:2].copy()
    if channels == 4:
        return np.dstack([photo, photo[:, :, :1] // 2])
    return photo


@given(kind=st.sampled_from(KINDS), height=st.integers(1, 140), width=st.integers(1, 140),
       channels=st.sampled_from((1, 3, 4)), tile_log2=st.integers(2, 7), seed=st.integers(0, 1000),
       wide=st.booleans())
def test_round_trip_is_exact(kind, height, width, channels, tile_log2, seed, wide):
    image = make_image(kind, height, width, channels, seed)
    if wide:  # 16-bit samples: the 8-bit image in the high byte, or full-range noise
        image = (image.astype(np.uint16) << 8) | np.uint16(seed % 256)
        if kind == "noise":
            image = np.random.default_rng(seed).integers(0, 65536, image.shape, dtype=np.uint16)
    payload = as_payload(encode_lossless(image, tile_log2))
    np.testing.assert_array_equal(decode_lossless(payload, height, width, channels), image)


@given(data=st.data(), channels=st.sampled_from((1, 3, 4)), tile_log2=st.integers(2, 6))
def test_region_decode_equals_the_same_crop_of_a_full_decode(data, channels, tile_log2):
    height, width = data.draw(st.integers(1, 150)), data.draw(st.integers(1, 150))
    image = make_image("photo", height, width, channels, data.draw(st.integers(0, 50)))
    payload = as_payload(encode_lossless(image, tile_log2))
    top, left = data.draw(st.integers(0, height - 1)), data.draw(st.integers(0, width - 1))
    rows, cols = data.draw(st.integers(1, height - top)), data.draw(st.integers(1, width - left))
    region = decode_lossless_region(payload, height, width, channels, top, left, rows, cols, fresh_scratch)
    np.testing.assert_array_equal(region, image[top : top + rows, left : left + cols])


def test_photos_compress_to_about_png_size():
    import cv2

    image = photo_crop(3, 375, 500)
    png = cv2.imencode(".png", image[:, :, ::-1], [cv2.IMWRITE_PNG_COMPRESSION, 6])[1]
    assert len(encode_lossless(image)) <= 1.3 * len(png)


@given(data=st.binary(min_size=0, max_size=400), height=st.integers(1, 40), width=st.integers(1, 40))
def test_garbage_raises_decode_error_or_decodes_never_crashes(data, height, width):
    payload = as_payload(bytes([1, 3, 0, 0]) + data)
    try:
        decode_lossless(payload, height, width, 3)
    except DecodeError:
        pass


@pytest.mark.parametrize("damage", ["truncate", "tile_table", "width_nibble", "version"])
def test_damaged_payloads_raise_decode_error(damage):
    image = photo_crop(1, 90, 130)
    data = bytearray(encode_lossless(image, 5))
    if damage == "truncate":
        data = data[: len(data) - 10]
    elif damage == "tile_table":
        data[4:8] = (10**6).to_bytes(4, "little")
    elif damage == "width_nibble":
        data[4 + 4 * 15] = 0xFF  # the first width byte of the first tile: width 15 > 8
    else:
        data[0] = 9
    with pytest.raises(DecodeError, match="lossless image"):
        decode_lossless(as_payload(bytes(data)), 90, 130, 3)


PHOTOS = [photo_crop(i, 61 + 13 * (i % 5), 70 + 17 * (i % 4)) for i in range(16)]


@pytest.fixture(scope="module")
def lossless_and_raw(tmp_path_factory):
    directory = tmp_path_factory.mktemp("lossless")
    samples = [(image, i) for i, image in enumerate(PHOTOS)]
    return [write(directory / f"{mode}.beton", {"image": RGBImageField(write_mode=mode), "label": IntField()},
                  samples, page_size=8192) for mode in ("lossless", "raw")]


def test_field_round_trip_is_exact_and_files_describe_the_mode(lossless_and_raw):
    with beton.Reader(lossless_and_raw[0]) as reader:
        for i, image in enumerate(PHOTOS):
            np.testing.assert_array_equal(reader[i][0], image)
        assert set(reader.data_table["image"]["mode"]) == {3}


@pytest.mark.parametrize("decoder", [RandomResizedCropRGBImageDecoder((32, 32)), CenterCropRGBImageDecoder((24, 24))])
def test_crop_decoders_give_the_same_batches_as_from_raw_pixels(lossless_and_raw, decoder):
    def batches(path):
        with Loader(path, batch_size=5, num_workers=2, order=OrderOption.RANDOM, seed=4, copy=True,
                    pipelines={"image": [decoder, ToTensor()]}) as loader:
            return [images.numpy() for images, _ in loader]

    for lossless, raw in zip(*map(batches, lossless_and_raw)):
        np.testing.assert_array_equal(lossless, raw)


def test_simple_decoder_decodes_whole_images(tmp_path):
    images = [photo_crop(i, 40, 56) for i in range(6)]
    path = write(tmp_path / "s.beton", {"image": RGBImageField(write_mode="lossless")}, [(x,) for x in images])
    with Loader(path, batch_size=3, pipelines={"image": [SimpleRGBImageDecoder(), ToTensor()]}, copy=True) as loader:
        np.testing.assert_array_equal(np.concatenate([b[0].numpy() for b in loader]), np.stack(images))


def test_grayscale_and_four_channel_fields(tmp_path):
    for channels in (1, 4):
        images = [make_image("photo", 33, 47, channels, i) for i in range(3)]
        path = write(tmp_path / f"c{channels}.beton", {"image": RGBImageField(write_mode="lossless", channels=channels)},
                     [(x,) for x in images])
        with beton.Reader(path) as reader:
            for i, image in enumerate(images):
                np.testing.assert_array_equal(reader[i][0], image)


def test_uint16_images_round_trip_through_the_field_and_the_crop_decoders(tmp_path):
    rng = np.random.default_rng(3)
    ramp = np.arange(50 * 70, dtype=np.uint32).reshape(50, 70, 1) * 17
    images = [(ramp * (i + 1) + rng.integers(0, 64, (50, 70, 1))).astype(np.uint16) for i in range(4)]
    fields = {mode: {"image": RGBImageField(write_mode=mode, channels=1, dtype="uint16")} for mode in ("lossless", "raw")}
    paths = {mode: write(tmp_path / f"{mode}16.beton", fields[mode], [(x,) for x in images]) for mode in fields}
    with beton.Reader(paths["lossless"]) as reader:
        for i, image in enumerate(images):
            decoded = reader[i][0]
            assert decoded.dtype == np.uint16
            np.testing.assert_array_equal(decoded, image)

    def batches(path):
        with Loader(path, batch_size=2, seed=1, copy=True, order=OrderOption.RANDOM,
                    pipelines={"image": [RandomResizedCropRGBImageDecoder((24, 24)), ToTensor()]}) as loader:
            return [images.numpy() for (images,) in loader]

    for lossless, raw in zip(batches(paths["lossless"]), batches(paths["raw"])):
        np.testing.assert_array_equal(lossless, raw)


def test_bad_dtypes_are_refused_with_a_clear_error():
    with pytest.raises(FieldError, match="dtype"):
        RGBImageField(write_mode="lossless", dtype="float32")
    with pytest.raises(ValueError, match="uint8 or uint16"):
        encode_lossless(np.zeros((4, 4, 3), np.int32))


def test_a_corrupt_tile_names_the_sample_and_field(tmp_path):
    path = write(tmp_path / "c.beton", {"image": RGBImageField(write_mode="lossless"), "label": IntField()},
                 [(image, i) for i, image in enumerate(PHOTOS[:6])])
    # Forge sample 4's payload in place (the page checksum is not re-checked by the loader; verify() would).
    with beton.Reader(path) as reader:
        offset, size = (int(v) for v in reader.allocation_table[4, 0])
    assert size > 8
    tiles = -(-PHOTOS[4].shape[0] // 64) * -(-PHOTOS[4].shape[1] // 64)
    with open(path, "r+b") as file:
        file.seek(offset + 4)
        file.write(b"\xff" * 4 * tiles)  # every tile ends beyond the payload
    with Loader(path, batch_size=3, pipelines={"image": [RandomResizedCropRGBImageDecoder((8, 8)), ToTensor()]}) as loader:
        with pytest.raises(DecodeError) as caught:
            for _ in loader:
                pass
    assert caught.value.sample == 4 and caught.value.field == "image"
