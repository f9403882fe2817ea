"""Decoding only the rows of a JPEG a crop needs: the image down to the crop's bottom edge, not below.

A sequential (baseline) JPEG codes its MCU rows top to bottom in one scan, so the rows above a line never
depend on the data below it. simplejpeg cannot be told to stop early, but libjpeg-turbo stops where the frame
header says the image ends: in a copy of the payload whose SOF height is lowered to a whole number of MCU
rows, the rows above are decoded exactly as in the full image, and the rows below are neither Huffman-decoded
nor transformed. libjpeg-turbo then skips the unread entropy data to the next marker and reports it as a
warning ("N extraneous bytes before marker"); simplejpeg's strict mode raises that warning as a ValueError
*after* the rows were written into our buffer, so :func:`decode_rows` accepts exactly that warning and keeps
every other one an error (damaged data inside the decoded rows still raises, as in a full decode).

What it saves is in docs/images.md ("Only the rows above the crop's bottom edge"). Progressive JPEGs (every
scan covers the whole image) and multi-scan sequential ones are decoded whole.
"""

from __future__ import annotations

from typing import Callable

import numba
import numpy as np
import simplejpeg

__all__ = ["sequential_frame", "frame_size", "rows_to_decode", "decode_rows"]

_SKIPPED_DATA = "extraneous bytes before marker"  # libjpeg's JWRN_EXTRANEOUS_DATA


@numba.njit(cache=True)  # keeps the GIL: a microsecond's work, see beton.decoders.image_crops
def _frame_layout(payload: np.ndarray) -> tuple[int, int]:
    """(offset of the SOF marker, MCU height in pixels) of a one-scan sequential JPEG, else (-1, 0).

    Walks the marker segments up to the first SOS; one scan holding every component of a sequential frame is
    the whole image (a sequential JPEG may instead send each component in a scan of its own).
    """
    size = payload.size
    if size < 4 or payload[0] != 0xFF or payload[1] != 0xD8:
        return -1, 0
    position, frame, components, mcu_height = 2, -1, 0, 0
    while position + 4 <= size:
        if payload[position] != 0xFF:
            return -1, 0
        marker = payload[position + 1]
        if marker == 0xFF:  # fill byte
            position += 1
            continue
        if 0xD0 <= marker <= 0xD7 or marker == 0x01:  # parameterless markers
            position += 2
            continue
        length = (np.int64(payload[position + 2]) << 8) | np.int64(payload[position + 3])
        if length < 2:
            return -1, 0
        # SOF markers: 0xC0-0xCF but DHT (C4), JPG (C8) and DAC (CC); only C0/C1 are sequential Huffman
        if 0xC0 <= marker <= 0xCF and marker != 0xC4 and marker != 0xC8 and marker != 0xCC:
            if frame >= 0 or (marker != 0xC0 and marker != 0xC1) or position + 10 > size:
                return -1, 0  # progressive, lossless, arithmetic-coded, or a second frame
            components = np.int64(payload[position + 9])
            if components < 1 or position + 10 + 3 * components > size:
                return -1, 0
            tallest = 1
            for component in range(components):
                tallest = max(tallest, np.int64(payload[position + 11 + 3 * component]) & 0x0F)
            frame, mcu_height = position, 8 * tallest if components > 1 else 8
        elif marker == 0xDA:  # SOS
            if frame < 0 or position + 5 > size or np.int64(payload[position + 4]) != components:
                return -1, 0
            return frame, mcu_height
        position += 2 + length
    return -1, 0


def sequential_frame(payload: np.ndarray) -> tuple[int, int] | None:
    """(offset of the SOF marker, MCU height) when rows can be cut off the bottom of ``payload``; else None."""
    frame, mcu_height = _frame_layout(payload)
    return None if frame < 0 else (frame, mcu_height)


def frame_size(payload: np.ndarray, frame: int) -> tuple[int, int]:
    """(height, width) written in the frame header at ``frame`` (16-bit big-endian fields)."""
    return (int(payload[frame + 5]) << 8 | int(payload[frame + 6]),
            int(payload[frame + 7]) << 8 | int(payload[frame + 8]))


def rows_to_decode(bottom: int, height: int, mcu_height: int, exact_upsampling: bool) -> int:
    """Image rows to decode so that rows ``[0, bottom)`` come out exactly as in a full decode.

    Whole MCU rows; with libjpeg's smooth (triangle) chroma upsampling one MCU row more, because each row's
    chroma is interpolated with the next MCU row's (the box filter of ``fastupsample`` looks at nothing below).
    """
    rows = -(-bottom // mcu_height) * mcu_height + (mcu_height if exact_upsampling else 0)
    return min(rows, height)


def decode_rows(payload: np.ndarray, frame: int, rows: int, buffer: Callable[[int], np.ndarray],
                output: np.ndarray, **decode_options) -> None:
    """Decode the top ``rows`` rows of ``payload`` (a sequential JPEG, SOF at ``frame``) into ``output``.

    ``buffer(nbytes)`` gives a reusable array to copy the payload into (the stored bytes stay untouched);
    ``output`` must have exactly the shape the shortened frame decodes to (its height sets ``min_height``; pass
    the other ``simplejpeg.decode_jpeg`` options). Raises ValueError, like ``simplejpeg.decode_jpeg``, for any
    problem but the expected report of the skipped data.
    """
    copy = buffer(payload.size)
    copy[:] = payload
    copy[frame + 5] = rows >> 8  # the frame's height field: 16 bits, big-endian
    copy[frame + 6] = rows & 0xFF
    try:
        simplejpeg.decode_jpeg(copy, buffer=output, min_height=output.shape[0], **decode_options)
    except ValueError as error:
        if _SKIPPED_DATA not in str(error):
            raise
