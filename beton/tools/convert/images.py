"""Images as converters meet them: the bytes of a file in any common format, told apart by content.

:class:`ImageFileField` is the :class:`~beton.fields.RGBImageField` every converter writes with. Besides what
RGBImageField takes (pixel arrays, PIL images, JPEG bytes) it takes the bytes of an image file: the format is
sniffed from the first bytes (a PNG named ``.jpg`` is a PNG), and the work happens in the writer's worker
processes, where the field encodes:

* **The size comes first**: the header's width and height (:mod:`~beton.tools.convert.image_headers`, read with
  a few bounded ``struct`` reads; a header that cannot be parsed refuses the file) are checked against
  ``max_image_pixels`` before anything is decoded, so a small file declaring a huge image costs nothing.
* **JPEGs that may be stored as they are** (write modes jpg, smart, proportion, balanced and progressive,
  within ``max_resolution``) are checked by a complete decode at 1/8 scale: every byte of entropy-coded data is
  read, which is where truncation and corruption show (libjpeg-turbo's strict mode turns its warnings, such as
  "Premature end of JPEG file", into errors), at a fraction of a full-size decode's cost. A file that fails here
  would fail the training loader the same way, epochs later.
* **Other JPEGs and other formats** are decoded (JPEGs strictly, the rest by OpenCV, which refuses truncated
  PNG, WebP, TIFF, BMP and GIF data) and converted to the field's channels and depth.

Colour conversion: grey, palette, RGB, RGBA, CMYK and 16-bit inputs all become the field's layout (1, 3 or 4
channels of uint8 or uint16). Reductions are reported, never silent: an alpha channel dropped, 16-bit samples
reduced to 8 bits or a lossless file stored as a JPEG are reported with :func:`~beton.storage.writer.warn_sample`,
and the write report counts them (keep them with ``keep_alpha`` / ``keep_depth``, which store images
losslessly). 8-bit inputs in a 16-bit field are scaled
by 257 (255 becomes 65535). EXIF orientation is not applied, as torchvision's PIL loader does not apply it, so
stored JPEG bytes and decoded formats agree.

Files stay what they claim to be: ImageFileField is stored under RGBImageField's type name with the same
arguments, so a file written with it is byte for byte one written with RGBImageField, and reads back as one.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import cv2
import numpy as np
import simplejpeg

from beton.codecs.image_record import JPEG_COLORSPACES
from beton.codecs.jpeg_restarts import strict_check
from beton.errors import EncodeError, FieldError
from beton.fields.base import Encoded, EncodeContext
from beton.fields.rgb_image import WRITE_MODES, RGBImageField
from beton.limits import DEFAULT_MAX_IMAGE_PIXELS
from beton.storage.writer import warn_sample
from beton.tools.convert.image_headers import image_size

__all__ = ["ImageFileField", "ImageOptions", "sniff_image_format", "IMAGE_EXTENSIONS"]

#: File name extensions an image folder's images have (torchvision's list); the content decides the format.
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")

# (format, offset, magic bytes): the signatures of the formats OpenCV decodes.
_SIGNATURES = (
    ("JPEG", 0, b"\xff\xd8\xff"),
    ("PNG", 0, b"\x89PNG\r\n\x1a\n"),
    ("GIF", 0, b"GIF87a"),
    ("GIF", 0, b"GIF89a"),
    ("BMP", 0, b"BM"),
    ("WebP", 8, b"WEBP"),
    ("TIFF", 0, b"II*\x00"),
    ("TIFF", 0, b"MM\x00*"),
    ("JPEG 2000", 0, b"\x00\x00\x00\x0cjP  \r\n\x87\n"),
    ("JPEG 2000", 0, b"\xff\x4f\xff\x51"),
)
_PNM = {b"P1", b"P2", b"P3", b"P4", b"P5", b"P6"}
_JPEG_DECODABLE = ("Gray", "YCbCr", "RGB")  # libjpeg-turbo gives RGB/grey from these; CMYK/YCCK go through OpenCV
_KEEPS_JPEG = ("jpg", "smart", "proportion", "balanced")  # modes that store given JPEG bytes as they are
_ALPHA_DROPPED = "had an alpha channel, dropped (keep_alpha=True or --keep-alpha keeps it)"
_DEPTH_REDUCED = "had 16-bit samples, reduced to 8 bits (keep_depth=True or --keep-depth keeps them)"
_LOSSY = "came from a lossless file (PNG, BMP, TIFF, PNM), stored as a lossy JPEG (write_mode='lossless' or " \
    "--write-mode lossless keeps it exact)"
_LOSSLESS_FORMATS = ("PNG", "BMP", "TIFF", "PNM")
_ALWAYS_JPEG = ("jpg", "progressive")  # write modes that store every image as JPEG


def sniff_image_format(data: bytes) -> str | None:
    """The image format ``data`` starts with ("JPEG", "PNG", "GIF", "BMP", "WebP", "TIFF", "PNM", "JPEG 2000"),
    or None."""
    for name, offset, magic in _SIGNATURES:
        if data[offset : offset + len(magic)] == magic and (name != "WebP" or data[:4] == b"RIFF"):
            return name
    if data[:2] in _PNM and data[2:3].isspace():
        return "PNM"
    return None


@dataclasses.dataclass(frozen=True)
class ImageFileField(RGBImageField):
    """An RGBImageField that also takes image files' bytes; see the module docstring.

    ``max_image_pixels`` (not stored: it bounds the conversion, not the file) is the most pixels a file's header
    may declare; a file declaring more is refused before it is decoded. None lifts the cap.
    """

    max_image_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS

    _given_jpegs_checked = True  # prepare() lets JPEG bytes through only after strict_check

    def arguments(self) -> dict[str, Any]:
        arguments = super().arguments()
        del arguments["max_image_pixels"]  # the file stores RGBImageField's arguments, and only those
        return arguments

    def encode(self, value: Any, context: EncodeContext) -> Encoded:
        if isinstance(value, (bytes, bytearray, memoryview)):
            value = self.prepare(bytes(value))
        return super().encode(value, context)

    def describe(self) -> str:
        return super().describe().replace(type(self).__name__, RGBImageField.__name__, 1)  # what the file stores

    def prepare(self, data: bytes) -> bytes | np.ndarray:
        """JPEG bytes checked to decode (when the field may store them as they are), else the decoded pixels in
        the field's channels and depth; EncodeError saying why a file cannot be stored."""
        if not data:
            raise EncodeError("the file is empty")
        kind = sniff_image_format(data)
        if kind is None:
            raise EncodeError(f"not an image in a format beton reads (it starts with {data[:16]!r})")
        width, height = image_size(data, kind)  # from the header: nothing is decoded before the cap is checked
        if self.max_image_pixels is not None and width * height > self.max_image_pixels:
            raise EncodeError(f"{kind} header declares {width}x{height} pixels, more than max_image_pixels="
                              f"{self.max_image_pixels}; it is not decoded (raise max_image_pixels, "
                              "--max-image-pixels, to accept it)")
        if kind == "JPEG":
            return self._prepare_jpeg(data)
        pixels = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
        if pixels is None:
            raise EncodeError(f"{kind} data cannot be decoded (truncated or corrupt)")
        if kind in _LOSSLESS_FORMATS and self.write_mode in _ALWAYS_JPEG:
            warn_sample(_LOSSY)
        return self._converted(pixels, kind, bgr=True)

    def _prepare_jpeg(self, data: bytes) -> bytes | np.ndarray:
        try:
            height, width, colorspace, _ = simplejpeg.decode_jpeg_header(data)
        except ValueError as error:
            raise EncodeError(f"JPEG header cannot be read: {error}") from None
        self._check_pixels(height, width, "JPEG")
        if colorspace not in _JPEG_DECODABLE:  # CMYK or YCCK: OpenCV converts them to BGR
            pixels = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR | cv2.IMREAD_IGNORE_ORIENTATION)
            if pixels is None:
                raise EncodeError(f"{colorspace} JPEG cannot be decoded (truncated or corrupt)")
            return self._converted(pixels, "JPEG", bgr=True)
        if self._may_keep_jpeg(height, width):
            problem = strict_check(data, JPEG_COLORSPACES.get(self.channels, "RGB"))
            if problem is not None:
                raise EncodeError(f"JPEG is truncated or corrupt: {problem}")
            return data
        colorspace = "GRAY" if self.channels == 1 else "RGB"
        return self._converted(_decode_jpeg(data, colorspace), "JPEG", bgr=False)

    def _may_keep_jpeg(self, height: int, width: int) -> bool:
        """Whether the field may store these JPEG bytes (progressive mode: re-encodes them itself, keeping their
        chroma subsampling)."""
        if self.channels not in JPEG_COLORSPACES or self.dtype != "uint8":
            return False
        if self.write_mode == "progressive":
            return True
        fits = self.max_resolution is None or max(height, width) <= self.max_resolution
        return self.write_mode in _KEEPS_JPEG and fits

    def _check_pixels(self, height: int, width: int, kind: str) -> None:
        """Images that readers would refuse by default (beton.limits) are refused here, unless shrunk."""
        if self.max_resolution is None and height * width > DEFAULT_MAX_IMAGE_PIXELS:
            raise EncodeError(f"{kind} image of {width}x{height} has more than the {DEFAULT_MAX_IMAGE_PIXELS} "
                              "pixels readers accept by default; shrink it with max_resolution")

    def _converted(self, pixels: np.ndarray, kind: str, *, bgr: bool) -> np.ndarray:
        """Decoded pixels (OpenCV's BGR/BGRA order when ``bgr``) in the field's channels and depth."""
        if pixels.dtype not in (np.uint8, np.uint16):
            raise EncodeError(f"{kind} image has {pixels.dtype} samples; 8- and 16-bit images can be stored")
        self._check_pixels(pixels.shape[0], pixels.shape[1], kind)
        if pixels.ndim == 2:
            pixels = pixels[:, :, None]
        channels = pixels.shape[2]
        if channels not in (1, 3, 4):
            raise EncodeError(f"{kind} image has {channels} channels; 1, 3 or 4 can be stored")
        if bgr and channels > 1:
            pixels = cv2.cvtColor(pixels, cv2.COLOR_BGR2RGB if channels == 3 else cv2.COLOR_BGRA2RGBA)
        if channels == 4 and self.channels != 4:
            warn_sample(_ALPHA_DROPPED)
            pixels, channels = pixels[:, :, :3], 3
        if pixels.dtype == np.uint16 and self.dtype == "uint8":
            warn_sample(_DEPTH_REDUCED)
            pixels = ((pixels.astype(np.uint32) + 128) // 257).astype(np.uint8)  # rounded: 65535 -> 255
        elif pixels.dtype == np.uint8 and self.dtype == "uint16":
            pixels = pixels.astype(np.uint16) * np.uint16(257)  # 255 -> 65535
        return np.ascontiguousarray(_with_channels(pixels, channels, self.channels))


def _with_channels(pixels: np.ndarray, channels: int, target: int) -> np.ndarray:
    if channels == target:
        return pixels
    if target == 1:  # from RGB (alpha was dropped above)
        return cv2.cvtColor(pixels, cv2.COLOR_RGB2GRAY)[:, :, None]
    colour = np.repeat(pixels, 3, axis=2) if channels == 1 else pixels
    if target == 3:
        return colour
    opaque = np.full(pixels.shape[:2] + (1,), np.iinfo(pixels.dtype).max, pixels.dtype)
    return np.concatenate([colour, opaque], axis=2)


def _decode_jpeg(data: bytes, colorspace: str) -> np.ndarray:
    try:
        return simplejpeg.decode_jpeg(data, colorspace=colorspace)  # strict: libjpeg warnings raise
    except ValueError as error:
        raise EncodeError(f"JPEG is truncated or corrupt: {error}") from None


@dataclasses.dataclass(frozen=True)
class ImageOptions:
    """How converters store images; every converter taking images takes these as keyword arguments.

    Args:
        write_mode: an RGBImageField write mode; default "jpg" (JPEG files stored as they are, other formats
            encoded at ``jpeg_quality``), or "lossless" with ``keep_alpha``/``keep_depth``.
        max_resolution: shrink images whose longer side is larger (JPEG files within it are kept as they are).
        jpeg_quality: 1..100, for images the field encodes.
        smart_threshold: write_mode "smart": images whose raw pixels take more bytes are stored as JPEG.
        compress_probability: write_mode "proportion": chance of JPEG per image.
        channels: 3 (RGB) or 1 (grey); images are converted to it.
        keep_alpha: store 4 channels (RGBA; opaque alpha for images without one) instead of dropping alpha.
        keep_depth: store 16 bits per sample instead of reducing 16-bit images to 8 (8-bit ones are scaled).
        max_image_pixels: the most pixels (width x height) an image file's header may declare; a file declaring
            more is refused before it is decoded (default: the readers' cap, 2^27; None: no cap).
        restart_markers: add restart markers to the JPEGs stored, losslessly (RGBImageField's option; False
            stores JPEG files byte for byte).
    """

    write_mode: str | None = None
    max_resolution: int | None = None
    jpeg_quality: int = 90
    smart_threshold: int | None = None
    compress_probability: float = 0.5
    channels: int = 3
    keep_alpha: bool = False
    keep_depth: bool = False
    max_image_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS
    restart_markers: bool = True

    def field(self) -> ImageFileField:
        """The field these options describe; FieldError for options that do not go together."""
        if self.channels not in (1, 3):
            raise FieldError(f"channels must be 1 (grey) or 3 (RGB), got {self.channels}")
        if self.max_image_pixels is not None and (isinstance(self.max_image_pixels, bool) or
                                                  not isinstance(self.max_image_pixels, int) or
                                                  self.max_image_pixels < 1):
            raise FieldError(f"max_image_pixels must be a positive number of pixels or None, got "
                             f"{self.max_image_pixels!r}")
        if self.keep_alpha and self.channels == 1:
            raise FieldError("keep_alpha stores RGBA images: it needs channels=3")
        exact = self.keep_alpha or self.keep_depth
        write_mode = self.write_mode or ("lossless" if exact else "jpg")
        if write_mode not in WRITE_MODES:
            raise FieldError(f"write_mode must be one of {WRITE_MODES}, got {write_mode!r}")
        if exact and write_mode not in ("lossless", "raw"):
            raise FieldError("keep_alpha and keep_depth store images exactly: write_mode must be 'lossless' or "
                             f"'raw', got {write_mode!r}")
        if write_mode == "smart" and self.smart_threshold is None:
            raise FieldError("write_mode 'smart' stores images whose raw size exceeds smart_threshold bytes as JPEG: "
                             "give smart_threshold")
        return ImageFileField(write_mode=write_mode, max_resolution=self.max_resolution,
                              jpeg_quality=self.jpeg_quality, smart_threshold=self.smart_threshold,
                              compress_probability=self.compress_probability,
                              channels=4 if self.keep_alpha else self.channels,
                              dtype="uint16" if self.keep_depth else "uint8",
                              max_image_pixels=self.max_image_pixels, restart_markers=self.restart_markers)
