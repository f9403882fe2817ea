"""Bounding boxes that move with their image: crops and flips of another pipeline, repeated on the boxes.

Boxes are stored in a :class:`~beton.fields.RaggedArrayField` of float32 or float64 rows ``(x0, y0, x1, y1, ...)``
in coordinates normalised to the stored image (0..1 left to right and top to bottom), so that a
``max_resolution`` resize at write time leaves them right; columns after the fourth (a label, a score) travel
with their box untouched.

:class:`BoxesDecoder` follows the very operation instances of the image pipeline (``follow=(crop, flip)``): at
most one image decoder (RandomResizedCrop-, CenterCrop- or SimpleRGBImageDecoder), whose crop it computes again
from the same key, sample and stored image size, and any RandomHorizontalFlip / RandomVerticalFlip, whose draws
it repeats. Output boxes are normalised to the output image. A box is clipped to the crop; a box with nothing
left inside it is dropped (``drop_outside=True``, the boxes after it move up) or kept as ``(0, 0, 0, 0)`` so
that box i stays box i (to keep a separate labels field aligned). At most ``max_boxes`` boxes are kept, in
stored order.

Pixels and boxes agree to the decoder's resampling: a crop decoded at a reduced JPEG scale starts on that
scale's pixel grid, less than one output pixel from the computed crop.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

import numba
import numpy as np

from beton.decoders.field_check import is_field, require_field
from beton.decoders.image_crops import center_crop, flips, random_resized_crop
from beton.decoders.ragged import check_max_length
from beton.decoders.rgb_image import CenterCropRGBImageDecoder, RandomResizedCropRGBImageDecoder, SimpleRGBImageDecoder
from beton.errors import DecodeError, PipelineError
from beton.pipeline.memcopy import copy_bytes
from beton.pipeline.operation import JitOperation, Operation, State

__all__ = ["BoxesDecoder"]

_NO_CROP, _RANDOM_RESIZED_CROP, _CENTER_CROP = 0, 1, 2
_FLIPS = {"beton.transforms.flip.RandomHorizontalFlip": 0, "beton.transforms.flip.RandomVerticalFlip": 1}


@numba.njit(nogil=True, cache=True)
def _crop_box(key, sample, crop, heights, widths):
    """The crop as (x0, y0, x1, y1) normalised to the stored image."""
    kind, scale_low, scale_high, log_ratio_low, log_ratio_high, ratio = crop
    if kind == _NO_CROP:
        return 0.0, 0.0, 1.0, 1.0
    height, width = heights[sample], widths[sample]
    if kind == _RANDOM_RESIZED_CROP:
        top, left, crop_height, crop_width = random_resized_crop(key, sample, height, width, scale_low, scale_high,
                                                                 log_ratio_low, log_ratio_high)
    else:
        top, left, crop_height, crop_width = center_crop(height, width, ratio)
    return left / width, top / height, (left + crop_width) / width, (top + crop_height) / height


@numba.njit(nogil=True, cache=True)
def _transform(box, crop, flipped_x, flipped_y):
    """Clip ``box`` (its first four values, in place) to ``crop``, map it to the crop's frame and flip it;
    returns False when nothing of it lies inside the crop (NaN coordinates included)."""
    cx0, cy0, cx1, cy1 = crop
    x0, y0 = max(box[0], cx0), max(box[1], cy0)
    x1, y1 = min(box[2], cx1), min(box[3], cy1)
    if not (x1 > x0 and y1 > y0):
        return False
    x0, x1 = (x0 - cx0) / (cx1 - cx0), (x1 - cx0) / (cx1 - cx0)
    y0, y1 = (y0 - cy0) / (cy1 - cy0), (y1 - cy0) / (cy1 - cy0)
    if flipped_x:
        x0, x1 = 1.0 - x1, 1.0 - x0
    if flipped_y:
        y0, y1 = 1.0 - y1, 1.0 - y0
    box[0], box[1], box[2], box[3] = x0, y0, x1, y1
    return True


@numba.njit(nogil=True, cache=True)
def _boxes(values, memory, offset, size, length, row_bytes, columns, key, sample, crop, crop_key, heights, widths,
           flip_kinds, flip_probabilities, flip_keys, drop_outside, dtype_marker):
    if length < 0 or length * row_bytes != size:
        raise DecodeError("payload size does not match the stored length")
    area = _crop_box(key[crop_key] if crop_key >= 0 else np.uint64(0), sample, crop, heights, widths)
    flipped_x = flipped_y = False
    for f in range(len(flip_kinds)):
        if flips(key[flip_keys[f]], sample, flip_probabilities[f]):
            if flip_kinds[f] == 0:
                flipped_x = not flipped_x
            else:
                flipped_y = not flipped_y
    capacity = values.size // row_bytes
    rows = values.view(dtype_marker.dtype)
    kept = 0
    for j in range(length):
        if kept == capacity:
            break
        copy_bytes(values[kept * row_bytes : (kept + 1) * row_bytes], memory, offset + j * row_bytes, row_bytes)
        box = rows[kept * columns : (kept + 1) * columns]
        if _transform(box, area, flipped_x, flipped_y):
            kept += 1
        elif not drop_outside:
            box[0] = box[1] = box[2] = box[3] = 0.0
            kept += 1
    values[kept * row_bytes :] = 0
    return kept


@numba.njit(nogil=True, cache=True)
def _boxes_kernel(src, dst, i, sample, key, args):
    """``key``: the followed operations' keys (a uint64 array)."""
    (row_bytes, columns, crop, crop_key, heights, widths, flip_kinds, flip_probabilities, flip_keys, drop_outside,
     dtype_marker, _) = args
    length = np.int64(src[0][sample]["length"])
    dst[1][i] = _boxes(dst[0][i], src[1], np.int64(src[2][i]), np.int64(src[3][i]), length, row_bytes, columns,
                       key, sample, crop, crop_key, heights, widths, flip_kinds, flip_probabilities, flip_keys,
                       drop_outside, dtype_marker)


@numba.njit(nogil=True, cache=True)
def _unmoved_boxes_kernel(src, dst, i, sample, key, args):
    """Boxes that follow nothing: ``key`` is the decoder's own (a scalar), unused; clipped to the image only."""
    _boxes_kernel(src, dst, i, sample, args[-1], args)


@dataclasses.dataclass(frozen=True)
class BoxesDecoder(JitOperation):
    """RaggedArrayField of boxes ``(None, 4 + k)`` (float32/64, normalised x0, y0, x1, y1, then k extra columns) ->
    a Padded batch ``(batch, max_boxes, 4 + k)`` and box counts, moved as the image operations in ``follow``
    moved their image (see the module docstring)."""

    max_boxes: int
    follow: tuple[Operation, ...] = ()
    drop_outside: bool = True

    is_decoder: ClassVar[bool] = True

    def __post_init__(self) -> None:
        check_max_length(self, self.max_boxes)
        object.__setattr__(self, "follow", tuple(self.follow))
        crops = [op for op in self.follow if _is_crop_decoder(op)]
        others = [op for op in self.follow if not _is_crop_decoder(op) and _flip_kind(op) is None]
        if len(crops) > 1 or others:
            raise PipelineError(f"{self!r}: boxes follow at most one image decoder (RandomResizedCrop-, CenterCrop- "
                                "or SimpleRGBImageDecoder) and RandomHorizontalFlip / RandomVerticalFlip, got "
                                f"{crops[1:] + others}")

    def follows(self) -> tuple[Operation, ...]:
        return self.follow

    def output_state(self, previous: Any) -> State:
        field = require_field(self, previous, "beton.fields.ragged.RaggedArrayField").field
        if field.dtype not in (np.dtype("<f4"), np.dtype("<f8")) or len(field.row_shape) != 1 \
                or field.row_shape[0] < 4:
            raise PipelineError(f"{self!r} reads boxes stored as RaggedArrayField(float32 or float64, (None, 4 + k)), "
                                f"got {field.describe()}")
        images = {source.field_name for source in previous.followed}
        if len(images) > 1:
            raise PipelineError(f"{self!r}: the operations it follows sit in pipelines of different fields "
                                f"{sorted(images)}; boxes follow one image")
        return State((self.max_boxes, field.row_shape[0]), field.dtype, layout="padded")

    def kernel(self) -> Any:
        return _boxes_kernel if self.follow else _unmoved_boxes_kernel

    def kernel_arguments(self, previous: Any) -> tuple:
        field = previous.field
        crop, crop_key = (np.float64(_NO_CROP), 0.0, 0.0, 0.0, 0.0, 0.0), -1
        heights = widths = np.zeros(0, np.int64)
        flip_kinds, flip_probabilities, flip_keys = [], [], []
        for number, (operation, source) in enumerate(zip(self.follow, previous.followed)):
            if _is_crop_decoder(operation):
                crop, crop_key = _crop_arguments(operation), number
                heights = np.ascontiguousarray(source.metadata["height"], dtype=np.int64)
                widths = np.ascontiguousarray(source.metadata["width"], dtype=np.int64)
            else:
                flip_kinds.append(_flip_kind(operation))
                flip_probabilities.append(float(operation.flip_prob))
                flip_keys.append(number)
        return (np.int64(field.row_bytes), np.int64(field.row_shape[0]), tuple(np.float64(v) for v in crop),
                np.int64(crop_key), heights, widths, np.array(flip_kinds, np.int64),
                np.array(flip_probabilities, np.float64), np.array(flip_keys, np.int64), bool(self.drop_outside),
                np.zeros(0, field.dtype), np.zeros(1, np.uint64))


def _is_crop_decoder(operation: Any) -> bool:
    return isinstance(operation, (RandomResizedCropRGBImageDecoder, CenterCropRGBImageDecoder, SimpleRGBImageDecoder))


def _flip_kind(operation: Any) -> int | None:
    for path, kind in _FLIPS.items():
        if is_field(operation, path):  # the flips sit in a higher layer: known by class path
            return kind
    return None


def _crop_arguments(operation: Any) -> tuple[float, ...]:
    if isinstance(operation, RandomResizedCropRGBImageDecoder):
        return (_RANDOM_RESIZED_CROP, operation.scale[0], operation.scale[1], math.log(operation.ratio[0]),
                math.log(operation.ratio[1]), 0.0)
    if isinstance(operation, CenterCropRGBImageDecoder):
        return (_CENTER_CROP, 0.0, 0.0, 0.0, 0.0, operation.ratio)
    return (_NO_CROP, 0.0, 0.0, 0.0, 0.0, 0.0)
