"""Decoding only the part of a JPEG a crop needs (beton.decoders.jpeg_regions), its restart segments or the rows
above its bottom: exact, and errors still reach the user."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
import simplejpeg
from hypothesis import example, given, strategies as st

from beton import Loader
from beton.errors import DecodeError
from beton.fields import IntField, RGBImageField
from beton.decoders import CenterCropRGBImageDecoder, RandomResizedCropRGBImageDecoder
from beton.decoders.rgb_image import resize_into
from beton.codecs.jpeg_layout import jpeg_layout
from beton.codecs.jpeg_restarts import with_restart_markers
from beton.decoders.jpeg_regions import (decode_rows, decode_spliced, next_marker, rows_to_decode, splice_crop,
                                        uint64_words)
from beton.tools.sample_photos import photo_crop
from beton.transforms import ToTensor

from conftest import write
from jpeg_windows import splice_window


def encoded(kind: str, height: int, width: int, seed: int = 0) -> tuple[bytes, int]:
    """A photo JPEG of one of the layouts libjpeg-turbo decodes differently, and its channel count."""
    if kind.startswith("marked-"):  # restart markers as beton's field adds them
        data, channels = encoded(kind[len("marked-"):], height, width, seed)
        return with_restart_markers(data), channels
    pixels = photo_crop(seed, height, width)
    if kind == "gray":
        return simplejpeg.encode_jpeg(np.ascontiguousarray(pixels[..., :1]), quality=90, colorspace="GRAY"), 1
    if kind == "restart":  # restart markers every 3 MCUs: the skipped data holds markers
        return cv2.imencode(".jpg", pixels, [cv2.IMWRITE_JPEG_RST_INTERVAL, 3])[1].tobytes(), 3
    if kind.startswith("segments"):  # restart segments that tile the image: its MCU rows cut in a few parts
        per_row = -(-width // 16)
        interval = per_row * 2 if kind == "segments-rows" else min(d for d in (2, 3, 5, 7, per_row) if per_row % d == 0)
        return cv2.imencode(".jpg", pixels, [cv2.IMWRITE_JPEG_RST_INTERVAL, interval])[1].tobytes(), 3
    if kind == "progressive":
        return cv2.imencode(".jpg", pixels, [cv2.IMWRITE_JPEG_PROGRESSIVE, 1])[1].tobytes(), 3
    return simplejpeg.encode_jpeg(pixels, quality=90, colorsubsampling=kind), 3


WITHOUT_MARKERS = ("420", "422", "444", "440", "gray")
SEQUENTIAL = (*WITHOUT_MARKERS, "restart", "segments", "segments-rows")


@pytest.mark.parametrize("kind", WITHOUT_MARKERS)
@given(height=st.integers(9, 300), width=st.integers(1, 300), factor=st.sampled_from([1, 2, 4, 8]),
       fast=st.booleans(), bottom=st.floats(0, 1))
def test_the_rows_above_the_bottom_are_those_of_a_full_decode(kind, height, width, factor, fast, bottom):
    data, channels = encoded(kind, height, width, seed=height + width)
    payload = np.frombuffer(data, np.uint8)
    layout = jpeg_layout(payload)
    assert layout is not None
    options = {"colorspace": "GRAY" if channels == 1 else "RGB", "min_width": -(-width // factor),
               "min_factor": factor, "fastupsample": fast}
    full = simplejpeg.decode_jpeg(data, min_height=-(-height // factor), **options).reshape(-1, options["min_width"],
                                                                                           channels)
    needed = max(1, round(bottom * full.shape[0]))  # rows of the scaled image the crop needs
    rows = rows_to_decode(needed * factor, height, layout.mcu_height, factor, exact_upsampling=not fast)
    assert rows % layout.mcu_height == 0 or rows == height
    if rows == height:
        return  # nothing to cut: the decoder decodes the payload as it is
    out = np.empty((rows // factor, full.shape[1], channels), np.uint8)
    decode_rows(payload, layout.frame, rows, lambda nbytes: np.empty(nbytes, np.uint8), out, **options)
    np.testing.assert_array_equal(out[:needed], full[:needed])
    assert bytes(payload) == data  # the stored bytes are not touched


def test_smooth_upsampling_needs_the_extra_mcu_row():
    """Without the margin, the last rows differ: the margin in rows_to_decode is not decoration."""
    data, _ = encoded("420", 200, 150)
    payload = np.frombuffer(data, np.uint8)
    offset, mcu = jpeg_layout(payload)[:2]
    full = simplejpeg.decode_jpeg(data)
    out = np.empty((64, 150, 3), np.uint8)
    decode_rows(payload, offset, 64, lambda n: np.empty(n, np.uint8), out, colorspace="RGB", min_width=150)
    assert not np.array_equal(out, full[:64])  # the bottom row's chroma has no row below to blend with
    np.testing.assert_array_equal(out[:48], full[:48])
    assert rows_to_decode(64, 200, mcu, 1, exact_upsampling=True) == 80
    assert rows_to_decode(64, 200, mcu, 1, exact_upsampling=False) == 64
    assert rows_to_decode(199, 200, mcu, 1, exact_upsampling=False) == 200


def test_progressive_and_foreign_bytes_are_decoded_whole():
    assert jpeg_layout(np.frombuffer(encoded("progressive", 64, 64)[0], np.uint8)) is None
    assert jpeg_layout(np.frombuffer(b"not a jpeg at all", np.uint8)) is None
    assert jpeg_layout(np.zeros(0, np.uint8)) is None


@given(st.binary(max_size=300), st.integers(0, 2000))
def test_the_marker_walk_never_reads_past_the_payload(noise, cut):
    data, _ = encoded("420", 40, 40)
    for candidate in (noise, b"\xff\xd8" + noise, data[:cut], data[:cut] + noise):
        result = jpeg_layout(np.frombuffer(candidate, np.uint8))
        assert result is None or (0 < result.frame < result.scan_start <= len(candidate)
                                  and result.mcu_height % 8 == 0 and result.mcu_width % 8 == 0)


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
    # stored as given, without restart markers (the default refuses damaged JPEGs when written)
    path = write(tmp_path / "damaged.beton", {"image": RGBImageField(write_mode="jpg", restart_markers=False),
                                              "label": IntField()},
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


def stale_pixels(payload, shape, crop, out_size=32):
    """How many of the crop decoder's decoded pixels differ between two scratch buffers filled with 0 and with
    255 beforehand: pixels the decode never wrote, left as whatever the slot held (the previous image)."""
    decoder = RandomResizedCropRGBImageDecoder((out_size, out_size))
    images = [decoder.decoded_crop(np.frombuffer(payload, np.uint8), shape, crop, (out_size, out_size, shape[2]),
                                   lambda nbytes, purpose="default", fill=fill: np.full(nbytes, fill, np.uint8))[0]
              for fill in (0, 255)]
    return int((images[0] != images[1]).sum())


def test_a_decode_stopped_early_raises_rather_than_leave_the_previous_pixels():
    """simplejpeg stops at the first warning. Of the rows decode's, only the report of the data skipped to the
    end marker comes after every row was written: a stray byte in the header (a marker code turned to 0) or data
    left over in a decoded restart segment stopped it before, and raised in a whole decode too. Both used to
    return the slot's previous pixels."""
    good = encoded("420", 128, 128)[0]
    sos = good.index(b"\xff\xda")
    header = good[:sos] + b"\xff\x00\x00\x04\xaa\xbb" + good[sos:]  # FF 00 is no marker: libjpeg skips it, warning
    restart = encoded("restart", 128, 128)[0]  # a marker every 3 MCUs: segments that do not tile the image
    scan = jpeg_layout(np.frombuffer(restart, np.uint8)).scan_start
    first = next(i for i in range(scan, len(restart) - 1) if restart[i] == 0xFF and 0xD0 <= restart[i + 1] <= 0xD7)
    leftover = restart[:first] + b"\x11\x22\x33" + restart[first:]  # 3 bytes more in the first segment
    for damaged in (header, leftover):
        with pytest.raises(ValueError):
            simplejpeg.decode_jpeg(damaged)
        with pytest.raises(DecodeError, match="JPEG cannot be decoded"):
            stale_pixels(damaged, (128, 128, 3), (0, 0, 40, 40))
    assert stale_pixels(good, (128, 128, 3), (0, 0, 40, 40)) == 0
    assert stale_pixels(restart, (128, 128, 3), (0, 0, 40, 40)) == 0  # decoded whole


def test_the_rows_decode_takes_only_the_skip_to_the_end_marker():
    """With restart markers the skip is reported before a restart marker, as is data left over in a decoded
    segment: decode_rows refuses it (the crop decoders decode such a JPEG by its segments, or whole)."""
    data, _ = encoded("restart", 128, 128)
    payload = np.frombuffer(data, np.uint8)
    with pytest.raises(ValueError, match="extraneous bytes before marker 0xd"):
        decode_rows(payload, jpeg_layout(payload).frame, 32, lambda n: np.empty(n, np.uint8),
                    np.empty((32, 128, 3), np.uint8), colorspace="RGB", min_width=128)


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
    frame = jpeg_layout(np.frombuffer(data, np.uint8)).frame
    content = bytearray(path.read_bytes())
    at = content.index(data[frame : frame + 10])
    content[at + 7 : at + 9] = (60).to_bytes(2, "big")  # the stored JPEG now says 60 px wide
    path.write_bytes(bytes(content))
    decoder = RandomResizedCropRGBImageDecoder((16, 16), decode_whole=whole)
    with Loader(path, batch_size=1, pipelines={"image": [decoder, ToTensor()]}) as loader:
        with pytest.raises(DecodeError, match="sample 0"):
            next(iter(loader))


def assert_window_is_exact(payload: np.ndarray, full: np.ndarray, region: tuple[int, int, int, int], factor: int,
                           fast: bool) -> None:
    """The window splice_crop takes for ``region`` (top, bottom, left, right; top and left on a scaled pixel)
    holds the region as ``full`` (the whole image decoded at 1/``factor``) does; with ``fast``, all of it."""
    height, width = full.shape[0] * factor, full.shape[1] * factor  # at least the image's: only compared inside
    top, bottom, left, right = region
    window = splice_window(payload, *simplejpeg.decode_jpeg_header(payload.tobytes())[:2], region,
                           exact_upsampling=not fast, factor=factor)
    if window is None:  # the whole image: decoded as it is
        return
    assert window.top <= top and bottom <= window.top + window.height <= height
    assert window.left <= left and right <= window.left + window.width <= width
    assert window.top % factor == 0 and window.left % factor == 0
    out = np.empty((-(-window.height // factor), -(-window.width // factor), 3), np.uint8)
    decode_spliced(window.jpeg, out, min_width=out.shape[1], colorspace="RGB", min_factor=factor, fastupsample=fast)
    y, x = window.top // factor, window.left // factor
    inside = (slice((top - window.top) // factor, -(-(bottom - window.top) // factor)),
              slice((left - window.left) // factor, -(-(right - window.left) // factor)))
    np.testing.assert_array_equal(out[inside], full[y : y + out.shape[0], x : x + out.shape[1]][inside],
                                  err_msg=f"region {region}, window {window[:4]}")
    if fast:  # nothing outside a segment is looked at: the whole window is exact
        np.testing.assert_array_equal(out, full[y : y + out.shape[0], x : x + out.shape[1]])


def full_decode(data: bytes, factor: int, fast: bool) -> np.ndarray:
    height, width = simplejpeg.decode_jpeg_header(data)[:2]
    return simplejpeg.decode_jpeg(data, colorspace="RGB", min_factor=factor, fastupsample=fast,
                                  min_height=-(-height // factor), min_width=-(-width // factor))


@pytest.mark.parametrize("kind", ["segments", "segments-rows"])
@given(height=st.integers(1, 300), width=st.integers(1, 300), factor=st.sampled_from([1, 2, 4, 8]),
       fast=st.booleans(), corners=st.lists(st.floats(0, 1), min_size=4, max_size=4))
def test_a_window_of_restart_segments_decodes_as_the_full_image_there(kind, height, width, factor, fast, corners):
    data, _ = encoded(kind, height, width, seed=height * width)
    payload = np.frombuffer(data, np.uint8)
    (top, bottom), (left, right) = (sorted(round(c * size) for c in corners[k : k + 2])
                                    for k, size in ((0, height), (2, width)))
    top, left = min(top, height - 1), min(left, width - 1)
    top, left = top - top % factor, left - left % factor  # the decoder asks for regions starting on a scaled pixel
    bottom, right = min(max(bottom, top + 1), height), min(max(right, left + 1), width)
    assert_window_is_exact(payload, full_decode(data, factor, fast), (top, bottom, left, right), factor, fast)
    assert bytes(payload) == data


@pytest.mark.parametrize("kind", ["segments", "marked-420", "marked-422", "marked-440", "marked-444"])
@pytest.mark.parametrize("factor", [1, 2])
def test_a_window_holds_the_chroma_its_edges_blend_with_at_every_border(kind, factor):
    """Each edge of a region on every pixel from 3 before to 3 after each MCU border (segment borders among them):
    smooth upsampling blends an edge pixel's chroma with the next sample only where the edge is on a sample's
    border, so the window takes a segment more on that side then, and only then (it once took one on every side).
    Hypothesis's corners rarely land on a border; this walks every case there."""
    height, width = 80, 176  # 11 MCUs a row: markers every MCU (as beton adds them to such rows), or every 11
    data, _ = encoded(kind, height, width, seed=3)
    payload, full = np.frombuffer(data, np.uint8), full_decode(data, factor, fast=False)
    for border in range(8, width, 8):
        for edge in range(border - 3, border + 4):
            for region in ((40, 72, edge - edge % factor, width), (40, 72, 0, edge), (40, 72, 24, edge)):
                if region[2] < region[3]:
                    assert_window_is_exact(payload, full, region, factor, fast=False)
            if border < height:
                for region in ((edge - edge % factor, height, 40, 120), (0, edge, 40, 120), (16, edge, 40, 120)):
                    if region[0] < region[1] <= height:
                        assert_window_is_exact(payload, full, region, factor, fast=False)
    if kind != "segments":  # segments of 1 or 2 MCUs (16 px): 40 px take 3 of them, and once took 5 everywhere
        spans = [splice_window(payload, height, width, (40, 72, left, left + 40), exact_upsampling=True,
                               factor=factor) for left in range(24, 120, factor)]
        assert min(window.width for window in spans) == 48


def test_smooth_upsampling_needs_the_extra_segment():
    """Without the margin, the window's edges differ: the margin of the window is not decoration."""
    data, _ = encoded("segments", 160, 160)  # 10 MCUs a row, segments of 2
    payload = np.frombuffer(data, np.uint8)
    full = simplejpeg.decode_jpeg(data)
    bare = splice_window(payload, 160, 160, (48, 96, 64, 96), exact_upsampling=False)
    assert bare[:4] == (48, 64, 48, 32)
    out = np.empty((48, 32, 3), np.uint8)
    decode_spliced(bare.jpeg, out, colorspace="RGB", min_width=32)
    assert not np.array_equal(out, full[48:96, 64:96])  # the triangle filter had no neighbours to blend with
    wide = splice_window(payload, 160, 160, (48, 96, 64, 96), exact_upsampling=True)
    assert wide[:4] == (32, 32, 80, 96)
    decode_spliced(wide.jpeg, out := np.empty((80, 96, 3), np.uint8), colorspace="RGB", min_width=96)
    np.testing.assert_array_equal(out[16:64, 32:64], full[48:96, 64:96])


def test_restart_segments_out_of_sequence_are_not_spliced():
    """A payload whose markers do not follow its header is decoded whole, which sees what it reads."""
    data, _ = encoded("segments", 128, 128)  # 8 MCUs a row, segments of 2
    payload = np.frombuffer(data, np.uint8)
    layout = jpeg_layout(payload)
    assert splice_window(payload, 128, 128, (64, 80, 64, 80), exact_upsampling=False).jpeg is not None
    markers = [i for i in range(layout.scan_start, len(data) - 1)
               if data[i] == 0xFF and 0xD0 <= data[i + 1] <= 0xD7]
    assert len(markers) == 8 * 4 - 1  # 8 MCU rows of 4 segments
    for damage in (lambda b: b.__setitem__(markers[3] + 1, 0xD0 + (data[markers[3] + 1] + 1 - 0xD0) % 8),
                   lambda b: b.__setitem__(slice(markers[3], markers[3] + 2), b"\x00\x00")):
        damaged = bytearray(data)
        damage(damaged)
        window = splice_window(np.frombuffer(bytes(damaged), np.uint8), 128, 128, (64, 80, 64, 80),
                               exact_upsampling=False)
        assert window[:4] == (64, 64, 16, 32) and window.jpeg is None


def next_marker_reference(data: bytes, position: int) -> int:
    """Byte by byte: the first 0xFF at or after ``position`` followed by neither 0 (stuffing) nor 0xFF (fill)."""
    while position + 1 < len(data):
        if data[position] == 0xFF:
            if data[position + 1] not in (0, 0xFF):
                return position
            position += 1 if data[position + 1] == 0xFF else 2
        else:
            position += 1
    return -1


@given(st.lists(st.sampled_from([0, 0xFF, 0xD0, 0xD7, 0xD9, 0x01, 0x7F, 0xFE]), max_size=80))
@example([0] * 15 + [0xFF, 0xD3])  # a marker across two words
@example([0xFF] * 9 + [0xD0])  # fill bytes, then a marker
def test_the_marker_scan_finds_what_a_byte_by_byte_scan_finds(values):
    """The scan tests 8 bytes at a time and jumps to the first 0xFF of a word: from every start, in every
    alignment, next to the end, it agrees with the plain loop; so does it without words (a big-endian host's)."""
    for pad in range(8):  # every alignment of the bytes to the 8-byte words
        data = bytes(pad) + bytes(values)
        payload = np.frombuffer(data, np.uint8)
        expected = [next_marker_reference(data, start) for start in range(len(data) + 1)]
        for words in (uint64_words(payload), np.zeros(0, np.uint64)):
            assert [next_marker(payload, words, start) for start in range(len(data) + 1)] == expected


@given(st.binary(max_size=400), st.integers(0, 3000))
def test_splicing_never_reads_past_the_payload(noise, cut):
    data, _ = encoded("segments", 48, 48)
    for candidate in (data[:cut], data[:cut] + noise, data[:cut] + noise + data[cut:]):
        payload = np.frombuffer(candidate, np.uint8)
        spliced = np.empty(payload.size, np.uint8)
        frame, height, width, _, length, _, _, window_height, window_width = splice_crop(
            payload, uint64_words(payload), 48, 48, 16, 32, 16, 32, 1, False, spliced)
        if length < 0:
            continue
        try:
            decode_spliced(spliced[:length], np.empty((window_height, window_width, 3), np.uint8), colorspace="RGB",
                           min_width=window_width)
        except ValueError:
            pass  # simplejpeg's report of damaged data, which the decoder turns into a DecodeError


@pytest.mark.parametrize("kind", ["segments", "segments-rows", "420", "marked-422", "marked-444", "marked-440",
                                  "marked-gray"])
@given(size=st.tuples(st.integers(20, 260), st.integers(20, 260)), out=st.integers(4, 48), fast=st.booleans(),
       corners=st.lists(st.floats(0, 1), min_size=4, max_size=4))
# 256 px wide, segments of 32 px: crops that start between scaled pixels and end on a segment's edge, across and down
@example(size=(256, 256), out=16, fast=True, corners=[0.25, 0.5, 33 / 256, 96 / 256])
@example(size=(256, 256), out=16, fast=True, corners=[33 / 256, 96 / 256, 0.25, 0.5])
def test_crops_resized_from_a_part_equal_those_from_the_whole_image(kind, size, out, fast, corners):
    """Every crop and DCT scale, through the resize (whose sub-pixel shift reads a pixel past the crop's hull):
    the part decoded gives the same output as the whole image."""
    height, width = size
    data, channels = encoded(kind, height, width, seed=height + 7 * width)
    payload = np.frombuffer(data, np.uint8)
    (top, bottom), (left, right) = (sorted(round(c * n) for c in corners[k : k + 2])
                                    for k, n in ((0, height), (2, width)))
    top, left = min(top, height - 1), min(left, width - 1)
    crop = (top, left, max(1, bottom - top), max(1, right - left))
    crop = (top, left, min(crop[2], height - top), min(crop[3], width - left))

    def scratch(nbytes, purpose="default"):
        return np.empty(nbytes, np.uint8)

    outputs = []
    for whole in (False, True):
        decoder = RandomResizedCropRGBImageDecoder((out, out), fast_upsample=fast, decode_whole=whole)
        image, scaled = decoder.decoded_crop(payload, (height, width, channels), crop, (out, out, channels),
                                             scratch)
        outputs.append(np.empty((out, out, channels), np.uint8))
        resize_into(image, outputs[-1], scaled, scratch=scratch)
    np.testing.assert_array_equal(outputs[0], outputs[1])


def test_a_crop_decodes_only_its_segments_or_without_them_the_rows_above_its_bottom():
    plain = encoded("420", 256, 256)[0]
    payload = np.frombuffer(with_restart_markers(plain), np.uint8)  # 16 MCUs a row: segments of 4 MCUs, 64 px
    asked = []  # the scratch buffers each decode asks for: "rows" for the payload's copy the rows' decode reads

    def scratch(nbytes, purpose="default"):
        asked.append(purpose)
        return np.empty(nbytes, np.uint8)

    def decoded(payload, crop):
        asked.clear()
        image, scaled = decoder.decoded_crop(payload, (256, 256, 3), crop, (32, 32, 3), scratch)
        return image.shape[:2], scaled, "rows" in asked

    decoder = RandomResizedCropRGBImageDecoder((32, 32))
    # MCU rows 6..8, segment columns 1..2
    assert decoded(payload, (100, 120, 40, 40)) == ((48, 128), (4, 56, 40, 40), False)
    # the window (rows 16..223, every column) of a crop that needs nearly the whole image
    assert decoded(payload, (16, 8, 200, 240)) == ((208 // 4, 256 // 4), (0, 2, 50, 60), False)  # at 1/4 scale
    # one as large as the rows above the bottom (rows 0..207, every column) too: with restart markers, the rows
    # decode could not tell the skip to the end from data left over in a segment
    assert decoded(payload, (0, 8, 200, 240)) == ((208 // 4, 256 // 4), (0, 2, 50, 60), False)
    # without restart markers: the rows above the crop's bottom (0..143), every column
    assert decoded(np.frombuffer(plain, np.uint8), (100, 120, 40, 40)) == ((144, 256), (100, 120, 40, 40), True)


def test_damage_inside_a_window_raises():
    """Damage in a segment the crop decodes is libjpeg-turbo's to report, as in a whole decode."""
    data = bytearray(with_restart_markers(encoded("420", 256, 256)[0]))  # segments of 64 x 16 px
    payload = np.frombuffer(bytes(data), np.uint8)
    layout = jpeg_layout(payload)
    markers = [i for i in range(layout.scan_start, len(data) - 1) if data[i] == 0xFF and 0xD0 <= data[i + 1] <= 0xD7]
    # the segment of MCU row 6, columns 64..127 (row 6 of 16, column 1 of 4): its bytes follow marker 6 * 4 + 1 - 1
    start, end = markers[6 * 4] + 2, markers[6 * 4 + 1]
    data[start + 2 : end - 2] = bytes(end - start - 4)  # zeroed: no marker bytes, so the splice takes it whole

    def scratch(nbytes, purpose="default"):
        return np.empty(nbytes, np.uint8)

    decoder = RandomResizedCropRGBImageDecoder((32, 32))
    damaged = np.frombuffer(bytes(data), np.uint8)
    with pytest.raises(DecodeError, match="JPEG cannot be decoded"):
        decoder.decoded_crop(damaged, (256, 256, 3), (100, 70, 40, 40), (32, 32, 3), scratch)
    image, _ = decoder.decoded_crop(payload, (256, 256, 3), (100, 70, 40, 40), (32, 32, 3), scratch)
    assert image.shape[:2] == (48, 64)  # undamaged: one segment column of 3 MCU rows, the window path
