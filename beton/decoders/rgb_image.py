"""Image decoders: JPEG decoded at the smallest sufficient DCT scale, cropped and resized into the batch.

JPEG decoding runs in libjpeg-turbo through simplejpeg, which releases the GIL; numba cannot call it, so these
decoders are :class:`~beton.pipeline.operation.SampleOperation` s run by the worker threads.

Speed comes from not doing work: when the crop, shrunk by 1/2, 1/4 or 1/8, is still 1.25x the output size,
the JPEG is decoded at that scale in the DCT domain (most of the inverse DCT is skipped), and the remaining
resize is mostly below 2x, where bilinear interpolation is about as good as area averaging for much less work.
Decoding writes into a per-slot scratch buffer (a helping worker's own at the epoch's end) that grows only to
the largest *scaled* image seen, so memory is bounded by the batch, not by the largest image in the file.
Sequential JPEGs are decoded only in the restart segments a crop touches, or, without restart markers, down to
the crop's bottom edge (:mod:`beton.decoders.jpeg_regions`): the same pixels, fewer decoded.

``fast_upsample`` (on by default for RandomResizedCrop, off for CenterCrop) upsamples 4:2:0 chroma with
libjpeg-turbo's box filter instead of its triangle filter: cheaper, slightly less accurate, which augmented
training crops can afford and validation keeps off. The fast integer IDCT was measured too and left out (it
lost more quality than it saved). The measurements behind each choice (``benchmarks/image_quality.py``) are in
docs/images.md, "Decoding: crop decoders".
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any

import cv2
import numpy as np
import simplejpeg

from beton.codecs.image_record import IMAGE_MODES, JPEG_COLORSPACES, JPEG_MODES, raw_view
from beton.codecs.jpeg_scans import progressive_prefix, scans_to_read
from beton.codecs.lossless import decode_lossless_region
from beton.decoders.field_check import require_field
from beton.errors import DecodeError, PipelineError
from beton.decoders.image_crops import center_crop, random_resized_crop
from beton.decoders.jpeg_regions import decode_rows, decode_spliced, splice_crop, uint64_words
from beton.decoders.subpixel import shift_into
from beton.pipeline.operation import BatchContext, SampleOperation, Source, State

__all__ = ["SimpleRGBImageDecoder", "RandomResizedCropRGBImageDecoder", "CenterCropRGBImageDecoder",
           "choose_dct_factor", "resize_into", "single_threaded_opencv"]

_DCT_FACTORS = (8, 4, 2, 1)
# Above this remaining shrink, bilinear interpolation aliases and area averaging is worth its cost; below it,
# bilinear after a DCT-scaled decode matches or beats full decode + INTER_AREA against an antialiased float
# reference, for less work (benchmarks/image_quality.py; docs/images.md).
_AREA_ABOVE_SHRINK = 3.0
# Decode at 1/f only if the crop stays >= 1.25x the output: scaling the DCT right down to the output size
# lost quality on high-frequency photos at no measurable gain in speed (docs/images.md).
_DCT_MARGIN = 1.25


@functools.cache
def single_threaded_opencv() -> None:
    # The worker threads are the parallelism; OpenCV's own pool would oversubscribe the cores.
    cv2.setNumThreads(1)


def choose_dct_factor(crop_height: int, crop_width: int, out_height: int, out_width: int) -> int:
    """The largest factor in 8, 4, 2, 1 at which the crop is still 1.25x the output size or more."""
    for factor in _DCT_FACTORS:
        if crop_height >= _DCT_MARGIN * factor * out_height and crop_width >= _DCT_MARGIN * factor * out_width:
            return factor
    return 1


def _image_field(operation: Any, previous: Any) -> Any:
    return require_field(operation, previous, "beton.fields.rgb_image.RGBImageField").field


def resize_into(image: np.ndarray, out: np.ndarray, crop: tuple[float, float, float, float] | None = None,
                area_above: float = _AREA_ABOVE_SHRINK, scratch: Callable[..., np.ndarray] | None = None) -> None:
    """Resize the rectangle ``crop`` = (top, left, height, width) of HxWxC ``image`` (the whole image if None)
    into ``out``, with the decoders' filter choice: area averaging from a shrink of ``area_above``, bilinear
    below.

    The rectangle may have fractional bounds (a crop mapped onto a DCT-scaled decode, whose pixel j covers
    stored pixels [j f, j f + f)): output pixels then sample the places they map to, to a fraction of a pixel,
    instead of the rectangle being widened to whole pixels, which shifted and stretched crops by up to a scaled
    pixel (docs/images.md, "Where the crop lands"). The fraction is taken by a compiled bilinear shift at this
    resolution (:func:`~beton.decoders.subpixel.shift_into`; the rectangle then starts on a pixel), and the
    resize by exactly the rectangle's scale. ``scratch(nbytes, purpose)`` (a slot's
    :class:`~beton.pipeline.operation.Scratch`) holds the shifted pixels; without it they are allocated.
    """
    height, width = (image.shape[0], image.shape[1]) if crop is None else (crop[2], crop[3])
    top, left = (0, 0) if crop is None else (crop[0], crop[1])
    out_height, out_width = out.shape[:2]
    y0, x0 = math.floor(top), math.floor(left)
    target = out.reshape(out_height, out_width) if out.shape[2] == 1 else out
    interpolation = cv2.INTER_AREA if max(height / out_height, width / out_width) >= area_above else cv2.INTER_LINEAR
    if (y0, x0, height, width) == (top, left, math.floor(height), math.floor(width)):  # whole pixels
        region = image[y0 : y0 + int(height), x0 : x0 + int(width)]
        source = region.reshape(region.shape[0], region.shape[1]) if region.shape[2] == 1 else region
        result = cv2.resize(source, (out_width, out_height), dst=target, interpolation=interpolation)
        if result is not target and not np.shares_memory(result, target):  # OpenCV reallocated: copy back
            target[...] = result
        return
    # the whole-pixel hull, shifted by the fraction so that the rectangle starts on its first pixel
    shape = (math.ceil(top + height) - y0, math.ceil(left + width) - x0, image.shape[2])
    nbytes = shape[0] * shape[1] * shape[2] * image.dtype.itemsize
    shifted = np.empty(shape, image.dtype) if scratch is None else \
        scratch(nbytes, "subpixel shift").view(image.dtype).reshape(shape)
    shift_into(image, y0, x0, top - y0, left - x0, shifted)
    source = shifted.reshape(shape[0], shape[1]) if shape[2] == 1 else shifted
    # no dsize: OpenCV then steps through the source by exactly 1/fx, 1/fy and rounds the size it writes, which
    # is the output's unless the hull's extra fraction of a pixel rounds up to one more output pixel
    fx, fy = out_width / width, out_height / height
    if (round(shape[1] * fx), round(shape[0] * fy)) == (out_width, out_height):
        resized = cv2.resize(source, (0, 0), dst=target, fx=fx, fy=fy, interpolation=interpolation)
        if resized is target or np.shares_memory(resized, target):
            return
    else:
        resized = cv2.resize(source, (0, 0), fx=fx, fy=fy, interpolation=interpolation)
    target[...] = resized[:out_height, :out_width]


def _checked_output_size(value: Any) -> tuple[int, int]:
    """``value`` as (height, width), or a PipelineError: two whole numbers of at least 1."""
    size = tuple(value) if isinstance(value, (tuple, list, np.ndarray)) else None
    if size is None or len(size) != 2 or not all(isinstance(side, (int, np.integer)) and not isinstance(side, bool)
                                                 and side >= 1 for side in size):
        raise PipelineError(f"output_size must be (height, width) of positive integers (a square of side 64 is "
                            f"(64, 64)), got {value!r}")
    return int(size[0]), int(size[1])


def _output_size_settable(cls: type) -> type:
    """Let ``decoder.output_size = (h, w)`` through the frozen dataclass (FFCV's progressive resizing sets it
    before each epoch; the Loader notices at the next ``iter(loader)`` and plans again). Every other field stays
    frozen."""
    frozen_setattr = cls.__setattr__

    def __setattr__(self: Any, name: str, value: Any) -> None:
        if name != "output_size":
            frozen_setattr(self, name, value)
            return
        object.__setattr__(self, name, _checked_output_size(value))

    cls.__setattr__ = __setattr__
    return cls


class _ScanReader(SampleOperation):
    """An image decoder with a ``fidelity`` of its own: the progressive-JPEG scans it reads."""

    fidelity: int | None

    def payload_setting(self, fidelity: int | None) -> int | None:
        return scans_to_read(fidelity, self.fidelity)


class _CropDecoder(_ScanReader):
    """Shared machinery: find the crop, decode (scaled) or view raw pixels, resize into the batch."""

    is_decoder = True
    output_size: tuple[int, int]
    fast_upsample: bool
    decode_whole: bool

    def __post_init__(self) -> None:
        object.__setattr__(self, "output_size", _checked_output_size(self.output_size))

    def output_state(self, previous: Any) -> State:
        field = _image_field(self, previous)
        height, width = self.output_size
        return State((height, width, field.channels), field.numpy_dtype)

    def crop(self, key: np.uint64, sample: int, height: int, width: int) -> tuple[int, int, int, int]:
        raise NotImplementedError

    def apply(self, src: Source, dst: np.ndarray, i: int, sample: int, context: BatchContext) -> None:
        single_threaded_opencv()
        metadata = src.metadata[sample]
        height, width, channels = int(metadata["height"]), int(metadata["width"]), int(metadata["channels"])
        payload = src.memory[src.offsets[i] : src.offsets[i] + src.sizes[i]]
        crop = self.crop(context.key, sample, height, width)
        out = dst[i]
        if metadata["mode"] in JPEG_MODES:
            payload = progressive_prefix(payload, metadata, self.payload_setting(context.fidelity),
                                         lambda nbytes: context.scratch(nbytes, "prefix"), src.gathered)
            image, crop = self.decoded_crop(payload, (height, width, channels), crop, out.shape, context.scratch)
        elif metadata["mode"] == IMAGE_MODES["lossless"]:  # only the tiles the crop touches
            image, crop = decode_lossless_region(payload, height, width, channels, *crop, context.scratch,
                                                 out.dtype), None
        else:
            image = raw_view(payload, height, width, channels, out.dtype)
        resize_into(image, out, crop, scratch=context.scratch)

    def decoded_crop(self, payload: np.ndarray, shape: tuple[int, int, int], crop: tuple[int, int, int, int],
                     out_shape: tuple[int, ...], scratch: Callable[..., np.ndarray]
                     ) -> tuple[np.ndarray, tuple[float, float, float, float]]:
        """A JPEG decoded for a crop, before the resize: at the smallest sufficient DCT scale, only the restart
        segments the crop touches, or, without restart markers, the rows above its bottom (unless
        ``decode_whole``), with this decoder's settings; and the crop in its pixels.

        ``shape``: the stored image's (height, width, channels); ``crop``: (top, left, height, width) from
        :meth:`crop`; ``out_shape``: the output's shape; ``scratch(nbytes, purpose="default")``: reusable
        uint8 buffers (a slot's :class:`~beton.pipeline.operation.Scratch`). Returns the decoded pixels (a view
        into them) and the crop in their pixels, divided by the DCT factor and so possibly fractional: pass both
        to :func:`resize_into`. Public so that the benchmark suite times exactly this decode as the limit of
        beton's approach.
        """
        top, left, crop_height, crop_width = crop
        factor = choose_dct_factor(crop_height, crop_width, out_shape[0], out_shape[1])
        # a crop that starts between decoded pixels is shifted onto them, which reads the pixel past its hull
        region = None if self.decode_whole else (
            top - top % factor, top + crop_height + (factor if top % factor else 0),
            left - left % factor, left + crop_width + (factor if left % factor else 0))
        image, origin_top, origin_left = _decode_scaled(payload, shape, factor, self.fast_upsample, region, scratch)
        return image, ((top - origin_top) / factor, (left - origin_left) / factor, crop_height / factor,
                       crop_width / factor)


def _decode_scaled(payload: np.ndarray, shape: tuple[int, int, int], factor: int, fast_upsample: bool,
                   region: tuple[int, int, int, int] | None, scratch: Callable[..., np.ndarray]
                   ) -> tuple[np.ndarray, int, int]:
    """Decode at 1/``factor`` (DCT scaling) into the slot's scratch: the whole image, or with ``region`` (top,
    bottom, left, right in image pixels) as little more of it as the JPEG allows (see
    :mod:`beton.decoders.jpeg_regions`). Returns the decoded pixels and the image pixel at their top left corner
    (a multiple of ``factor``).

    Decoded pixel j covers the image's pixels [j factor, (j + 1) factor): libjpeg-turbo scales each 8x8 block
    to an (8 / factor)-pixel block, so the scale is exactly 1 / factor, edges included.
    """
    height, width, channels = shape
    options = {"colorspace": JPEG_COLORSPACES[channels], "min_factor": factor, "fastupsample": fast_upsample}
    try:
        frame, length = -1, -1
        if region is not None:
            spliced = scratch(payload.size, "window")
            frame, frame_height, frame_width, rows, length, top, left, window_height, window_width = splice_crop(
                payload, uint64_words(payload), height, width, *region, factor, not fast_upsample, spliced)
        if frame < 0:  # decoded whole
            frame_height, frame_width = simplejpeg.decode_jpeg_header(payload)[:2]
            rows = height
        # the JPEG's own size first: buffers are sized from the data table, which it must not contradict
        if (frame_height, frame_width) != (height, width):
            raise ValueError(f"the JPEG's frame is {frame_width}x{frame_height}, the data table says "
                             f"{width}x{height}")
        if length < 0:
            return _decode_rows(payload, frame, shape, factor, rows, options, scratch), 0, 0
        image = scratch(-(-window_height // factor) * -(-window_width // factor) * channels).reshape(
            -(-window_height // factor), -(-window_width // factor), channels)
        decode_spliced(spliced[:length], image, min_width=image.shape[1], **options)
        return image, top, left
    except ValueError as error:
        raise DecodeError(f"JPEG cannot be decoded: {error}") from None


def _decode_rows(payload: np.ndarray, frame: int, shape: tuple[int, int, int], factor: int, rows: int,
                 options: dict[str, Any], scratch: Callable[..., np.ndarray]) -> np.ndarray:
    """Decode at 1/``factor`` the image's top ``rows`` rows: all of them, or whole MCU rows of the sequential
    JPEG whose frame header is at ``frame``."""
    height, width, channels = shape
    # libjpeg-turbo scales by 1/factor to ceil(size / factor) (tested); no header parse needed to know it
    scaled_height, scaled_width = -(-height // factor), -(-width // factor)
    decoded_height = scaled_height if rows == height else rows // factor  # whole MCU rows: factor divides
    image = scratch(decoded_height * scaled_width * channels).reshape(decoded_height, scaled_width, channels)
    if rows == height:
        decoded = simplejpeg.decode_jpeg(payload, buffer=image, min_height=scaled_height, min_width=scaled_width,
                                         **options)
        if decoded.shape[:2] != image.shape[:2]:
            raise ValueError(f"decoded {decoded.shape[1]}x{decoded.shape[0]}, expected "
                             f"{scaled_width}x{scaled_height} (the data table says {width}x{height})")
    else:
        decode_rows(payload, frame, rows, lambda nbytes: scratch(nbytes, "rows"), image, min_width=scaled_width,
                    **options)
    return image


@_output_size_settable
@dataclasses.dataclass(frozen=True)
class RandomResizedCropRGBImageDecoder(_CropDecoder):
    """torchvision's RandomResizedCrop at decode time: area fraction in ``scale``, aspect ratio in ``ratio``."""

    output_size: tuple[int, int]
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    fidelity: int | None = None  # progressive JPEGs: scans to read (None: all)
    fast_upsample: bool = True  # JPEG chroma: box instead of triangle upsampling (see the module docstring)
    decode_whole: bool = False  # True: decode JPEGs below the crop too (checks all their data every epoch)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 < self.scale[0] <= self.scale[1] or not 0 < self.ratio[0] <= self.ratio[1]:
            raise PipelineError(f"scale and ratio must be increasing positive ranges, got {self.scale}, {self.ratio}")

    def crop(self, key: np.uint64, sample: int, height: int, width: int) -> tuple[int, int, int, int]:
        return random_resized_crop(key, sample, height, width, self.scale[0], self.scale[1],
                                   math.log(self.ratio[0]), math.log(self.ratio[1]))


@_output_size_settable
@dataclasses.dataclass(frozen=True)
class CenterCropRGBImageDecoder(_CropDecoder):
    """A centered square of ``ratio`` times the shorter side, resized to ``output_size`` (validation)."""

    output_size: tuple[int, int]
    ratio: float = 224 / 256
    fidelity: int | None = None  # progressive JPEGs: scans to read (None: all)
    fast_upsample: bool = False  # validation: the accurate decode by default
    decode_whole: bool = False  # True: decode JPEGs below the crop too (checks all their data every epoch)

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.ratio, bool) or not isinstance(self.ratio, (int, float, np.integer, np.floating)) \
                or not 0 < self.ratio <= 1:
            raise PipelineError(f"ratio is the crop's side over the image's shorter side: a number in (0, 1], got "
                                f"{self.ratio!r}")

    def crop(self, key: np.uint64, sample: int, height: int, width: int) -> tuple[int, int, int, int]:
        return center_crop(height, width, self.ratio)


@dataclasses.dataclass(frozen=True)
class SimpleRGBImageDecoder(_ScanReader):
    """Decode whole images; every image in the file (or the selected ones) must have the same size."""

    fidelity: int | None = None  # progressive JPEGs: scans to read (None: all)
    is_decoder = True

    def output_state(self, previous: Any) -> State:
        field = _image_field(self, previous)
        sizes = np.unique(np.stack([previous.metadata["height"], previous.metadata["width"]], axis=1), axis=0) \
            if previous.metadata is not None and len(previous.metadata) else np.zeros((0, 2), np.int64)
        if len(sizes) != 1:
            raise PipelineError(f"{self!r} needs images of one size; field {previous.field_name!r} has "
                                f"{len(sizes)} sizes: use RandomResizedCrop- or CenterCropRGBImageDecoder")
        height, width = (int(v) for v in sizes[0])
        return State((height, width, field.channels), field.numpy_dtype)

    def apply(self, src: Source, dst: np.ndarray, i: int, sample: int, context: BatchContext) -> None:
        metadata = src.metadata[sample]
        height, width, channels = int(metadata["height"]), int(metadata["width"]), int(metadata["channels"])
        payload = src.memory[src.offsets[i] : src.offsets[i] + src.sizes[i]]
        out = dst[i]
        if (height, width) != out.shape[:2]:
            raise DecodeError(f"image is {width}x{height}, expected {out.shape[1]}x{out.shape[0]}")
        if metadata["mode"] in JPEG_MODES:
            payload = progressive_prefix(payload, metadata, self.payload_setting(context.fidelity),
                                         lambda nbytes: context.scratch(nbytes, "prefix"), src.gathered)
            try:
                decoded = simplejpeg.decode_jpeg(payload, colorspace=JPEG_COLORSPACES[channels], buffer=out)
            except ValueError as error:
                raise DecodeError(f"JPEG cannot be decoded: {error}") from None
            if decoded.shape[:2] != (height, width):  # a smaller JPEG fills only the front of the slot's buffer
                raise DecodeError(f"JPEG is {decoded.shape[1]}x{decoded.shape[0]}, the data table says "
                                  f"{width}x{height}")
        elif metadata["mode"] == IMAGE_MODES["lossless"]:
            out[...] = decode_lossless_region(payload, height, width, channels, 0, 0, height, width, context.scratch,
                                              out.dtype)
        else:
            out[...] = raw_view(payload, height, width, channels, out.dtype)
