"""Decoding only the part of a JPEG a crop needs: the restart segments it touches, or the rows above its bottom.

**Restart segments.** A sequential JPEG whose restart interval divides its MCU rows into whole segments (or
spans whole MCU rows) is a grid of independently coded rectangles: each segment starts at a restart marker,
byte-aligned, with its DC predictions reset. The segments a crop touches, joined by renumbered restart markers
behind the original header whose frame size is set to their rectangle's, form a valid JPEG of that rectangle,
and libjpeg-turbo decodes it to exactly the pixels a full decode gives there: the same coefficients, the same
inverse DCT per block. Only chroma upsampling looks across blocks: libjpeg's box filter (``fastupsample``)
looks at nothing outside its MCU, its triangle filter at the neighbouring MCU, so with smooth upsampling the
rectangle takes one more segment on each side. beton's writer adds such markers to the JPEGs it stores
(:mod:`beton.codecs.jpeg_restarts`), losslessly.

**Rows above the bottom.** A one-scan sequential JPEG without restart markers codes its MCU rows top to bottom
in one run of entropy-coded data, so the rows above a line never depend on the data below it. simplejpeg cannot
be told to stop early, but libjpeg-turbo stops where the frame header says the image ends: in a copy of the
payload whose SOF height is lowered to a whole number of MCU rows, the rows above are decoded exactly as in the
full image, and the rows below are neither Huffman-decoded nor transformed. libjpeg-turbo then skips the unread
entropy data to the end marker and reports it as a warning ("N extraneous bytes before marker 0xd9");
simplejpeg's strict mode stops at the first warning and raises it as a ValueError, *after* the rows were written
into our buffer when it is that one. :func:`decode_rows` accepts exactly that warning, naming the end marker, and
keeps every other one an error: any earlier warning stopped the decode before all the rows were written, and
would leave the buffer's previous bytes as pixels. With restart markers the same report names a restart marker,
as does extra data inside a decoded segment, so the two cannot be told apart: such a JPEG is decoded by its
segments, or whole.

What each saves is in docs/images.md ("Only the part of the JPEG a crop needs"). Progressive JPEGs (every
scan covers the whole image) and multi-scan sequential ones are decoded whole.
"""

from __future__ import annotations

import sys
from typing import Callable

import numba
import numpy as np
import simplejpeg

from beton.codecs.jpeg_layout import frame_layout, frame_size
from beton.pipeline.memcopy import copy_bytes

__all__ = ["rows_to_decode", "decode_rows", "splice_crop", "decode_spliced", "uint64_words", "next_marker"]

_SKIPPED_TO_THE_END = "extraneous bytes before marker 0xd9"  # libjpeg's JWRN_EXTRANEOUS_DATA, before EOI


@numba.njit(cache=True, inline="always")
def upsampling_margin(mcu_size, factor, exact_upsampling):
    """Image pixels past a region's edge (on the axis whose MCU side is ``mcu_size``) whose chroma the region's
    pixels read, at 1/``factor``. libjpeg's smooth (triangle) chroma upsampling of a 2x subsampled axis blends
    each pixel's chroma sample with the neighbour on that pixel's side, so an edge pixel reads one more sample only
    where the region ends on a sample's border: the sample that starts one scaled pixel past it. ``mcu_size // 8``
    is the axis's largest sampling factor: 1 for an axis that is not subsampled (no margin); above 2 (no triangle
    filter then) the margin is more than needed. The box filter of ``fastupsample`` looks at nothing outside a
    sample."""
    return (mcu_size // 8 - 1) * factor if exact_upsampling else 0


@numba.njit(cache=True)
def rows_to_decode(bottom, height, mcu_height, factor, exact_upsampling):
    """Image rows to decode at 1/``factor`` so that rows ``[0, bottom)`` come out exactly as in a full decode:
    whole MCU rows, down to the chroma the last scaled row reads (:func:`upsampling_margin`)."""
    bottom = -(-bottom // factor) * factor + upsampling_margin(mcu_height, factor, exact_upsampling)
    return min(-(-bottom // mcu_height) * mcu_height, height)


def decode_rows(payload: np.ndarray, frame: int, rows: int, buffer: Callable[[int], np.ndarray],
                output: np.ndarray, **decode_options) -> None:
    """Decode the top ``rows`` rows of ``payload`` (a one-scan sequential JPEG without restart markers, SOF at
    ``frame``) into ``output``.

    ``buffer(nbytes)`` gives a reusable array to copy the payload into (the stored bytes stay untouched);
    ``output`` must have exactly the shape the shortened frame decodes to (its height sets ``min_height``; pass
    the other ``simplejpeg.decode_jpeg`` options). Raises ValueError, like ``simplejpeg.decode_jpeg``, for any
    problem but the expected report of the data skipped to the end marker (see the module docstring), so also for
    a JPEG with restart markers.
    """
    copy = buffer(payload.size)
    copy[:] = payload
    copy[frame + 5] = rows >> 8  # the frame's height field: 16 bits, big-endian
    copy[frame + 6] = rows & 0xFF
    try:
        simplejpeg.decode_jpeg(copy, buffer=output, min_height=output.shape[0], **decode_options)
    except ValueError as error:
        if not str(error).endswith(_SKIPPED_TO_THE_END):
            raise


@numba.njit(cache=True)
def _window(mcu_height, mcu_width, interval, height, width, top, bottom, left, right, factor, exact_upsampling):
    """The smallest rectangle of restart segments whose decode at 1/``factor`` holds the pixels of the region
    [top, bottom) x [left, right) exactly as a full decode does: segment rows [row0, row1) and columns [column0,
    column1) of a grid ``columns`` segments wide and ``segments`` long in all, then its top, left, height and width
    in pixels. row0 is -1 if the JPEG's restart segments do not tile the image, or if the rectangle is the whole
    image.

    With ``exact_upsampling`` (libjpeg's triangle filter) the rectangle also holds the chroma the region's edge
    pixels blend with (:func:`upsampling_margin`): a segment more on a side only where the region ends within a
    chroma sample of that segment's edge (it took one more on every side: docs/images.md has what that cost).
    A rectangle stays over 8 pixels on each axis where the image allows: simplejpeg picks the largest DCT scale
    whose output is at least the size asked for, and 8 pixels or fewer decode to the same size at two scales.
    """
    per_row = -(-width // mcu_width)
    if interval <= 0 or per_row <= 0 or height <= 0:
        return -1, 0, 0, 0, 0, 0, 0, 0, 0, 0
    if per_row % interval == 0:  # several segments in each MCU row
        unit_height, unit_width, columns = mcu_height, interval * mcu_width, per_row // interval
    elif interval % per_row == 0:  # each segment whole MCU rows
        unit_height, unit_width, columns = interval // per_row * mcu_height, width, 1
    else:
        return -1, 0, 0, 0, 0, 0, 0, 0, 0, 0
    rows = -(-height // unit_height)
    margin_y = upsampling_margin(mcu_height, factor, exact_upsampling)
    margin_x = upsampling_margin(mcu_width, factor, exact_upsampling)
    # scaled pixels, widened by the chroma their edge pixels blend with
    top, left = max(0, top - top % factor - margin_y), max(0, left - left % factor - margin_x)
    bottom, right = -(-bottom // factor) * factor + margin_y, -(-right // factor) * factor + margin_x
    row0, row1 = _widened(top // unit_height, min(rows, -(-bottom // unit_height)), rows, unit_height, height)
    column0, column1 = _widened(left // unit_width, min(columns, -(-right // unit_width)), columns, unit_width,
                                width)
    if row0 == 0 and row1 == rows and column0 == 0 and column1 == columns:
        return -1, 0, 0, 0, 0, 0, 0, 0, 0, 0
    window_top, window_left = row0 * unit_height, column0 * unit_width
    segments = -(-(-(-height // mcu_height) * per_row) // interval)
    return (row0, row1, column0, column1, columns, segments, window_top, window_left,
            min(height, row1 * unit_height) - window_top, min(width, column1 * unit_width) - window_left)


@numba.njit(cache=True, inline="always")
def _widened(first, end, count, unit, size):
    """Units [first, end) grown by one at a time, inward first, until they span over 8 pixels or all ``count``."""
    while min(size, end * unit) - first * unit <= 8 and (first > 0 or end < count):
        if first > 0:
            first -= 1
        else:
            end += 1
    return first, end


_ONES = np.uint64(0x0101010101010101)
_HIGHS = np.uint64(0x8080808080808080)
_BYTE_INDEX = np.uint64(0x0001020304050607)  # times 0x01 in byte k of a word: k in the top byte


@numba.njit(nogil=True, cache=True, inline="always")
def next_marker(payload, words, position):
    """Where the next marker at or after ``position`` starts (0xFF followed by neither a stuffed 0 nor another 0xFF,
    a fill byte); -1 if none does before the end. Tests 8 bytes at a time for a 0xFF (about one byte in 80 of
    photos' coded data is one) and jumps to the first: ``words`` is ``payload``'s whole 8-byte words, as
    uint64 (:func:`uint64_words`)."""
    size = payload.size
    while position + 1 < size:
        index = position >> 3
        if index < words.size:
            word = words[index] >> np.uint64(8 * (position & 7))  # its bytes from position on, zeros above them
            # a 0x80 bit in each byte of ~word that is 0, so each 0xFF byte of word; only the lowest is certain
            found = (~word - _ONES) & word & _HIGHS
            if found == 0:
                position = (index + 1) << 3
                continue
            lowest = (found & (~found + np.uint64(1))) >> np.uint64(7)  # 0x01 in the first 0xFF byte
            position += np.int64((lowest * _BYTE_INDEX) >> np.uint64(56))
            if position + 1 >= size:
                return -1
        elif payload[position] != 0xFF:
            position += 1
            continue
        following = payload[position + 1]
        if following != 0 and following != 0xFF:
            return position
        position += 1 if following == 0xFF else 2
    return -1


@numba.njit(nogil=True, cache=True)
def _splice(payload, words, scan_start, frame, row0, row1, column0, column1, columns, segments, height, width, out):
    """Write into ``out`` the JPEG of the window's segments (see the module docstring); its length, or -1 if
    the entropy-coded data is not ``segments`` segments ended by restart markers numbered in sequence, or
    ``out`` is too small. Reads no further than the window's last segment."""
    if scan_start > out.size or frame + 9 > scan_start:
        return -1
    copy_bytes(out[:scan_start], payload, 0, scan_start)
    out[frame + 5], out[frame + 6] = height >> 8, height & 0xFF  # the frame header's 16-bit height, width
    out[frame + 7], out[frame + 8] = width >> 8, width & 0xFF
    last = (row1 - 1) * columns + column1 - 1
    written, start = scan_start, scan_start
    restarts = 0  # markers written
    for segment in range(last + 1):
        position = next_marker(payload, words, start)  # the marker that ends this segment
        if position < 0:
            return -1
        following = payload[position + 1]
        if segment == segments - 1:
            if 0xD0 <= following <= 0xD7:
                return -1  # more segments than the frame holds
        elif following != 0xD0 + (segment & 7):
            return -1  # ended early, or restart markers out of sequence
        row, column = segment // columns, segment % columns
        if row0 <= row < row1 and column0 <= column < column1:
            length = position - start
            if written + length + 2 > out.size:
                return -1
            copy_bytes(out[written : written + length], payload, start, length)
            written += length
            out[written] = 0xFF
            out[written + 1] = 0xD9 if segment == last else 0xD0 + (restarts & 7)  # EOI after the last
            written += 2
            restarts += 1
        start = position + 2
    return written


@numba.njit(nogil=True, cache=True)
def splice_crop(payload, words, height, width, top, bottom, left, right, factor, exact_upsampling, spliced):
    """Plan the decode of the image pixels [top, bottom) x [left, right) of ``payload`` at 1/``factor``, and
    splice its window when that is the plan: one compiled call for the header walk, the choice and the splice
    (the crop decoders' per-image path).

    ``words``: ``payload``'s whole 8-byte words as uint64; ``spliced``: at least ``payload.size`` bytes (a
    window's JPEG is never longer than the payload). Returns (frame, frame height, frame width, rows, length,
    window top, left, height, width): frame -1 if the payload is not a one-scan sequential JPEG (decode it
    whole); a frame whose size is not ``height`` x ``width`` decides nothing more (length -1); else ``length``
    bytes of ``spliced`` are the window's JPEG, or, if -1, the top ``rows`` rows are what to decode: those above
    the crop's bottom (:func:`rows_to_decode`) for a JPEG without restart markers, else all of them (module
    docstring). With restart markers the window is taken whenever it is not the whole image: a window no smaller
    than the rows above the crop still saves the whole decode."""
    frame, mcu_height, mcu_width, interval, scan_start = frame_layout(payload)
    if frame < 0:
        return -1, 0, 0, 0, -1, 0, 0, 0, 0
    frame_height, frame_width = frame_size(payload, frame)
    if frame_height != height or frame_width != width:
        return frame, frame_height, frame_width, 0, -1, 0, 0, 0, 0
    if interval == 0:
        scaled_bottom = min(-(-height // factor), -(-bottom // factor))  # the last decoded row the crop touches
        return frame, frame_height, frame_width, rows_to_decode(scaled_bottom * factor, height, mcu_height, factor,
                                                                exact_upsampling), -1, 0, 0, 0, 0
    row0, row1, column0, column1, columns, segments, window_top, window_left, window_height, window_width = \
        _window(mcu_height, mcu_width, interval, height, width, top, bottom, left, right, factor, exact_upsampling)
    length = -1
    if row0 >= 0:
        length = _splice(payload, words, scan_start, frame, row0, row1, column0, column1, columns, segments,
                         window_height, window_width, spliced)
    return frame, frame_height, frame_width, height, length, window_top, window_left, window_height, window_width


def uint64_words(payload: np.ndarray) -> np.ndarray:
    """``payload``'s whole 8-byte words as uint64, for the marker scan, which reads byte k of a word as its bits
    8k..8k+7: on a big-endian host, none (the scan then reads byte by byte)."""
    if sys.byteorder != "little":
        return np.zeros(0, np.uint64)
    return payload[: payload.size // 8 * 8].view(np.uint64)


def decode_spliced(spliced: np.ndarray, output: np.ndarray, **decode_options) -> None:
    """Decode a window's JPEG (as :func:`splice_crop` spliced it) into ``output``, whose
    height sets ``min_height`` (pass the other ``simplejpeg.decode_jpeg`` options). Raises ValueError, like
    ``simplejpeg.decode_jpeg``, also where it decodes to another size than ``output``'s."""
    decoded = simplejpeg.decode_jpeg(spliced, buffer=output, min_height=output.shape[0], **decode_options)
    if decoded.shape[:2] != output.shape[:2]:
        raise ValueError(f"decoded {decoded.shape[1]}x{decoded.shape[0]} of a spliced window, expected "
                         f"{output.shape[1]}x{output.shape[0]}")
