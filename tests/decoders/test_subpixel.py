"""The compiled sub-pixel shift behind exact crop mapping (beton.decoders.subpixel): bilinear samples at the
places asked for, to rounding, on uint8 and uint16 images, up to and past the image's edges."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from beton.decoders.subpixel import shift_into
from beton.tools.sample_photos import photo_crop


def bilinear(image: np.ndarray, y0: int, x0: int, fy: float, fx: float, height: int, width: int) -> np.ndarray:
    """Float reference: the four neighbours of (y0 + y + fy, x0 + x + fx), the last row and column repeated."""
    rows = np.minimum(np.arange(y0, y0 + height + 1), image.shape[0] - 1)
    columns = np.minimum(np.arange(x0, x0 + width + 1), image.shape[1] - 1)
    pixels = image.astype(np.float64)[rows][:, columns]
    return ((1 - fy) * (1 - fx) * pixels[:-1, :-1] + (1 - fy) * fx * pixels[:-1, 1:]
            + fy * (1 - fx) * pixels[1:, :-1] + fy * fx * pixels[1:, 1:])


@settings(max_examples=60, deadline=None)
@given(st.sampled_from([np.uint8, np.uint16]), st.sampled_from([1, 3]), st.integers(0, 15), st.integers(0, 15),
       st.integers(0, 40), st.integers(0, 40), st.integers(1, 30), st.integers(1, 30), st.integers(0, 5))
def test_samples_where_asked_to_rounding(dtype, channels, steps_y, steps_x, y0, x0, height, width, seed):
    image = photo_crop(seed, 48, 56)[..., :channels].astype(dtype) * (257 if dtype == np.uint16 else 1)
    height, width = min(height, 48 - y0) if y0 < 48 else 0, min(width, 56 - x0) if x0 < 56 else 0
    if not height or not width:
        return
    out = np.empty((height, width, channels), dtype)
    shift_into(image, y0, x0, steps_y / 16, steps_x / 16, out)
    reference = bilinear(image, y0, x0, steps_y / 16, steps_x / 16, height, width)
    assert np.abs(out - reference).max() <= 0.5 + 1e-9  # one rounding, to the nearest value


def test_whole_pixels_are_copied_and_fractions_round_to_sixteenths():
    image = photo_crop(1, 40, 40)
    out = np.empty((30, 30, 3), np.uint8)
    shift_into(image, 5, 7, 0.0, 0.0, out)
    assert np.array_equal(out, image[5:35, 7:37])
    shift_into(image, 5, 7, 0.49, 0.26, out)  # 7.84 and 4.16 sixteenths
    assert np.abs(out - bilinear(image, 5, 7, 0.5, 0.25, 30, 30)).max() <= 0.5


@pytest.mark.parametrize("y0, x0, shape, dtype", [(30, 0, (20, 10, 3), np.uint8), (0, 0, (10, 10, 1), np.uint8),
                                                   (0, 0, (10, 10, 3), np.float32)])
def test_regions_that_do_not_fit_are_refused(y0, x0, shape, dtype):
    image = np.zeros((40, 40, 3), dtype)
    with pytest.raises(ValueError, match="does not fit"):
        shift_into(image, y0, x0, 0.5, 0.5, np.empty(shape, dtype))


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16])
@pytest.mark.parametrize("y0, x0", [(3, 2), (6, 6)])  # inside; up to the bottom and right edges
def test_every_fraction_gives_the_fixed_point_weighted_sum_exactly(dtype, y0, x0):
    """Each kernel and branch (halves without products, one axis, both) equals the one formula: the four
    neighbours weighted in 256ths, rounded half up. Exact, not to a tolerance."""
    image = photo_crop(2, 30, 34).astype(dtype) * (257 if dtype == np.uint16 else 1)
    height, width = 24, 28
    for steps_y in range(16):
        for steps_x in range(16):
            out = np.empty((height, width, 3), dtype)
            shift_into(image, y0, x0, steps_y / 16, steps_x / 16, out)
            rows = np.minimum(np.arange(y0, y0 + height + 1), image.shape[0] - 1)
            columns = np.minimum(np.arange(x0, x0 + width + 1), image.shape[1] - 1)
            pixels = image.astype(np.int64)[rows][:, columns]
            weights = [(16 - steps_y) * (16 - steps_x), (16 - steps_y) * steps_x, steps_y * (16 - steps_x),
                       steps_y * steps_x]
            expected = (weights[0] * pixels[:-1, :-1] + weights[1] * pixels[:-1, 1:] + weights[2] * pixels[1:, :-1]
                        + weights[3] * pixels[1:, 1:] + 128) >> 8
            assert np.array_equal(out, expected.astype(dtype)), (steps_y, steps_x)


def test_halves_take_the_kernel_without_products(monkeypatch):
    """Fractions of 0 and 1/2 (every crop on a 1/2 decode) go to the averaging kernel, any other to the weighted
    one: the speed of the common case depends on it, the pixels do not (the test above)."""
    import beton.decoders.subpixel as subpixel

    calls = []
    monkeypatch.setattr(subpixel, "_half_kernel", lambda *arguments: calls.append("half"))
    monkeypatch.setattr(subpixel, "_shift_kernel", lambda *arguments: calls.append("weighted"))
    image, out = photo_crop(0, 20, 20), np.empty((10, 10, 3), np.uint8)
    for fractions in [(0.5, 0.0), (0.0, 0.5), (0.5, 0.5), (0.25, 0.0), (0.5, 0.75), (0.0, 0.0)]:
        shift_into(image, 2, 3, *fractions, out)
    assert calls == ["half", "half", "half", "weighted", "weighted", "weighted"]
