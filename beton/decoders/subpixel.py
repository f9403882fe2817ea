"""Shifting an image by a fraction of a pixel, compiled: what lets a crop start between the pixels of a DCT-scaled
decode (:func:`beton.decoders.rgb_image.resize_into` shifts, then resizes by the crop's exact scale).

The shift is bilinear, in sixteenths of a pixel per axis: a crop mapped onto a decode at 1/2, 1/4 or 1/8 starts
on a multiple of 1/8 of a pixel, so it is exact there (any other fraction is rounded to 1/16). With the two
weights of each axis in sixteenths, the four products of a pixel sum to 256 parts: an 8-bit image's weighted sum
fits 16 bits, which LLVM vectorises many values at a time. It replaces OpenCV's ``addWeighted`` once per axis
(which converts to float and returns new arrays); docs/images.md, "Where the crop lands", has the paired figures.
"""

from __future__ import annotations

import numba
import numpy as np

__all__ = ["SUBPIXEL_STEPS", "shift_into"]

#: Steps per pixel of the shift: 16 (see the module docstring).
SUBPIXEL_STEPS = 16


@numba.njit(nogil=True, cache=True)
def _shift_kernel(image, y0, x0, w00, w01, w10, w11, out):
    """out = image's four neighbours of each pixel weighted by w00 (itself), w01 (right), w10 (below) and w11,
    in 256ths. The weights must arrive as uint16: with 64-bit weights (numba's type for arithmetic on small
    integers) the products vectorise over fewer values at a time (docs/images.md)."""
    rows, columns, channels = image.shape
    height, width = out.shape[0], out.shape[1]
    source, target = image.ravel(), out.ravel()  # both contiguous: views
    half, eight = np.uint16(128), np.uint16(8)
    # Flat unsigned indices: numba checks signed ones for wrap-around, which (as did row slices passed to a
    # helper) kept LLVM from vectorising. The products of a uint8 image fit 16 bits (the weights sum to 256);
    # numba computes them in 64 bits, so uint16 images are exact too.
    step, line = np.uint64(channels), np.uint64(columns * channels)
    n = np.uint64(width * channels)
    # values whose right-hand neighbour is in the image; past the edge, the last column is repeated
    inside = np.uint64(max(0, min(width, columns - 1 - x0)) * channels)
    for y in range(np.uint64(height)):
        upper = (np.uint64(y0) + y) * line + np.uint64(x0 * channels)
        # past the bottom edge, the last row is repeated
        lower = min(np.uint64(y0) + y + np.uint64(1), np.uint64(rows - 1)) * line + np.uint64(x0 * channels)
        o = y * n
        if w10 == 0 and w11 == 0:  # across only (a center crop's usual case): half the reads
            for k in range(inside):
                target[o + k] = (np.uint16(source[upper + k]) * w00 + np.uint16(source[upper + k + step]) * w01
                                 + half) >> eight
        elif w01 == 0 and w11 == 0:  # down only
            for k in range(inside):
                target[o + k] = (np.uint16(source[upper + k]) * w00 + np.uint16(source[lower + k]) * w10
                                 + half) >> eight
        else:
            for k in range(inside):
                target[o + k] = (np.uint16(source[upper + k]) * w00 + np.uint16(source[upper + k + step]) * w01
                                 + np.uint16(source[lower + k]) * w10 + np.uint16(source[lower + k + step]) * w11
                                 + half) >> eight
        for k in range(inside, n):  # at most the last pixel
            target[o + k] = (np.uint16(source[upper + k]) * w00 + np.uint16(source[upper + k]) * w01
                             + np.uint16(source[lower + k]) * w10 + np.uint16(source[lower + k]) * w11 + half) >> eight


@numba.njit(nogil=True, cache=True)
def _half_kernel(image, y0, x0, down, across, out):
    """The kernel's result where each fraction is 0 or 1/2 (every crop on a 1/2 decode), without products:
    (a + b + 1) >> 1 is the weighted sum exactly for weights of 128 and 128, and compiles to the CPU's rounding
    average; (a + b + c + d + 2) >> 2 for four weights of 64. A kernel of its own: as branches of the one above,
    they slowed every other branch by up to half (LLVM vectorised it less well)."""
    rows, columns, channels = image.shape
    height, width = out.shape[0], out.shape[1]
    source, target = image.ravel(), out.ravel()
    one, two = np.uint16(1), np.uint16(2)
    step, line = np.uint64(channels), np.uint64(columns * channels)
    n = np.uint64(width * channels)
    # past the right edge the last column is repeated: a shift across reads it twice
    inside = np.uint64(max(0, min(width, columns - 1 - x0)) * channels) if across else n
    right = step if across else np.uint64(0)
    for y in range(np.uint64(height)):
        upper = (np.uint64(y0) + y) * line + np.uint64(x0 * channels)
        lower = min(np.uint64(y0) + y + np.uint64(1), np.uint64(rows - 1)) * line + np.uint64(x0 * channels) \
            if down else upper
        o = y * n
        if down and across:
            for k in range(inside):
                target[o + k] = (np.uint16(source[upper + k]) + np.uint16(source[upper + k + step])
                                 + np.uint16(source[lower + k]) + np.uint16(source[lower + k + step]) + two) >> two
        else:
            for k in range(inside):
                target[o + k] = (np.uint16(source[upper + k]) + np.uint16(source[lower + k + right]) + one) >> one
        for k in range(inside, n):  # at most the last pixel, its right-hand neighbour itself
            target[o + k] = (np.uint16(source[upper + k]) + np.uint16(source[lower + k]) + one) >> one


def shift_into(image: np.ndarray, y0: int, x0: int, fraction_y: float, fraction_x: float, out: np.ndarray) -> None:
    """``out`` (h x w x c) = ``image`` (H x W x c, uint8 or uint16) sampled bilinearly at
    (y0 + fraction_y + y, x0 + fraction_x + x) for every pixel (y, x) of ``out``; fractions in [0, 1], rounded to
    1/16. Reads rows y0 .. y0 + h and columns x0 .. x0 + w, the image's last row and column repeated past its
    edge; y0 + h and x0 + w must not pass the image's size."""
    if not (0 <= y0 and 0 <= x0 and y0 + out.shape[0] <= image.shape[0] and x0 + out.shape[1] <= image.shape[1]
            and out.shape[2:] == image.shape[2:] and out.dtype == image.dtype and image.dtype in (np.uint8, np.uint16)
            and out.flags.c_contiguous):
        raise ValueError(f"shift_into: a {out.shape} {out.dtype} region (contiguous: {out.flags.c_contiguous}) at "
                         f"({y0}, {x0}) does not fit a {image.shape} {image.dtype} image")
    wy1, wx1 = round(fraction_y * SUBPIXEL_STEPS), round(fraction_x * SUBPIXEL_STEPS)
    wy0, wx0 = SUBPIXEL_STEPS - wy1, SUBPIXEL_STEPS - wx1
    if wy1 in (0, SUBPIXEL_STEPS // 2) and wx1 in (0, SUBPIXEL_STEPS // 2) and (wy1 or wx1):
        _half_kernel(np.ascontiguousarray(image), y0, x0, wy1 > 0, wx1 > 0, out)
        return
    _shift_kernel(np.ascontiguousarray(image), y0, x0, *(np.uint16(w) for w in (wy0 * wx0, wy0 * wx1, wy1 * wx0,
                                                                                 wy1 * wx1)), out)
