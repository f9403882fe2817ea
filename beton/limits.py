"""What reading a file may cost: bounds a reader applies to values a file declares, before allocating anything.

Files are untrusted input: a record may claim any image size. The pixel cap bounds the decoded size of one
image; ``max_payload_bytes`` bounds what a field may declare its payload needs.
"""

from __future__ import annotations

import dataclasses
import os

__all__ = ["ReadLimits", "DEFAULT_MAX_IMAGE_PIXELS", "MAX_IMAGE_PIXELS_VARIABLE", "max_image_pixels_from_environment"]

#: Decoded pixels (height x width) a reader accepts per image unless told otherwise, as Pillow's
#: MAX_IMAGE_PIXELS: 11585 x 11585, 1 GiB at 4 channels of uint16. A file is refused on open when a record
#: claims more, before any buffer is allocated.
DEFAULT_MAX_IMAGE_PIXELS = 1 << 27
#: Environment variable that sets the cap for readers opened without ``max_image_pixels`` (the Loader, the
#: command line): a number of pixels, or "none" for no cap.
MAX_IMAGE_PIXELS_VARIABLE = "BETON_MAX_IMAGE_PIXELS"
@dataclasses.dataclass(frozen=True)
class ReadLimits:
    """What a reader accepts from a file beyond its own layout: bounds on what reading it may allocate.

    ``max_image_pixels``: decoded pixels per image (None: no cap). ``max_payload_bytes``: the largest payload a
    field may declare it needs (fields with a fixed payload size check their shape against it; the reader sets
    it to the file's size, since no payload can be larger).
    """

    max_image_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS
    max_payload_bytes: int | None = None


def max_image_pixels_from_environment() -> int | None:
    """The pixel cap ``$BETON_MAX_IMAGE_PIXELS`` sets, else :data:`DEFAULT_MAX_IMAGE_PIXELS`; "none" lifts it."""
    value = os.environ.get(MAX_IMAGE_PIXELS_VARIABLE, "").strip()
    if not value:
        return DEFAULT_MAX_IMAGE_PIXELS
    if value.lower() == "none":
        return None
    try:
        pixels = int(value)
    except ValueError:
        pixels = -1
    if pixels < 1:
        raise ValueError(f"${MAX_IMAGE_PIXELS_VARIABLE} must be a positive number of pixels or 'none', "
                         f"got {value!r}")
    return pixels


