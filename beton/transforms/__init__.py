"""Transforms: operations to put after a decoder in a pipeline.

Compiled (numba, fused, per sample, on numpy HxWxC uint8 images before ToTensor): RandomHorizontalFlip,
RandomVerticalFlip, Cutout, RandomErasing, RandomTranslate, RandomBrightness, RandomContrast,
RandomSaturation, RandomSolarization, NormalizeImage, ReplaceLabel, Poison. Per sample in Python (OpenCV):
RandomResizedCrop. Per batch: ImageMixup, LabelMixup, MixupToOneHot, and the torch operations ToTensor,
ToTorchImage, Squeeze, Convert, ViewAs (View), ToDevice, ModuleWrapper (and NormalizeImage on torch tensors,
e.g. on the GPU). Per batch on padded batches of variable-length samples: PadToLongest, Pack, PackRows.
"""

from beton.transforms.color import (
    RandomBrightness,
    RandomContrast,
    RandomSaturation,
    RandomSolarization,
    Solarization,
)
from beton.transforms.cutout import Cutout, RandomErasing
from beton.transforms.flip import RandomHorizontalFlip, RandomVerticalFlip
from beton.transforms.labels import ReplaceLabel
from beton.transforms.mixup import ImageMixup, LabelMixup, MixupToOneHot
from beton.transforms.normalize import NormalizeImage
from beton.transforms.poisoning import Poison
from beton.transforms.random_resized_crop import RandomResizedCrop
from beton.transforms.ragged import Pack, PackRows, PadToLongest
from beton.transforms.torch_ops import Convert, ModuleWrapper, Squeeze, ToDevice, ToTensor, ToTorchImage, View, ViewAs
from beton.transforms.translate import RandomTranslate

__all__ = [
    "ToTensor", "ToTorchImage", "Squeeze", "Convert", "ViewAs", "ToDevice", "ModuleWrapper",
    "RandomHorizontalFlip", "RandomVerticalFlip", "Cutout", "RandomErasing", "RandomTranslate",
    "RandomBrightness", "RandomContrast", "RandomSaturation", "RandomSolarization", "Solarization",
    "NormalizeImage", "ImageMixup", "LabelMixup", "ReplaceLabel", "PadToLongest", "Pack", "PackRows",
    # FFCV's names and transforms
    "View", "RandomResizedCrop", "Poison", "MixupToOneHot",
]
