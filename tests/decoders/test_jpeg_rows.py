"""Decoding only the rows above a crop's bottom (beton.decoders.jpeg_rows): exact, and errors still reach the user."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
import simplejpeg
from hypothesis import given, strategies as st

from beton import Loader
from beton.errors import DecodeError
from beton.fields import IntField, RGBImageField
from beton.decoders import CenterCropRGBImageDecoder, RandomResizedCropRGBImageDecoder
from beton.decoders.jpeg_rows import decode_rows, rows_to_decode, sequential_frame
from beton.tools.sample_photos import photo_crop
from beton.transforms import ToTensor

from conftest import write


def encoded(kind: str, height: int, width: int, seed: int = 0) -> tuple[bytes, int]:
    """A photo JPEG of one of the layouts libjpeg-turbo decodes differently, and its channel count."""
    pixels = photo_crop(seed, height, width)
    if kind == "gray":
        return simplejpeg.encode_jpeg(np.ascontiguousarray(pixels[..., :1]), quality=90, colorspace="GRAY"), 1
    if kind == "restart":  # restart markers every 3 MCUs: the skipped data holds markers
        return cv2.imencode(".jpg", pixels, [cv2.IMWRITE_JPEG_RST_INTERVAL, 3])[1].tobytes(), 3
    if kind == "progressive":
        return cv2.imencode(".jpg", pixels, [cv2.IMWRITE_JPEG_PROGRESSIVE, 1])[1].tobytes(), 3
    return simplejpeg.encode_jpeg(pixels, quality=90, colorsubsampling=kind), 3


SEQUENTIAL = ("420", "422", "444", "440", "gray", "restart")


@pytest.mark.parametrize("kind", SEQUENTIAL)
@given(height=st.integers(9, 300), width=st.integers(1, 300), factor=st.sampled_from([1, 2, 4, 8]),
       fast=st.booleans(), bottom=st.floats(0, 1))
def test_the_rows_above_the_bottom_are_those_of_a_full_decode(kind, height, width, factor, fast, bottom):
    data, channels = encoded(kind, height, width, seed=height + width)
    payload = np.frombuffer(data, np.uint8)
    frame = sequential_frame(payload)
    assert frame is not None
    options = {"colorspace": "GRAY" if channels == 1 else "RGB", "min_width": -(-width // factor),
               "min_factor": factor, "fastupsample": fast}
    full = simplejpeg.decode_jpeg(data, min_height=-(-height // factor), **options).reshape(-1, options["min_width"],
                                                                                           channels)
    needed = max(1, round(bottom * full.shape[0]))  # rows of the scaled image the crop needs
    rows = rows_to_decode(needed * factor, height, frame[1], exact_upsampling=not fast)
    assert rows % frame[1] == 0 or rows == height
    if rows == height:
        return  # nothing to cut: the decoder decodes the payload as it is
    out = np.empty((rows // factor, full.shape[1], channels), np.uint8)
    decode_rows(payload, frame[0], rows, lambda nbytes: np.empty(nbytes, np.uint8), out, **options)
    np.testing.assert_array_equal(out[:needed], full[:needed])
    assert bytes(payload) == data  # the stored bytes are not touched


def test_smooth_upsampling_needs_the_extra_mcu_row():
    """Without the margin, the last rows differ: the margin in rows_to_decode is not decoration."""
    data, _ = encoded("420", 200, 150)
    payload = np.frombuffer(data, np.uint8)
    offset, mcu = sequential_frame(payload)
    full = simplejpeg.decode_jpeg(data)
    out = np.empty((64, 150, 3), np.uint8)
    decode_rows(payload, offset, 64, lambda n: np.empty(n, np.uint8), out, colorspace="RGB", min_width=150)
    assert not np.array_equal(out, full[:64])  # the bottom row's chroma has no row below to blend with
    np.testing.assert_array_equal(out[:48], full[:48])
    assert rows_to_decode(64, 200, mcu, exact_upsampling=True) == 80
    assert rows_to_decode(64, 200, mcu, exact_upsampling=False) == 64
    assert rows_to_decode(199, 200, mcu, exact_upsampling=False) == 200


def test_progressive_and_foreign_bytes_are_decoded_whole():
    assert sequential_frame(np.frombuffer(encoded("progressive", 64, 64)[0], np.uint8)) is None
    assert sequential_frame(np.frombuffer(b"not a jpeg at all", np.uint8)) is None
    assert sequential_frame(np.zeros(0, np.uint8)) is None


@given(st.binary(max_size=300), st.integers(0, 2000))
def test_the_marker_walk_never_reads_past_the_payload(noise, cut):
    data, _ = encoded("420", 40, 40)
    for candidate in (noise, b"\xff\xd8" + noise, data[:cut], data[:cut] + noise):
        result = sequential_frame(np.frombuffer(candidate, np.uint8))
        assert result is None or (0 < result[0] < len(candidate) and result[1] in (8, 16, 24, 32))


@pytest.fixture(scope="module")
def layouts_file(tmp_path_factory):
    """Every layout, portrait and landscape, odd sizes; progressive ones are decoded whole."""
    samples = []
    for i, kind in enumerate([*SEQUENTIAL, "progressive"] * 4):
        height, width = (97 + 31 * i, 71 + 17 * (i % 5)) if i % 2 else (71 + 17 * (i % 5), 97 + 31 * i)
        data, channels = encoded(kind, height, width, seed=i)
        if channels == 3:
            samples.append((data, i))
    return write(tmp_path_factory.mktemp("rows") / "layouts.beton",
                 {"image": RGBImageField(write_mode="jpg"), "label": IntField()}, samples)


@pytest.mark.parametrize("decoder", [RandomResizedCropRGBImageDecoder, CenterCropRGBImageDecoder])
@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("size", [24, 60])  # 24: DCT-scaled decodes; 60: mostly full scale
def test_loader_batches_equal_those_of_whole_decodes(layouts_file, decoder, fast, size):
    def batches(whole):
        image = [decoder((size, size), fast_upsample=fast, decode_whole=whole), ToTensor()]
        with Loader(layouts_file, batch_size=7, num_workers=2, seed=11, copy=True,
                    pipelines={"image": image}) as loader:
            return [b.numpy() for epoch in range(2) for b, _ in loader]

    for cut, whole in zip(batches(False), batches(True)):
        np.testing.assert_array_equal(cut, whole)


def test_damaged_jpegs_raise_where_the_decoded_rows_reach_the_damage(tmp_path):
    data, _ = encoded("420", 256, 96)
    scan = data.index(b"\xff\xda")
    header_end = scan + 2 + int.from_bytes(data[scan + 2 : scan + 4], "big")
    early, late = bytearray(data), bytearray(data)
    early[header_end + 40 : header_end + 240] = b"\xff\x13" * 100  # the first rows' entropy data destroyed
    late[-400:-200] = bytes(200)  # the last rows' zeroed (no marker bytes; the EOI marker stays)
    truncated = data[: len(data) * 9 // 10]  # the end missing, as from a broken download
    path = write(tmp_path / "damaged.beton", {"image": RGBImageField(write_mode="jpg"), "label": IntField()},
                 [(data, 0), (bytes(early), 1), (bytes(late), 2), (truncated, 3)])
    top = RandomResizedCropRGBImageDecoder((16, 16), scale=(0.05, 0.05), ratio=(1, 1))  # ~35 px near the top

    def read(sample, decoder):
        with Loader(path, batch_size=1, num_workers=1, seed=0, indices=[sample],
                    pipelines={"image": [decoder, ToTensor()]}) as loader:
            return next(iter(loader))[0]

    assert read(0, top).shape == (1, 16, 16, 3)
    for sample in (1, 3):  # damage inside the decoded rows; a missing end is found while skipping to it
        with pytest.raises(DecodeError) as caught:
            read(sample, top)
        assert caught.value.sample == sample and caught.value.field == "image"
    # Damage below the crop is not decoded, so not seen (documented); decode_whole=True checks every byte
    assert read(2, top).shape == (1, 16, 16, 3)
    with pytest.raises(DecodeError, match="sample 2"):
        read(2, RandomResizedCropRGBImageDecoder((16, 16), scale=(0.05, 0.05), ratio=(1, 1), decode_whole=True))


@given(height=st.integers(1, 700), width=st.integers(1, 700), factor=st.sampled_from([1, 2, 4, 8]))
def test_libjpeg_scales_to_the_ceiling_of_size_over_factor(height, width, factor):
    """The crop decoders size their buffers by this rule instead of parsing each header."""
    data = simplejpeg.encode_jpeg(np.zeros((height, width, 3), np.uint8), quality=50)
    scaled = simplejpeg.decode_jpeg_header(data, min_height=-(-height // factor), min_width=-(-width // factor),
                                           min_factor=factor)[:2]
    assert scaled == (-(-height // factor), -(-width // factor))


@pytest.mark.parametrize("whole", [False, True])
def test_a_frame_that_disagrees_with_the_data_table_raises(tmp_path, whole):
    data, _ = encoded("420", 120, 90)
    path = write(tmp_path / "lies.beton", {"image": RGBImageField(write_mode="jpg"), "label": IntField()},
                 [(data, 0)])
    frame = sequential_frame(np.frombuffer(data, np.uint8))[0]
    content = bytearray(path.read_bytes())
    at = content.index(data[frame : frame + 10])
    content[at + 7 : at + 9] = (60).to_bytes(2, "big")  # the stored JPEG now says 60 px wide
    path.write_bytes(bytes(content))
    decoder = RandomResizedCropRGBImageDecoder((16, 16), decode_whole=whole)
    with Loader(path, batch_size=1, pipelines={"image": [decoder, ToTensor()]}) as loader:
        with pytest.raises(DecodeError, match="sample 0"):
            next(iter(loader))
