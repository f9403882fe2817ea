"""The data-table record of a stored image: how it is stored (mode), its size and channels, its JPEG scans.

Shared by :class:`beton.fields.RGBImageField` (which writes and validates records) and the image decoders
(which read them); FFCV files' image records are converted to this layout on open.
"""

from __future__ import annotations

import numpy as np

from beton.errors import DecodeError

__all__ = ["IMAGE_MODES", "MODE_NAMES", "JPEG_MODES", "MAX_SCANS", "BASE_RECORD", "PROGRESSIVE_RECORD",
           "GROUPED_RECORD", "JPEG_COLORSPACES", "raw_view"]

IMAGE_MODES = {"raw": 0, "jpg": 1, "progressive": 2, "lossless": 3}
MODE_NAMES = {number: name for name, number in IMAGE_MODES.items()}
JPEG_MODES = (IMAGE_MODES["jpg"], IMAGE_MODES["progressive"])
MAX_SCANS = 16
BASE_RECORD = np.dtype([("mode", "u1"), ("channels", "u1"), ("reserved", "<u2"), ("height", "<u4"),
                        ("width", "<u4")])
#: Progressive JPEGs also record where each scan's data ends (bytes from the payload's start), so that a
#: decoder can read a prefix: the first k scans give a lower-fidelity image of the whole picture.
PROGRESSIVE_RECORD = np.dtype(BASE_RECORD.descr + [("num_scans", "u1"), ("reserved2", "u1", (3,)),
                                                   ("scan_ends", "<u4", (MAX_SCANS,))])
#: Scan-grouped pages also record where each scan's bytes start, relative to the allocation's offset.
GROUPED_RECORD = np.dtype(PROGRESSIVE_RECORD.descr + [("scan_starts", "<u4", (MAX_SCANS,))])
#: libjpeg-turbo's output colourspace for an image of this many channels (JPEGs hold 1 or 3).
JPEG_COLORSPACES = {1: "GRAY", 3: "RGB"}


def raw_view(payload: np.ndarray, height: int, width: int, channels: int, dtype: np.dtype) -> np.ndarray:
    """A raw payload as a height x width x channels image (a view); DecodeError when its size does not match."""
    expected = height * width * channels * dtype.itemsize
    if payload.size != expected:
        raise DecodeError(f"raw image of {height}x{width}x{channels} needs {expected} bytes, got {payload.size}")
    return payload.view(dtype).reshape(height, width, channels)
