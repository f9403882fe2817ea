"""RGBImageField: images stored raw or as JPEG, with their size, channels and mode in the data table.

Write modes:

* ``raw``: the pixels as they are (uint8, or uint16; 1, 3 or 4 channels): no decode cost, most bytes.
* ``jpg``: JPEG (1 or 3 channels, uint8). JPEG bytes given as input are **not re-encoded** when no resize is
  needed (no generation loss); restart markers are added to them losslessly (below).
* ``smart``: JPEG when the raw pixels would take more than ``smart_threshold`` bytes, raw otherwise (raw for
  every image without a threshold, as in FFCV).
* ``proportion``: JPEG with probability ``compress_probability``, drawn per sample from the writer's seeded
  generator (so the file does not depend on ``num_workers``).
* ``progressive``: progressive JPEG (libjpeg's default scan script: 10 scans for colour, 6 for grey) with
  every scan's end offset in the data table; decoders given ``fidelity=k`` read only the first k scans
  (Progressive Compressed Records, Kuchnik et al., VLDB 2021). Input JPEG bytes are decoded and re-encoded
  at ``jpeg_quality``: pip offers no lossless baseline-to-progressive transcoder, so this costs one
  generation of JPEG loss (about what a quality-90 re-encode loses). With ``scan_grouped=True`` the writer
  groups scans within each page (PCR's layout: every image's first scan, then every image's second scan, ...)
  so that fidelity k reads a prefix of each page, and the process cache reads only that prefix.
* ``balanced``: JPEG bytes are stored as they are, pixel arrays raw: the raw/JPEG mix is chosen by whoever
  builds the dataset, normally ``beton tune`` (:mod:`beton.tools.tune`), which picks the images whose raw storage saves
  the most decode time per extra byte; read it with ``OrderOption.BALANCED`` so every batch gets the same mix.
  JPEG bytes that need resizing (``max_resolution``) are stored raw.
* ``lossless``: exact pixels (uint8 or uint16; 1, 3 or 4 channels) in beton's tiled codec (:mod:`beton.codecs.lossless`):
  about PNG's size on photos, decoded several times faster, and crop decoders decode only the 64x64 tiles
  their crop touches.

``max_resolution`` shrinks any image whose longer side is larger, keeping its aspect ratio (INTER_AREA).

``restart_markers`` (on by default): every sequential JPEG the field stores, given or encoded, gets a restart
marker every few MCUs, added losslessly (:mod:`beton.codecs.jpeg_restarts`: the same coefficients, so the same
pixels, for a few percent more bytes), so that the crop decoders decode only the segments a crop touches
(:mod:`beton.decoders.jpeg_regions`). A given JPEG is first decoded strictly (at 1/8 scale), and one that
libjpeg-turbo decodes only with a warning (truncated, corrupt) is refused with an EncodeError. Off, given JPEG
bytes are stored byte for byte, unchecked.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import cv2
import numpy as np
import simplejpeg

from beton.errors import DecodeError, EncodeError, FieldError, first_bad_record
from beton.codecs.image_record import (
    BASE_RECORD,
    GROUPED_RECORD,
    IMAGE_MODES,
    JPEG_COLORSPACES,
    JPEG_MODES,
    MAX_SCANS,
    MODE_NAMES,
    PROGRESSIVE_RECORD,
    raw_view,
)
from beton.codecs.jpeg_restarts import compile_transcoder, encode_jpeg, strict_check, with_restart_markers
from beton.codecs.jpeg_scans import EOI, check_scan_tables, fidelity_bytes, jpeg_scan_ends, scan_pieces, whole_jpeg
from beton.codecs.lossless import decode_lossless, encode_lossless
from beton.decoders.rgb_image import CenterCropRGBImageDecoder, RandomResizedCropRGBImageDecoder, SimpleRGBImageDecoder
from beton.fields.base import Encoded, EncodeContext, Field, Pieces, answers_ffcv_encode
from beton.limits import MAX_IMAGE_PIXELS_VARIABLE, ReadLimits
from beton.pipeline.operation import Operation
from beton.transforms.torch_ops import ToTensor

# FFCV's import path ``ffcv.fields.rgb_image`` also holds its decoders.
__all__ = ["RGBImageField", "IMAGE_MODES", "WRITE_MODES", "decode_stored_image", "SimpleRGBImageDecoder",
           "RandomResizedCropRGBImageDecoder", "CenterCropRGBImageDecoder"]

#: A lossless plane of n pixels stores at least n / 16 bytes (a 4-bit width per group of 8), so no record can
#: decode to more than this many samples per stored byte.
_LOSSLESS_SAMPLES_PER_BYTE = 16
WRITE_MODES = ("raw", "jpg", "smart", "proportion", "progressive", "balanced", "lossless")
_DTYPES = {"uint8": np.dtype(np.uint8), "uint16": np.dtype("<u2")}
_JPEG_MAGIC = b"\xff\xd8"
_SAMPLING_FACTORS = {"444": cv2.IMWRITE_JPEG_SAMPLING_FACTOR_444, "422": cv2.IMWRITE_JPEG_SAMPLING_FACTOR_422,
                     "420": cv2.IMWRITE_JPEG_SAMPLING_FACTOR_420, "440": cv2.IMWRITE_JPEG_SAMPLING_FACTOR_440,
                     "411": cv2.IMWRITE_JPEG_SAMPLING_FACTOR_411}


@dataclasses.dataclass(frozen=True)
class RGBImageField(Field):
    """Images of any size; see the module docstring for the write modes.

    Args:
        write_mode: "raw", "jpg", "smart", "proportion", "progressive", "balanced" or "lossless".
        max_resolution: longer side limit in pixels (None keeps every image's size).
        smart_threshold: raw-size limit in bytes for "smart" (None: every image raw, as FFCV does).
        jpeg_quality: 1..100, for images this field encodes.
        compress_probability: chance of JPEG per sample for "proportion".
        channels: 3 (RGB, default), 1 (grayscale) or 4 (raw only).
        dtype: "uint8", or "uint16" (raw and lossless only).
        scan_grouped: "progressive" only: group scans within pages, so fidelity k reads a prefix of each page.
        restart_markers: add restart markers to the sequential JPEGs stored (lossless; see the module docstring).
    """

    write_mode: str = "raw"
    max_resolution: int | None = None
    smart_threshold: int | None = None  # FFCV's positional order: write_mode, max_resolution, smart_threshold,
    jpeg_quality: int = 90  # jpeg_quality, compress_probability
    compress_probability: float | None = 0.5  # None (FFCV scripts pass it): only "proportion" needs it
    channels: int = 3
    dtype: str = "uint8"
    scan_grouped: bool = False
    restart_markers: bool = True

    type_name = "beton.RGBImageField"
    has_payload = True

    @property
    def metadata_dtype(self) -> np.dtype:  # type: ignore[override]
        if self.write_mode != "progressive":
            return BASE_RECORD
        return GROUPED_RECORD if self.scan_grouped else PROGRESSIVE_RECORD

    def __post_init__(self) -> None:
        if self.write_mode not in WRITE_MODES:
            raise FieldError(f"write_mode must be one of {WRITE_MODES}, got {self.write_mode!r}")
        if self.dtype not in _DTYPES:
            raise FieldError(f"dtype must be one of {tuple(_DTYPES)}, got {self.dtype!r}")
        if self.channels not in (1, 3, 4):
            raise FieldError(f"channels must be 1, 3 or 4, got {self.channels}")
        if self.write_mode not in ("raw", "lossless") and (self.channels == 4 or self.dtype != "uint8"):
            raise FieldError("JPEG stores 1 or 3 channels of uint8: use write_mode='raw' or 'lossless' for "
                             f"{self.channels} channels of {self.dtype}")
        if not 1 <= self.jpeg_quality <= 100 or self.jpeg_quality != int(self.jpeg_quality):
            raise FieldError(f"jpeg_quality must be a whole number in 1..100, got {self.jpeg_quality}")
        object.__setattr__(self, "jpeg_quality", int(self.jpeg_quality))  # 90.0 from a config file is 90
        if self.max_resolution is not None and self.max_resolution < 1:
            raise FieldError(f"max_resolution must be positive, got {self.max_resolution}")
        if self.scan_grouped and self.write_mode != "progressive":
            raise FieldError("scan_grouped=True groups the scans of progressive JPEGs: it needs "
                             f"write_mode='progressive', got {self.write_mode!r}")
        if self.compress_probability is None:
            if self.write_mode == "proportion":
                raise FieldError("write_mode='proportion' needs a compress_probability in [0, 1], got None")
        elif not 0.0 <= self.compress_probability <= 1.0:
            raise FieldError(f"compress_probability must lie in [0, 1], got {self.compress_probability}")

    @property
    def numpy_dtype(self) -> np.dtype:
        return _DTYPES[self.dtype]

    def arguments(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    # ---- writing ------------------------------------------------------------------------------------------

    @answers_ffcv_encode
    def encode(self, value: Any, context: EncodeContext) -> Encoded:
        if isinstance(value, (bytes, bytearray, memoryview)) and bytes(value[:2]) == _JPEG_MAGIC:
            data = bytes(value)
            height, width, decodable, subsampling = _jpeg_header(data)
            wants_jpeg = self._choose_jpeg(height * width * self.channels, context, given_jpeg=True)
            keeps_size = self.max_resolution is None or max(height, width) <= self.max_resolution
            if wants_jpeg and keeps_size and decodable:  # stored as they are: no generation loss
                return Encoded((IMAGE_MODES["jpg"], self.channels, 0, height, width), self._stored_jpeg(data))
            pixels = self._resized(self._as_pixels(_decode_for_rewrite(data, self.channels)))
        else:
            pixels = self._resized(self._as_pixels(value))
            wants_jpeg = self._choose_jpeg(pixels.nbytes, context, given_jpeg=False)
            subsampling = "420"
        if self.write_mode == "progressive":
            return self._encode_progressive(pixels, subsampling)
        if self.write_mode == "lossless":
            return Encoded((IMAGE_MODES["lossless"], self.channels, 0, pixels.shape[0], pixels.shape[1]),
                           encode_lossless(pixels))
        if wants_jpeg:
            try:
                payload = encode_jpeg(pixels, self.jpeg_quality, self.restart_markers)
            except ValueError as error:
                raise EncodeError(str(error)) from None
            return Encoded((IMAGE_MODES["jpg"], self.channels, 0, pixels.shape[0], pixels.shape[1]), payload)
        return Encoded((IMAGE_MODES["raw"], self.channels, 0, pixels.shape[0], pixels.shape[1]), pixels.tobytes())

    # whether every JPEG given to encode() has passed strict_check already (a subclass that checks them itself)
    _given_jpegs_checked = False

    def prepare_encoding(self) -> None:
        if self.restart_markers:  # the transcoder is compiled once, here, rather than in every writer process
            compile_transcoder()

    def _stored_jpeg(self, jpeg: bytes) -> bytes:
        """A given JPEG as stored: checked to decode without a warning, then given restart markers (losslessly);
        with ``restart_markers=False``, byte for byte and unchecked (FFCV's way)."""
        if not self.restart_markers:
            return jpeg
        if not self._given_jpegs_checked:
            problem = strict_check(jpeg, JPEG_COLORSPACES[self.channels])
            if problem is not None:  # found anyway (the transcode needs the check): refused now, not in epoch 3
                raise EncodeError(f"JPEG is truncated or corrupt: {problem}")
        return with_restart_markers(jpeg, checked=True)

    def _encode_progressive(self, pixels: np.ndarray, subsampling: str) -> Encoded:
        """Progressive JPEG; a converted JPEG keeps its chroma subsampling (4:4:4 to 4:2:0 would cost ~20 dB)."""
        image = pixels[:, :, 0] if self.channels == 1 else cv2.cvtColor(pixels, cv2.COLOR_RGB2BGR)
        options = [cv2.IMWRITE_JPEG_QUALITY, self.jpeg_quality, cv2.IMWRITE_JPEG_PROGRESSIVE, 1]
        if self.channels == 3:
            options += [cv2.IMWRITE_JPEG_SAMPLING_FACTOR, _SAMPLING_FACTORS.get(subsampling, _SAMPLING_FACTORS["420"])]
        ok, encoded = cv2.imencode(".jpg", image, options)
        if not ok:
            raise EncodeError("OpenCV could not encode a progressive JPEG")
        payload = encoded.tobytes()
        ends = jpeg_scan_ends(payload)
        if not 1 <= len(ends) <= MAX_SCANS:
            raise EncodeError(f"progressive JPEG has {len(ends)} scans; at most {MAX_SCANS} are recorded")
        scan_ends = np.zeros(MAX_SCANS, np.uint32)
        scan_ends[: len(ends)] = ends
        metadata = (IMAGE_MODES["progressive"], self.channels, 0, pixels.shape[0], pixels.shape[1], len(ends),
                    (0, 0, 0), scan_ends)
        if self.scan_grouped:
            if payload[ends[-1] :] != EOI:  # only the end marker may follow the last scan: it is not stored
                raise EncodeError("progressive JPEG has data after its last scan; it cannot be scan-grouped")
            metadata += (np.zeros(MAX_SCANS, np.uint32),)  # scan_starts: filled in by the writer
        return Encoded(metadata, payload)

    def layout_pieces(self, metadata: np.void) -> list[int] | None:
        if not self.scan_grouped:
            return None
        return metadata["scan_ends"][: int(metadata["num_scans"])].tolist()

    def record_piece_starts(self, metadata: np.void, starts: list[int]) -> None:
        metadata["scan_starts"][: len(starts)] = starts

    def _as_pixels(self, value: Any) -> np.ndarray:
        if not isinstance(value, np.ndarray):
            value = _from_pil(value, self.channels)
        if value.dtype != self.numpy_dtype:
            raise EncodeError(f"expected a {self.dtype} image, got dtype {value.dtype}")
        if value.ndim == 2:
            value = value[:, :, None]
        if value.ndim != 3 or value.shape[0] == 0 or value.shape[1] == 0:
            raise EncodeError(f"expected an HxWxC image, got shape {value.shape}")
        if value.shape[2] == 1 and self.channels == 3:
            value = np.repeat(value, 3, axis=2)  # grayscale in an RGB field
        if value.shape[2] != self.channels:
            raise EncodeError(f"expected {self.channels} channels, got an image of shape {value.shape}")
        return np.ascontiguousarray(value)

    def _resized(self, pixels: np.ndarray) -> np.ndarray:
        height, width = pixels.shape[:2]
        if self.max_resolution is None or max(height, width) <= self.max_resolution:
            return pixels
        scale = self.max_resolution / max(height, width)
        size = (max(1, round(width * scale)), max(1, round(height * scale)))
        resized = cv2.resize(pixels, size, interpolation=cv2.INTER_AREA)
        return resized.reshape(size[1], size[0], self.channels)

    def _choose_jpeg(self, raw_size: int, context: EncodeContext, given_jpeg: bool) -> bool:
        """Whether this sample is stored as a (baseline) JPEG; decided once per sample (one random draw)."""
        if self.write_mode in ("raw", "progressive", "lossless"):  # progressive JPEGs: made by this field
            return False
        if self.write_mode == "balanced":
            return given_jpeg
        if self.write_mode == "smart":
            return self.smart_threshold is not None and raw_size > self.smart_threshold
        if self.write_mode == "proportion":
            return bool(context.rng().random() < self.compress_probability)
        return True

    # ---- reading ------------------------------------------------------------------------------------------

    def read_pieces(self, records: np.ndarray, setting: int | None) -> Pieces | None:
        if not self.scan_grouped:
            return None
        return scan_pieces(records, setting)

    def modes(self, records: np.ndarray) -> np.ndarray:
        return records["mode"]

    def default_pipeline(self) -> list[Operation]:
        return [SimpleRGBImageDecoder(), ToTensor()]

    def summary(self, records: np.ndarray) -> list[str]:
        """Image sizes and storage modes; for progressive JPEGs the bytes read at each fidelity."""
        heights, widths = records["height"].astype(np.int64), records["width"].astype(np.int64)
        longer = np.maximum(heights, widths)
        counts = np.histogram(longer, bins=[*_SIZE_BINS, np.iinfo(np.int64).max])[0]
        bins = [f"{low}-{high - 1}" for low, high in zip(_SIZE_BINS, _SIZE_BINS[1:])] + [f">={_SIZE_BINS[-1]}"]
        histogram = ", ".join(f"{label}: {count}" for label, count in zip(bins, counts) if count)
        modes = ", ".join(f"{np.mean(records['mode'] == number):.0%} {name}" for name, number in IMAGE_MODES.items()
                          if np.any(records["mode"] == number))
        lines = _fidelity_lines(records) if "scan_ends" in (records.dtype.names or ()) else []
        return lines + [
            f"images: height {int(heights.min())}..{int(heights.max())} (median {int(np.median(heights))}), "
            f"width {int(widths.min())}..{int(widths.max())} (median {int(np.median(widths))}), "
            f"stored as {modes}",
            f"longer side histogram: {histogram}",
        ]

    def to_python(self, metadata: np.void, payload: np.ndarray | None) -> np.ndarray:
        return decode_stored_image(metadata, payload, self.numpy_dtype)

    # ---- checking stored records --------------------------------------------------------------------------

    def stored_modes(self) -> tuple[int, ...]:
        """The modes a record of this field may have: those its writer produces and its decoders can read."""
        if self.write_mode == "progressive":
            return (IMAGE_MODES["progressive"],)
        if self.dtype != "uint8" or self.channels not in JPEG_COLORSPACES:  # JPEG: 1 or 3 channels of uint8
            return (IMAGE_MODES["raw"], IMAGE_MODES["lossless"])
        return (IMAGE_MODES["raw"], IMAGE_MODES["jpg"], IMAGE_MODES["lossless"])

    def check_records(self, records: np.ndarray, sizes: np.ndarray | None, limits: ReadLimits) -> None:
        """Reserved bytes zero; modes, channels and sizes against the field; pixels against the cap; raw and lossless payload sizes
        against the pixels; progressive scan tables against their payloads. Decoders size their buffers from
        these records (the Loader's from the field's channels), so each must hold before anything is decoded."""
        modes, channels = records["mode"], records["channels"]
        # zero in every record this version writes: anything else was written by something else
        first_bad_record(records["reserved"] != 0, lambda s: "image record's reserved bytes are not zero")
        if "reserved2" in records.dtype.names:
            first_bad_record((records["reserved2"] != 0).any(axis=1),
                             lambda s: "image record's reserved bytes are not zero")
        allowed = self.stored_modes()
        first_bad_record(~np.isin(modes, allowed), lambda s: (
            f"image mode {modes[s]} is not one this field stores ({', '.join(MODE_NAMES[m] for m in allowed)})"))
        first_bad_record(channels != self.channels, lambda s: (
            f"image has channels {channels[s]}, its field {self.channels}"))
        height, width = records["height"].astype(np.uint64), records["width"].astype(np.uint64)
        first_bad_record(height == 0, lambda s: "image has height 0")
        first_bad_record(width == 0, lambda s: "image has width 0")
        pixels = height * width  # both below 2^32: no overflow
        if limits.max_image_pixels is not None:
            first_bad_record(pixels > np.uint64(limits.max_image_pixels), lambda s: (
                f"image of {width[s]}x{height[s]} has {pixels[s]} pixels, more than max_image_pixels="
                f"{limits.max_image_pixels} (raise it with Reader(max_image_pixels=...) or "
                f"${MAX_IMAGE_PIXELS_VARIABLE} if you trust this file)"))
        if sizes is not None:
            self._check_payload_sizes(modes, pixels, sizes.astype(np.uint64))
        if self.write_mode == "progressive":
            check_scan_tables(records, sizes, self.scan_grouped)

    def _check_payload_sizes(self, modes: np.ndarray, pixels: np.ndarray, sizes: np.ndarray) -> None:
        samples = np.uint64(self.channels)
        # pixels > sizes first: it keeps the products below from overflowing for the records they matter to
        raw_bytes = pixels * samples * np.uint64(self.numpy_dtype.itemsize)
        first_bad_record((modes == IMAGE_MODES["raw"]) & ((pixels > sizes) | (raw_bytes != sizes)), lambda s: (
            f"raw image of {pixels[s]} pixels x {self.channels} channels needs {raw_bytes[s]} bytes, its payload "
            f"has {sizes[s]}"))
        budget = sizes * np.uint64(_LOSSLESS_SAMPLES_PER_BYTE)
        first_bad_record((modes == IMAGE_MODES["lossless"]) & ((pixels > budget) | (pixels * samples > budget)),
                         lambda s: f"lossless image of {pixels[s]} pixels cannot be stored in {sizes[s]} bytes")


_SIZE_BINS = (0, 64, 128, 256, 512, 1024, 2048, 4096)  # of an image's longer side, for beton info


def _fidelity_lines(records: np.ndarray) -> list[str]:
    """Mean bytes read per image at each progressive-JPEG fidelity, and the I/O saved against all scans."""
    full = fidelity_bytes(records, None).mean()
    lines = ["progressive fidelity (scans read: mean bytes per image, predicted I/O speed-up):"]
    for k in range(1, int(records["num_scans"].max()) + 1):
        read = fidelity_bytes(records, k).mean()
        lines.append(f"  {k:2d}: {read:10.1f} B  x{full / read:.2f}")
    return lines


def decode_stored_image(metadata: np.void, payload: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """One stored image at full size, HxWxC (a new array)."""
    height, width, channels = int(metadata["height"]), int(metadata["width"]), int(metadata["channels"])
    if metadata["mode"] == IMAGE_MODES["lossless"]:
        return decode_lossless(payload, height, width, channels, dtype=dtype)
    if metadata["mode"] not in JPEG_MODES:
        return np.array(raw_view(payload, height, width, channels, dtype))
    if channels not in JPEG_COLORSPACES:
        raise DecodeError(f"a JPEG has 1 or 3 channels, the record says {channels}")
    payload = whole_jpeg(payload, metadata)
    try:  # the header first: the record's size bounds the buffer, whatever size the JPEG claims
        decoded = simplejpeg.decode_jpeg_header(payload)[:2]
    except ValueError as error:
        raise DecodeError(f"JPEG cannot be decoded: {error}") from None
    if decoded != (height, width):
        raise DecodeError(f"JPEG is {decoded[1]}x{decoded[0]}, metadata says {width}x{height}")
    image = np.empty((height, width, channels), np.uint8)
    try:
        simplejpeg.decode_jpeg(payload, colorspace=JPEG_COLORSPACES[channels], buffer=image)
    except ValueError as error:
        raise DecodeError(f"JPEG cannot be decoded: {error}") from None
    return image



def _jpeg_header(data: bytes) -> tuple[int, int, bool, str]:
    """(height, width, whether libjpeg-turbo can give RGB/grey: not for CMYK/YCCK, chroma subsampling)."""
    try:
        height, width, colorspace, subsampling = simplejpeg.decode_jpeg_header(data)
    except ValueError as error:
        raise EncodeError(f"JPEG bytes cannot be read: {error}") from None
    return height, width, colorspace in ("Gray", "YCbCr", "RGB"), subsampling


def _from_pil(value: Any, channels: int) -> np.ndarray:
    """A PIL image's pixels; other modes converted to RGB, or RGBA for a 4-channel field. An alpha channel is
    never dropped silently: for a field without one it is an EncodeError saying how to drop or keep it."""
    modes = {"L": None, "RGB": None, "RGBA": None, "I;16": "<u2"}
    mode = getattr(value, "mode", None)
    if isinstance(value, (bytes, bytearray, memoryview)):
        raise EncodeError(f"expected an image (numpy array, PIL image or JPEG bytes), got {type(value).__name__} "
                          f"that {_not_jpeg(bytes(value[:16]))}: decode other formats first, e.g. "
                          "np.asarray(PIL.Image.open(io.BytesIO(data)).convert('RGB'))")
    if not isinstance(mode, str):  # a PIL image's mode is its name; a torch tensor's .mode is a method
        raise EncodeError(f"expected an image (numpy array, PIL image or JPEG bytes), got {type(value).__name__}")
    has_alpha = mode in ("RGBA", "LA", "La", "RGBa", "PA") or (mode == "P" and "transparency" in value.info)
    if has_alpha and channels != 4:
        raise EncodeError(f"a PIL image with an alpha channel (mode {mode}) for a field of {channels} channels: "
                          f"image.convert({'L' if channels == 1 else 'RGB'!r}) drops the alpha, "
                          "RGBImageField(channels=4, write_mode='raw' or 'lossless') keeps it")
    if mode not in modes:
        value = value.convert("RGBA" if has_alpha else "RGB")
    array = np.asarray(value)
    return array.astype(modes[value.mode]) if modes.get(value.mode) else array


#: the first bytes of image files that are not JPEGs, as bytes handed to a field often are
_OTHER_FORMATS = ((b"\x89PNG\r\n\x1a\n", "PNG"), (b"GIF87a", "GIF"), (b"GIF89a", "GIF"), (b"BM", "BMP"),
                  (b"II*\x00", "TIFF"), (b"MM\x00*", "TIFF"))


def _not_jpeg(head: bytes) -> str:
    """What bytes that do not start as a JPEG (FF D8) are, as far as their first bytes say."""
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "hold a WebP image, not a JPEG"
    if head[4:12] in (b"ftypavif", b"ftypheic", b"ftypheix", b"ftypmif1"):
        return "hold an AVIF or HEIF image, not a JPEG"
    known = next((name for magic, name in _OTHER_FORMATS if head.startswith(magic)), None)
    return f"hold a {known} image, not a JPEG" if known else f"do not start as a JPEG does (FF D8): {head[:8]!r}"


def _decode_for_rewrite(data: bytes, channels: int) -> np.ndarray:
    """Decode JPEG bytes that cannot be stored as they are (resize needed, raw mode, CMYK)."""
    try:
        return simplejpeg.decode_jpeg(data, colorspace=JPEG_COLORSPACES.get(channels, "RGB"))
    except ValueError:
        flag = cv2.IMREAD_GRAYSCALE if channels == 1 else cv2.IMREAD_COLOR
        image = cv2.imdecode(np.frombuffer(data, np.uint8), flag)  # handles CMYK/YCCK JPEGs
        if image is None:
            raise EncodeError("JPEG bytes cannot be decoded") from None
        return image if channels == 1 else cv2.cvtColor(image, cv2.COLOR_BGR2RGB)
