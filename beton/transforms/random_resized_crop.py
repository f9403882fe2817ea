"""RandomResizedCrop on decoded images (FFCV's ``ffcv.transforms.RandomResizedCrop``).

For images stored in the file, :class:`~beton.decoders.basic.RandomResizedCropRGBImageDecoder` makes the same
crops while decoding only the rows and the DCT scale each crop needs: prefer it. This operation serves images
that are already arrays (an NDArrayField, or after another transform).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from beton.decoders.image_crops import random_resized_crop
from beton.decoders.rgb_image import resize_into, single_threaded_opencv
from beton.pipeline.operation import BatchContext, SampleOperation, State
from beton.transforms._image import require_uint8_images

__all__ = ["RandomResizedCrop"]


@dataclasses.dataclass(frozen=True)
class RandomResizedCrop(SampleOperation):
    """torchvision's RandomResizedCrop on HxWxC uint8 images: a crop of area fraction in ``scale`` and aspect
    ratio (w/h) in ``ratio``, resized to ``size`` (an int for a square, or (height, width)). Crops are drawn from
    the keyed generator: the same for any number of workers."""

    scale: tuple[float, float]
    ratio: tuple[float, float]
    size: int | tuple[int, int]

    def __post_init__(self) -> None:
        if not 0 < self.scale[0] <= self.scale[1] or not 0 < self.ratio[0] <= self.ratio[1]:
            raise ValueError(f"scale and ratio must be increasing positive ranges, got {self.scale}, {self.ratio}")

    @property
    def output_size(self) -> tuple[int, int]:
        return (self.size, self.size) if isinstance(self.size, int) else (int(self.size[0]), int(self.size[1]))

    def output_state(self, previous: Any) -> State:
        state = require_uint8_images(self, previous)
        return dataclasses.replace(state, shape=(*self.output_size, state.shape[2]))

    def apply(self, src: np.ndarray, dst: np.ndarray, i: int, sample: int, context: BatchContext) -> None:
        single_threaded_opencv()
        image = src[i]
        top, left, height, width = random_resized_crop(
            context.key, sample, image.shape[0], image.shape[1], self.scale[0], self.scale[1],
            math.log(self.ratio[0]), math.log(self.ratio[1]))
        resize_into(image[top : top + height, left : left + width], dst[i])
