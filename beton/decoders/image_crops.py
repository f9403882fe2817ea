"""Where to crop and whether to flip: torchvision's RandomResizedCrop algorithm, FFCV-style center crops and the
flips' draw, compiled.

The crops return (top, left, height, width) in pixels of the stored image. Random decisions draw from the
counter-based generator (:mod:`beton.random`), so they depend only on (key, sample): the image operations and
the boxes that follow them (:mod:`beton.decoders.boxes`) make them here, to make the same ones.

They keep the GIL (no ``nogil``): the decoders' worker threads call them from Python for a microsecond, and
letting go of the GIL for that long only hands it to the other worker, to be waited for on the way back.
"""

from __future__ import annotations

import math

import numba

from beton.random import uniform

__all__ = ["random_resized_crop", "center_crop", "flips"]

_ATTEMPTS = 10


@numba.njit(cache=True)
def random_resized_crop(key, sample, height, width, scale_low, scale_high, log_ratio_low, log_ratio_high):
    """Up to 10 tries at a crop of area fraction in [scale_low, scale_high] and log aspect ratio (w/h) in
    [log_ratio_low, log_ratio_high]; otherwise the largest center crop whose ratio lies in the range."""
    area = height * width
    for attempt in range(_ATTEMPTS):
        target_area = area * (scale_low + (scale_high - scale_low) * uniform(key, sample, 4 * attempt))
        log_ratio = log_ratio_low + (log_ratio_high - log_ratio_low) * uniform(key, sample, 4 * attempt + 1)
        aspect = math.exp(log_ratio)
        crop_width = int(round(math.sqrt(target_area * aspect)))
        crop_height = int(round(math.sqrt(target_area / aspect)))
        if 0 < crop_width <= width and 0 < crop_height <= height:
            top = int(uniform(key, sample, 4 * attempt + 2) * (height - crop_height + 1))
            left = int(uniform(key, sample, 4 * attempt + 3) * (width - crop_width + 1))
            return top, left, crop_height, crop_width
    in_ratio = width / height
    if in_ratio < math.exp(log_ratio_low):
        crop_width = width
        crop_height = min(height, max(1, int(round(crop_width / math.exp(log_ratio_low)))))
    elif in_ratio > math.exp(log_ratio_high):
        crop_height = height
        crop_width = min(width, max(1, int(round(crop_height * math.exp(log_ratio_high)))))
    else:
        crop_width, crop_height = width, height
    return (height - crop_height) // 2, (width - crop_width) // 2, crop_height, crop_width


@numba.njit(cache=True)
def center_crop(height, width, ratio):
    """A centered square of side ``ratio * min(height, width)`` (at least one pixel)."""
    side = max(1, int(ratio * min(height, width)))
    return (height - side) // 2, (width - side) // 2, side, side


@numba.njit(nogil=True, cache=True)
def flips(key, sample, probability):
    """Whether a random flip of ``probability`` mirrors ``sample`` (draw 0 of the flip's key)."""
    return uniform(key, sample, 0) < probability
