"""Where a sequential JPEG's parts are, read from its header: the frame, the MCU size, the restart interval and
the start of the entropy-coded data. Read in the decoders' hot path (each crop) and by the writer (which adds
restart markers, :mod:`beton.codecs.jpeg_restarts`)."""

from __future__ import annotations

from typing import NamedTuple

import numba
import numpy as np

__all__ = ["JpegLayout", "jpeg_layout", "frame_layout", "frame_size"]


class JpegLayout(NamedTuple):
    """Where a one-scan sequential JPEG's parts are, from its header."""

    frame: int  #: offset of the SOF marker
    mcu_height: int  #: pixels
    mcu_width: int  #: pixels
    restart_interval: int  #: MCUs per restart segment (0: none)
    scan_start: int  #: offset of the first entropy-coded byte, after the SOS header


@numba.njit(cache=True)  # keeps the GIL: a microsecond's work, see beton.decoders.image_crops
def frame_layout(payload: np.ndarray) -> tuple[int, int, int, int, int]:
    """(SOF offset, MCU height, MCU width, restart interval, scan start) of a one-scan sequential JPEG, else
    (-1, 0, 0, 0, 0).

    Walks the marker segments up to the first SOS; one scan holding every component of a sequential frame is
    the whole image (a sequential JPEG may instead send each component in a scan of its own).
    """
    size = payload.size
    if size < 4 or payload[0] != 0xFF or payload[1] != 0xD8:
        return -1, 0, 0, 0, 0
    position, frame, components, mcu_height, mcu_width, interval = 2, -1, 0, 0, 0, 0
    while position + 4 <= size:
        if payload[position] != 0xFF:
            return -1, 0, 0, 0, 0
        marker = payload[position + 1]
        if marker == 0x00:  # no marker: libjpeg skips the two bytes as stray data, with a warning
            return -1, 0, 0, 0, 0
        if marker == 0xFF:  # fill byte
            position += 1
            continue
        if 0xD0 <= marker <= 0xD7 or marker == 0x01:  # parameterless markers
            position += 2
            continue
        length = (np.int64(payload[position + 2]) << 8) | np.int64(payload[position + 3])
        if length < 2:
            return -1, 0, 0, 0, 0
        # SOF markers: 0xC0-0xCF but DHT (C4), JPG (C8) and DAC (CC); only C0/C1 are sequential Huffman
        if 0xC0 <= marker <= 0xCF and marker != 0xC4 and marker != 0xC8 and marker != 0xCC:
            if frame >= 0 or (marker != 0xC0 and marker != 0xC1) or position + 10 > size:
                return -1, 0, 0, 0, 0  # progressive, lossless, arithmetic-coded, or a second frame
            components = np.int64(payload[position + 9])
            if components < 1 or position + 10 + 3 * components > size:
                return -1, 0, 0, 0, 0
            tallest, widest = 1, 1
            for component in range(components):
                sampling = np.int64(payload[position + 11 + 3 * component])
                tallest, widest = max(tallest, sampling & 0x0F), max(widest, sampling >> 4)
            frame = position
            # one component: each MCU is one block, whatever sampling factors the header declares
            mcu_height, mcu_width = (8 * tallest, 8 * widest) if components > 1 else (8, 8)
        elif marker == 0xDD:  # DRI
            if length != 4 or position + 6 > size:
                return -1, 0, 0, 0, 0
            interval = (np.int64(payload[position + 4]) << 8) | np.int64(payload[position + 5])
        elif marker == 0xDA:  # SOS
            if frame < 0 or position + 5 > size or np.int64(payload[position + 4]) != components \
                    or position + 2 + length > size:
                return -1, 0, 0, 0, 0
            return frame, mcu_height, mcu_width, interval, position + 2 + length
        position += 2 + length
    return -1, 0, 0, 0, 0


def jpeg_layout(payload: np.ndarray) -> JpegLayout | None:
    """The layout of ``payload`` when parts of it can be decoded alone (a one-scan sequential JPEG); else None."""
    layout = frame_layout(payload)
    return None if layout[0] < 0 else JpegLayout(*(int(value) for value in layout))


@numba.njit(cache=True)
def frame_size(payload: np.ndarray, frame: int) -> tuple[int, int]:
    """(height, width) written in the frame header at ``frame`` (16-bit big-endian fields). Compiled: the crop
    decoders' per-image call reads it too."""
    return ((np.int64(payload[frame + 5]) << 8) | np.int64(payload[frame + 6]),
            (np.int64(payload[frame + 7]) << 8) | np.int64(payload[frame + 8]))
