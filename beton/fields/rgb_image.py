"""RGBImageField: images stored raw or as JPEG, with their size, channels and mode in the data table.

Write modes:

* ``raw``: the pixels as they are (uint8, or uint16; 1, 3 or 4 channels): no decode cost, most bytes.
* ``jpg``: JPEG (1 or 3 channels, uint8). JPEG bytes given as input are stored **as they are** when no
  resize is needed (no generation loss, fast conversion of folders of JPEGs).
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
  builds the dataset, normally ``beton tune`` (:mod:`beton.tune`), which picks the images whose raw storage saves
  the most decode time per extra byte; read it with ``OrderOption.BALANCED`` so every batch gets the same mix.
  JPEG bytes that need resizing (``max_resolution``) are stored raw.
* ``lossless``: exact pixels (uint8 or uint16; 1, 3 or 4 channels) in beton's tiled codec (:mod:`beton.fields.lossless_codec`):
  about PNG's size on photos, decoded several times faster, and crop decoders decode only the 64x64 tiles
  their crop touches.

``max_resolution`` shrinks any image whose longer side is larger, keeping its aspect ratio (INTER_AREA).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import cv2
import numpy as np
import simplejpeg

from beton.errors import DecodeError, EncodeError, FieldError
from beton.fields.base import Encoded, EncodeContext, Field, decoders_on_demand, first_bad_record
from beton.fields.lossless_codec import decode_lossless, encode_lossless
from beton.format import MAX_IMAGE_PIXELS_VARIABLE, ReadLimits

__all__ = ["RGBImageField", "IMAGE_MODES", "WRITE_MODES", "decode_stored_image"]

IMAGE_MODES = {"raw": 0, "jpg": 1, "progressive": 2, "lossless": 3}
_MODE_NAMES = {number: name for name, number in IMAGE_MODES.items()}
#: A lossless plane of n pixels stores at least n / 16 bytes (a 4-bit width per group of 8), so no record can
#: decode to more than this many samples per stored byte.
_LOSSLESS_SAMPLES_PER_BYTE = 16
WRITE_MODES = ("raw", "jpg", "smart", "proportion", "progressive", "balanced", "lossless")
JPEG_MODES = (IMAGE_MODES["jpg"], IMAGE_MODES["progressive"])
MAX_SCANS = 16
_BASE_METADATA = np.dtype([("mode", "u1"), ("channels", "u1"), ("reserved", "<u2"), ("height", "<u4"),
                           ("width", "<u4")])
#: Progressive JPEGs also record where each scan's data ends (bytes from the payload's start), so that a
#: decoder can read a prefix: the first k scans give a lower-fidelity image of the whole picture.
_PROGRESSIVE_METADATA = np.dtype(_BASE_METADATA.descr + [("num_scans", "u1"), ("reserved2", "u1", (3,)),
                                                         ("scan_ends", "<u4", (MAX_SCANS,))])
#: Scan-grouped pages also record where each scan's bytes start, relative to the allocation's offset.
_GROUPED_METADATA = np.dtype(_PROGRESSIVE_METADATA.descr + [("scan_starts", "<u4", (MAX_SCANS,))])
_DTYPES = {"uint8": np.dtype(np.uint8), "uint16": np.dtype("<u2")}
_JPEG_COLORSPACES = {1: "GRAY", 3: "RGB"}
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
        jpeg_quality: 1..100, for images this field encodes.
        smart_threshold: raw-size limit in bytes for "smart" (None: every image raw, as FFCV does).
        compress_probability: chance of JPEG per sample for "proportion".
        channels: 3 (RGB, default), 1 (grayscale) or 4 (raw only).
        dtype: "uint8", or "uint16" (raw and lossless only).
        scan_grouped: "progressive" only: group scans within pages, so fidelity k reads a prefix of each page.
    """

    write_mode: str = "raw"
    max_resolution: int | None = None
    jpeg_quality: int = 90
    smart_threshold: int | None = None
    compress_probability: float | None = 0.5  # None (FFCV scripts pass it): only "proportion" needs it
    channels: int = 3
    dtype: str = "uint8"
    scan_grouped: bool = False

    type_name = "beton.RGBImageField"
    has_payload = True

    @property
    def metadata_dtype(self) -> np.dtype:  # type: ignore[override]
        if self.write_mode != "progressive":
            return _BASE_METADATA
        return _GROUPED_METADATA if self.scan_grouped else _PROGRESSIVE_METADATA

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

    def encode(self, value: Any, context: EncodeContext) -> Encoded:
        if isinstance(value, (bytes, bytearray, memoryview)) and bytes(value[:2]) == _JPEG_MAGIC:
            data = bytes(value)
            height, width, decodable, subsampling = _jpeg_header(data)
            wants_jpeg = self._choose_jpeg(height * width * self.channels, context, given_jpeg=True)
            keeps_size = self.max_resolution is None or max(height, width) <= self.max_resolution
            if wants_jpeg and keeps_size and decodable:  # stored as they are: no generation loss
                return Encoded((IMAGE_MODES["jpg"], self.channels, 0, height, width), data)
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
            payload = simplejpeg.encode_jpeg(pixels, quality=self.jpeg_quality,
                                             colorspace=_JPEG_COLORSPACES[self.channels], colorsubsampling="420")
            return Encoded((IMAGE_MODES["jpg"], self.channels, 0, pixels.shape[0], pixels.shape[1]), payload)
        return Encoded((IMAGE_MODES["raw"], self.channels, 0, pixels.shape[0], pixels.shape[1]), pixels.tobytes())

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
            value = _from_pil(value)
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

    def to_python(self, metadata: np.void, payload: np.ndarray | None) -> np.ndarray:
        return decode_stored_image(metadata, payload, self.numpy_dtype)

    # ---- checking stored records --------------------------------------------------------------------------

    def stored_modes(self) -> tuple[int, ...]:
        """The modes a record of this field may have: those its writer produces and its decoders can read."""
        if self.write_mode == "progressive":
            return (IMAGE_MODES["progressive"],)
        if self.dtype != "uint8" or self.channels not in _JPEG_COLORSPACES:  # JPEG: 1 or 3 channels of uint8
            return (IMAGE_MODES["raw"], IMAGE_MODES["lossless"])
        return (IMAGE_MODES["raw"], IMAGE_MODES["jpg"], IMAGE_MODES["lossless"])

    def check_records(self, records: np.ndarray, sizes: np.ndarray | None, limits: ReadLimits) -> None:
        """Modes, channels and sizes against the field; pixels against the cap; raw and lossless payload sizes
        against the pixels; progressive scan tables against their payloads. Decoders size their buffers from
        these records (the Loader's from the field's channels), so each must hold before anything is decoded."""
        modes, channels = records["mode"], records["channels"]
        allowed = self.stored_modes()
        first_bad_record(~np.isin(modes, allowed), lambda s: (
            f"image mode {modes[s]} is not one this field stores ({', '.join(_MODE_NAMES[m] for m in allowed)})"))
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


def decode_stored_image(metadata: np.void, payload: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """One stored image at full size, HxWxC (a new array)."""
    height, width, channels = int(metadata["height"]), int(metadata["width"]), int(metadata["channels"])
    if metadata["mode"] == IMAGE_MODES["lossless"]:
        return decode_lossless(payload, height, width, channels, dtype=dtype)
    if metadata["mode"] not in JPEG_MODES:
        expected = height * width * channels * dtype.itemsize
        if payload.size != expected:
            raise DecodeError(f"raw image of {height}x{width}x{channels} needs {expected} bytes, got {payload.size}")
        return np.array(payload.view(dtype).reshape(height, width, channels))
    if channels not in _JPEG_COLORSPACES:
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
        simplejpeg.decode_jpeg(payload, colorspace=_JPEG_COLORSPACES[channels], buffer=image)
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


def _from_pil(value: Any) -> np.ndarray:
    modes = {"L": None, "RGB": None, "RGBA": None, "I;16": "<u2"}
    mode = getattr(value, "mode", None)
    if mode is None:
        raise EncodeError(f"expected an image (numpy array, PIL image or JPEG bytes), got {type(value).__name__}")
    if mode not in modes:
        value = value.convert("RGB")
    array = np.asarray(value)
    return array.astype(modes[value.mode]) if modes.get(value.mode) else array


def _decode_for_rewrite(data: bytes, channels: int) -> np.ndarray:
    """Decode JPEG bytes that cannot be stored as they are (resize needed, raw mode, CMYK)."""
    try:
        return simplejpeg.decode_jpeg(data, colorspace=_JPEG_COLORSPACES.get(channels, "RGB"))
    except ValueError:
        flag = cv2.IMREAD_GRAYSCALE if channels == 1 else cv2.IMREAD_COLOR
        image = cv2.imdecode(np.frombuffer(data, np.uint8), flag)  # handles CMYK/YCCK JPEGs
        if image is None:
            raise EncodeError("JPEG bytes cannot be decoded") from None
        return image if channels == 1 else cv2.cvtColor(image, cv2.COLOR_BGR2RGB)


EOI = b"\xff\xd9"  # end-of-image marker


def jpeg_scan_ends(data: bytes) -> list[int]:
    """Byte offset where each scan's entropy-coded data ends (the next marker's position), in order."""
    ends, position = [], 2  # after SOI
    while position + 4 <= len(data):
        if data[position] != 0xFF:
            raise EncodeError(f"JPEG marker expected at byte {position}")
        marker = data[position + 1]
        if marker == 0xD9:  # EOI
            break
        length = int.from_bytes(data[position + 2 : position + 4], "big")
        position += 2 + length
        if marker == 0xDA:  # SOS: entropy-coded data follows until a marker that is not a stuffed 0 or RSTn
            while position + 1 < len(data) and not (
                data[position] == 0xFF and data[position + 1] != 0 and not 0xD0 <= data[position + 1] <= 0xD7
            ):
                position += 1
            ends.append(position)
    return ends


def check_scan_tables(records: np.ndarray, sizes: np.ndarray | None, grouped: bool) -> None:
    """Progressive records: 1..16 scans, whose ends increase, inside the payload; scan-grouped ones also keep
    every scan's bytes inside the sample's allocation (the process cache reads pages from these numbers)."""
    counts = records["num_scans"].astype(np.int64)
    first_bad_record((counts < 1) | (counts > MAX_SCANS), lambda s: (
        f"progressive JPEG has {counts[s]} scans, expected 1..{MAX_SCANS}"))
    columns = int(counts.max(initial=0))  # scans past every record's count are not read: not checked
    ends = records["scan_ends"][:, :columns].astype(np.int64)
    used = np.arange(columns) < counts[:, None]
    lengths = ends.copy()
    np.subtract(ends[:, 1:], ends[:, :-1], out=lengths[:, 1:])
    first_bad_record(np.any(used & (lengths <= 0), axis=1), lambda s: (
        f"progressive JPEG scan ends {ends[s, :counts[s]].tolist()} do not increase"))
    if sizes is None:
        return
    sizes = sizes.astype(np.int64)
    if not grouped:
        last = ends[np.arange(len(ends)), counts - 1]
        first_bad_record(last > sizes, lambda s: (
            f"progressive JPEG's last scan ends at byte {last[s]}, its payload has {sizes[s]}"))
        return
    starts = records["scan_starts"][:, :columns].astype(np.int64)
    first_bad_record(np.any(used & (starts + lengths > sizes[:, None]), axis=1), lambda s: (
        f"scan-grouped JPEG scan starts {starts[s, :counts[s]].tolist()} and ends {ends[s, :counts[s]].tolist()} "
        f"reach past its {sizes[s]}-byte allocation"))


def scans_read(metadata: np.ndarray, limit: int | None) -> np.ndarray:
    """How many scans of each progressive JPEG (data-table records) a fidelity of ``limit`` reads (None: all)."""
    counts = metadata["num_scans"].astype(np.int64)
    return counts if limit is None else np.minimum(counts, limit)


def scan_bytes(metadata: np.ndarray, limit: int | None) -> np.ndarray:
    """Bytes of each progressive JPEG's first ``limit`` scans (None: all of them), from data-table records."""
    return metadata["scan_ends"][np.arange(len(metadata)), scans_read(metadata, limit) - 1].astype(np.int64)


def whole_jpeg(payload: np.ndarray, metadata: np.void) -> np.ndarray:
    """A stored JPEG's bytes, contiguous: the payload itself, or a scan-grouped JPEG's scans gathered into a
    new array with its end marker."""
    return progressive_prefix(payload, metadata, None, _new_buffer)


def _new_buffer(nbytes: int) -> np.ndarray:
    return np.empty(nbytes, np.uint8)


def progressive_prefix(payload: np.ndarray, metadata: np.void, fidelity: int | None, buffer: Any,
                       gathered: bool = False) -> np.ndarray:
    """The bytes a decoder reads for ``fidelity`` scans: the first scans plus an EOI marker.

    ``buffer(nbytes)`` gives a reusable uint8 array to assemble the prefix in. None, or a fidelity at or above
    the number of scans, reads the whole payload. Scan-grouped payloads (``payload`` spans the sample's scans,
    other samples' scans between them) are gathered scan by scan, unless the memory layer already did
    (``gathered``: the payload is then a plain JPEG of the first scans).
    """
    if fidelity is not None and fidelity < 1:
        raise DecodeError(f"fidelity must be at least 1, got {fidelity}")
    scans = int(metadata["num_scans"]) if metadata["mode"] == IMAGE_MODES["progressive"] else 0
    count = scans if fidelity is None else min(fidelity, scans)
    if scans and not gathered and "scan_starts" in metadata.dtype.names:
        return _gather_scans(payload, metadata, count, buffer)
    if count == 0 or int(metadata["scan_ends"][count - 1]) + len(EOI) >= payload.size:
        return payload  # no fewer scans than the payload holds
    end = int(metadata["scan_ends"][count - 1])
    prefix = buffer(end + len(EOI))
    prefix[:end] = payload[:end]
    prefix[end:] = np.frombuffer(EOI, np.uint8)
    return prefix


def _gather_scans(span: np.ndarray, metadata: np.void, count: int, buffer: Any) -> np.ndarray:
    ends = metadata["scan_ends"][:count].astype(np.int64)
    starts = metadata["scan_starts"][:count].astype(np.int64)
    lengths = np.diff(ends, prepend=0)
    if np.any(lengths < 0) or np.any(starts + lengths > span.size):
        raise DecodeError(f"scan-grouped JPEG: scan ends {ends.tolist()} / starts {starts.tolist()} do not fit "
                          f"its {span.size}-byte allocation")
    out = buffer(int(ends[-1]) + len(EOI))
    for start, length, end in zip(starts.tolist(), lengths.tolist(), ends.tolist()):
        out[end - length : end] = span[start : start + length]
    out[int(ends[-1]) :] = np.frombuffer(EOI, np.uint8)
    return out


# FFCV's import path ``ffcv.fields.rgb_image`` also holds its decoders.
__getattr__ = decoders_on_demand(
    __name__, ('SimpleRGBImageDecoder', 'RandomResizedCropRGBImageDecoder', 'CenterCropRGBImageDecoder'))
