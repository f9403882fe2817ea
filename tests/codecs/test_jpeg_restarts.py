"""Restart markers added losslessly: same pixels, the DRI and RST markers asked for, segments that splice."""

from __future__ import annotations

import functools
import tracemalloc
import re

import cv2
import numpy as np
import pytest
import simplejpeg
from hypothesis import given
from hypothesis import strategies as st

from beton.codecs.jpeg_restarts import add_restart_markers, choose_interval, encode_jpeg, with_restart_markers
from beton.decoders.jpeg_regions import decode_spliced
from beton.tools.sample_photos import load_photo

from jpeg_windows import splice_window

SUBSAMPLINGS = ("444", "422", "420", "440", "411")
RST = re.compile(rb"\xff[\xd0-\xd7]")


@functools.lru_cache(maxsize=None)
def photo(name: str, height: int, width: int) -> np.ndarray:
    """A real photo shrunk to at most 2× the size asked, then cropped to it (odd sizes: partial MCUs)."""
    if name in ("china", "flower"):
        from sklearn.datasets import load_sample_image
        source = load_sample_image(f"{name}.jpg")
    else:
        source = load_photo(name)
    scale = min(1.0, 2 * max(height / source.shape[0], width / source.shape[1]))
    if scale < 1:
        source = cv2.resize(source, (round(source.shape[1] * scale), round(source.shape[0] * scale)),
                            interpolation=cv2.INTER_AREA)
    top, left = (source.shape[0] - height) // 3, (source.shape[1] - width) // 2
    return np.ascontiguousarray(source[top : top + height, left : left + width])


def cv2_jpeg(image: np.ndarray, quality: int, **flags: int) -> bytes:
    params = [cv2.IMWRITE_JPEG_QUALITY, quality]
    for name, value in flags.items():
        params += [getattr(cv2, f"IMWRITE_JPEG_{name}"), value]
    pixels = cv2.cvtColor(image, cv2.COLOR_RGB2BGR) if image.ndim == 3 else image
    ok, encoded = cv2.imencode(".jpg", pixels, params)
    assert ok
    return encoded.tobytes()


def simplejpeg_jpeg(image: np.ndarray, quality: int, subsampling: str) -> bytes:
    if subsampling == "gray":
        return simplejpeg.encode_jpeg(image[..., :1].copy(), quality, colorspace="GRAY")
    return simplejpeg.encode_jpeg(image, quality, colorsubsampling=subsampling)


def segments(data: bytes) -> dict:
    """What a decoder needs of a JPEG: header up to the scan, SOF offset, DRI, MCU geometry, entropy segments."""
    position, info = 2, {"dri": None}
    while True:
        marker, length = data[position + 1], int.from_bytes(data[position + 2 : position + 4], "big")
        if marker in (0xC0, 0xC1):
            info["sof"] = position
            height, width = int.from_bytes(data[position + 5 : position + 7], "big"), \
                int.from_bytes(data[position + 7 : position + 9], "big")
            count = data[position + 9]
            sampling = [(data[position + 11 + 3 * c] >> 4, data[position + 11 + 3 * c] & 15) for c in range(count)]
            widest, tallest = (max(s[0] for s in sampling), max(s[1] for s in sampling)) if count > 1 else (1, 1)
            info["mcu"] = (8 * tallest, 8 * widest)
            info["mcu_grid"] = (-(-height // (8 * tallest)), -(-width // (8 * widest)))
            info["size"] = (height, width)
        if marker == 0xDD:
            info["dri"] = int.from_bytes(data[position + 4 : position + 6], "big")
        position += 2 + length
        if marker == 0xDA:
            break
    assert data[-2:] == b"\xff\xd9"
    info["header"] = data[:position]
    info["markers"] = [m[1] - 0xD0 for m in RST.findall(data[position:-2])]
    info["segments"] = RST.split(data[position:-2])
    return info


def check_transcode(data: bytes, interval: int) -> bytes:
    """Transcodes ``data`` and checks the promise: same pixels, DRI = interval, RST markers in sequence."""
    out = add_restart_markers(data, interval)
    assert out is not None
    for fast in (False, True):
        np.testing.assert_array_equal(simplejpeg.decode_jpeg(out, fastupsample=fast),
                                      simplejpeg.decode_jpeg(data, fastupsample=fast))
    info = segments(out)
    rows, columns = info["mcu_grid"]
    restarts = -(-rows * columns // interval) - 1
    assert info["dri"] == interval
    assert info["markers"] == [k % 8 for k in range(restarts)]
    return out


@pytest.mark.parametrize("name", ["astronaut", "coffee", "chelsea", "rocket", "china", "flower"])
@pytest.mark.parametrize("subsampling", SUBSAMPLINGS + ("gray",))
def test_simplejpeg_photos_keep_their_pixels(name, subsampling):
    image = photo(name, 75, 101)
    for quality in (50, 90, 100):
        data = simplejpeg_jpeg(image, quality, subsampling)
        for interval in (1, 3, choose_interval(-(-101 // 16))):
            check_transcode(data, interval)


@pytest.mark.parametrize("height, width", [(1, 1), (8, 8), (17, 33), (33, 17), (16, 48), (129, 67)])
@pytest.mark.parametrize("subsampling", SUBSAMPLINGS + ("gray",))
def test_sizes_that_are_not_whole_mcus(height, width, subsampling):
    data = simplejpeg_jpeg(photo("astronaut", height, width), 75, subsampling)
    for interval in (1, 2, 5, 1000):
        check_transcode(data, interval)


@pytest.mark.parametrize("name", ["astronaut", "chelsea", "china"])
def test_cv2_optimized_tables_and_existing_restarts(name):
    colour = photo(name, 91, 118)
    grey = cv2.cvtColor(colour, cv2.COLOR_RGB2GRAY)
    for image in (colour, grey):
        for quality in (60, 95):
            check_transcode(cv2_jpeg(image, quality, OPTIMIZE=1), 4)
            for existing in (1, 3, 5, 8, 100):  # 5 MCUs of 16 px: not dividing a row of 8
                data = cv2_jpeg(image, quality, RST_INTERVAL=existing)
                assert segments(data)["dri"] == existing
                for interval in (1, 2, 4, existing):
                    check_transcode(data, interval)


def test_unsupported_jpegs_give_none():
    image = photo("coffee", 40, 56)
    assert add_restart_markers(cv2_jpeg(image, 90, PROGRESSIVE=1), 4) is None
    two_scans = cv2_jpeg(image, 90, PROGRESSIVE=1)
    assert add_restart_markers(two_scans.replace(b"\xff\xc2", b"\xff\xc0", 1), 4) is None  # scans of one band
    baseline = simplejpeg_jpeg(image, 90, "420")
    assert add_restart_markers(baseline[:-300] + b"\xff\xd9", 4) is None  # the scan ends before its last MCU
    assert add_restart_markers(baseline + b"junk", 4) is not None  # after EOI: not read
    with pytest.raises(ValueError, match="1..65535"):
        add_restart_markers(baseline, 0)


def test_incomplete_dc_tables_are_redefined():
    """An optimized DC table has codes only for the differences its image had; a restart codes an absolute DC
    value, of a larger category: then the scan's DC tables are redefined in a DHT segment (Annex K.3's)."""
    staircase = np.repeat(128 + 4 * (np.arange(256) // 8), 3).reshape(1, 256, 3).repeat(16, axis=0)
    data = cv2_jpeg(staircase.astype(np.uint8), 90, OPTIMIZE=1)  # small differences, large values
    assert check_transcode(data, 1000).count(b"\xff\xc4") == data.count(b"\xff\xc4")  # no restart: kept
    out = check_transcode(data, 1)
    assert out.count(b"\xff\xc4") == data.count(b"\xff\xc4") + 1
    redefined = out[out.rindex(b"\xff\xc4") : out.index(b"\xff\xda")]
    assert b"\x00" + bytes([0, 1, 5] + [1] * 6 + [0] * 7) + bytes(range(12)) in redefined  # DC table 0 (luma)


def test_choose_interval():
    assert [choose_interval(n) for n in (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 15, 16, 30, 11, 13, 121)] == \
        [1, 2, 3, 4, 5, 3, 7, 4, 3, 5, 4, 5, 4, 5, 1, 1, 1]
    for n in range(1, 200):
        interval = choose_interval(n)
        assert n % interval == 0 and (2 <= interval <= 8 or interval == 1)
        assert interval > 1 or n == 1 or all(n % d for d in range(2, 9))  # 1 only where nothing in 2..8 divides
    with pytest.raises(ValueError):
        choose_interval(0)


@pytest.mark.parametrize("subsampling", SUBSAMPLINGS + ("gray",))
def test_the_crop_decoders_splice_the_segments_into_the_crop(subsampling):
    """The transcoder's segments, spliced as the crop decoders splice them, decode to the full decode's pixels."""
    image = photo("chelsea", 83, 190)
    data = check_transcode(simplejpeg_jpeg(image, 85, subsampling), 1)  # any interval dividing a row
    data = check_transcode(data, choose_interval(segments(data)["mcu_grid"][1]))
    payload = np.frombuffer(data, np.uint8)
    colorspace = "GRAY" if subsampling == "gray" else "RGB"
    full = simplejpeg.decode_jpeg(data, fastupsample=True, colorspace=colorspace)
    for region in [(16, 32, 70, 100), (0, 10, 180, 190), (75, 83, 0, 5), (40, 83, 70, 190), (30, 60, 0, 120)]:
        window = splice_window(payload, 83, 190, region, exact_upsampling=False)
        out = np.empty((window.height, window.width, full.shape[2]), np.uint8)
        decode_spliced(window.jpeg, out, colorspace=colorspace, min_width=window.width, fastupsample=True)
        np.testing.assert_array_equal(out, full[window.top : window.top + window.height,
                                                window.left : window.left + window.width])


VALID = {"plain": simplejpeg_jpeg(photo("rocket", 24, 40), 80, "420"),
         "restarts": cv2_jpeg(photo("rocket", 24, 40), 80, RST_INTERVAL=2)}


@given(source=st.sampled_from(sorted(VALID)), cut=st.integers(0, 10_000),
       flips=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=4),
       interval=st.sampled_from([1, 2, 3, 4, 7, 100, 0xFFFF]))
def test_damaged_jpegs_never_raise(source, cut, flips, interval):
    """Truncated or corrupted JPEGs give None or bytes, never an exception or a crash. Bytes that come back
    decode to the same pixels whenever the damaged input decodes without a warning (simplejpeg is strict);
    otherwise simplejpeg's verdict on them is a ValueError, never a crash."""
    data = bytearray(VALID[source][: max(2, len(VALID[source]) - cut % len(VALID[source]))])
    for index, value in flips:
        data[index % len(data)] = value
    out = add_restart_markers(bytes(data), interval)
    if out is None:
        return
    assert isinstance(out, bytes)
    try:
        expected = simplejpeg.decode_jpeg(bytes(data))
    except ValueError:
        expected = None
    try:
        decoded = simplejpeg.decode_jpeg(out)
    except ValueError:
        assert expected is None
        return
    if expected is not None:
        np.testing.assert_array_equal(decoded, expected)


def test_the_field_s_transcode_picks_the_interval_and_leaves_what_it_cannot_carry():
    data = simplejpeg_jpeg(photo("coffee", 200, 300), 90, "420")  # 19 MCUs a row: no divisor in 2..8
    stored = with_restart_markers(data)
    assert segments(stored)["dri"] == choose_interval(19) == 1  # a segment per MCU, not whole rows
    np.testing.assert_array_equal(simplejpeg.decode_jpeg(stored), simplejpeg.decode_jpeg(data))
    wide = simplejpeg_jpeg(photo("coffee", 200, 320), 90, "420")  # 20 MCUs a row: segments of 4
    assert segments(with_restart_markers(wide))["dri"] == 4
    assert with_restart_markers(with_restart_markers(wide)) == with_restart_markers(wide)  # already segmented
    progressive = cv2_jpeg(photo("coffee", 64, 64), 90, PROGRESSIVE=1)
    assert with_restart_markers(progressive) == progressive


def test_damaged_jpegs_are_not_made_to_look_whole():
    """The transcoder reads zeroed data at the end of the scan as coefficients and writes a JPEG that decodes
    cleanly; the field's transcode keeps the damaged bytes, which the decoders then report."""
    data = bytearray(simplejpeg_jpeg(photo("astronaut", 256, 96), 90, "420"))
    data[-400:-200] = bytes(200)
    damaged = bytes(data)
    with pytest.raises(ValueError):
        simplejpeg.decode_jpeg(damaged)
    assert add_restart_markers(damaged, 2) is not None  # the leniency the field's check guards against
    simplejpeg.decode_jpeg(add_restart_markers(damaged, 2))
    assert with_restart_markers(damaged) == damaged


def test_a_frame_declaring_more_blocks_than_its_data_can_hold_is_left_undecoded():
    """A 64x64 JPEG whose frame says 40000x40000: stored as given, without the check decode allocating for that
    size (75 MB at 1/8 scale)."""
    data = bytearray(simplejpeg_jpeg(photo("rocket", 64, 64), 90, "420"))
    frame = segments(bytes(data))["sof"]
    data[frame + 5 : frame + 9] = (40000).to_bytes(2, "big") * 2
    with_restart_markers(simplejpeg_jpeg(photo("rocket", 64, 64), 90, "420"))  # compiled code loaded first
    tracemalloc.start()
    try:
        assert with_restart_markers(bytes(data)) == bytes(data)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


@pytest.mark.parametrize("name", ["astronaut", "china"])
@pytest.mark.parametrize("channels", [3, 1])
@pytest.mark.parametrize("size", [(1, 1), (37, 53), (96, 160), (250, 333)])
def test_encoded_jpegs_carry_the_field_s_markers_and_the_pixels_of_a_jpeg_without_them(name, channels, size):
    """The encoder writes the markers the transcoder would add (so the field stores its output as it is), in
    sequence, and they change no pixel; 4:2:0 for colour, at the quality asked."""
    image = photo(name, *size)
    pixels = image if channels == 3 else cv2.cvtColor(image, cv2.COLOR_RGB2GRAY)[:, :, None]
    marked, plain = encode_jpeg(pixels, 90), encode_jpeg(pixels, 90, restart_markers=False)
    assert with_restart_markers(marked) == marked
    info, mcu_columns = segments(marked), -(-size[1] // (16 if channels == 3 else 8))
    rows, columns = info["mcu_grid"]
    assert info["dri"] == choose_interval(mcu_columns) and segments(plain)["dri"] is None
    assert info["markers"] == [k % 8 for k in range(-(-rows * columns // info["dri"]) - 1)]
    assert info["mcu"] == ((16, 16) if channels == 3 else (8, 8))
    colorspace = "RGB" if channels == 3 else "GRAY"
    decoded = simplejpeg.decode_jpeg(marked, colorspace=colorspace)
    np.testing.assert_array_equal(decoded, simplejpeg.decode_jpeg(plain, colorspace=colorspace))
    if min(size) > 8:  # as close to the pixels as simplejpeg's JPEG of that quality and subsampling
        def psnr(data: bytes) -> float:
            error = np.mean((simplejpeg.decode_jpeg(data, colorspace=colorspace).astype(np.float64) - pixels) ** 2)
            return 10 * np.log10(255**2 / error)

        reference = simplejpeg_jpeg(np.repeat(pixels, 3, axis=2) if channels == 1 else pixels, 90,
                                    "420" if channels == 3 else "gray")
        assert abs(psnr(marked) - psnr(reference)) < 0.3
