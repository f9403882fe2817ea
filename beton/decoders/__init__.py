"""Decoders: the first operation of a loader pipeline, reading one stored field into a batch.

:mod:`~beton.decoders.basic` decodes scalars, arrays, bytes and JSON; :mod:`~beton.decoders.ragged` decodes
variable-length arrays into bounded padded batches, and :mod:`~beton.decoders.boxes` bounding boxes that move
with their image; :mod:`~beton.decoders.rgb_image` decodes
images, with the crop geometry of :mod:`~beton.decoders.image_crops` and the partial JPEG decoding of
:mod:`~beton.decoders.jpeg_regions`. Decoders sit below the fields: a field names its default decoder
(:meth:`beton.fields.Field.default_pipeline`), so a decoder recognises the field it reads by the record it
stores, not by importing the field's class.
"""

from beton.decoders.basic import (
    BytesDecoder,
    FloatDecoder,
    IntDecoder,
    JSONDecoder,
    NDArrayDecoder,
    TorchTensorDecoder,
)
from beton.decoders.boxes import BoxesDecoder
from beton.decoders.ragged import RaggedDecoder
from beton.decoders.rgb_image import CenterCropRGBImageDecoder, RandomResizedCropRGBImageDecoder, SimpleRGBImageDecoder

__all__ = ["IntDecoder", "FloatDecoder", "NDArrayDecoder", "TorchTensorDecoder", "BytesDecoder", "JSONDecoder",
           "RaggedDecoder", "BoxesDecoder", "SimpleRGBImageDecoder", "RandomResizedCropRGBImageDecoder",
           "CenterCropRGBImageDecoder"]
