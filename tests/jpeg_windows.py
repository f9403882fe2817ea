"""The crop decoders' splice of a JPEG's restart segments (``splice_crop``), called as they call it, for the tests
of the window's geometry and pixels."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from beton.decoders.jpeg_regions import splice_crop, uint64_words


class Window(NamedTuple):
    """The window's pixels in the image, and its JPEG: None where the segments were not what the header says."""

    top: int
    left: int
    height: int
    width: int
    jpeg: np.ndarray | None


def splice_window(payload: np.ndarray, height: int, width: int, region: tuple[int, int, int, int],
                  exact_upsampling: bool, factor: int = 1) -> Window | None:
    """The window of restart segments holding ``region`` (top, bottom, left, right) of a JPEG with restart markers
    that tile it, for a decode at 1/``factor``, spliced into a JPEG of its own; None where the window is the whole
    image (decoded as it is)."""
    spliced = np.empty(payload.size, np.uint8)  # the size the decoders give it
    frame, frame_height, frame_width, _, length, top, left, window_height, window_width = splice_crop(
        payload, uint64_words(payload), height, width, *region, factor, exact_upsampling, spliced)
    assert frame >= 0 and (frame_height, frame_width) == (height, width)
    if window_height == 0:
        return None
    return Window(top, left, window_height, window_width, spliced[:length] if length >= 0 else None)
