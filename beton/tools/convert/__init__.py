"""Converters: the data people have into .beton files, each beside a ``beton convert`` command.

========================  ==========================================  =====================================
function                  reads                                       module
========================  ==========================================  =====================================
:func:`imagefolder`       torchvision-style class folders of images   :mod:`~beton.tools.convert.imagefolder`
:func:`numpy_file`        ``.npy`` / ``.npz``                         :mod:`~beton.tools.convert.arrays`
:func:`torch_file`        ``.pt`` (tensors, dicts/lists of them)      :mod:`~beton.tools.convert.arrays`
:func:`arrays`            same-length arrays or tensors in memory     :mod:`~beton.tools.convert.arrays`
:func:`parquet`           Parquet files (Hugging Face datasets)       :mod:`~beton.tools.convert.parquet`
:func:`webdataset`        WebDataset tar shards                       :mod:`~beton.tools.convert.webdataset`
========================  ==========================================  =====================================

Each returns a :class:`ConversionReport` (samples written, sources skipped with the reason, notes, time) and
stores file-level metadata: where the samples came from, class names where the source has them
(``Reader(path).metadata["classes"]["label"]``) and the beton version. Images go through
:class:`~beton.tools.convert.images.ImageFileField`: formats sniffed from content, every stored JPEG checked to
decode, in the writer's worker processes. ``beton.convert`` is the public face of this package.
"""

from beton.tools.convert.arrays import arrays, fields_for_arrays, numpy_file, torch_file
from beton.tools.convert.imagefolder import ImageFolder, imagefolder
from beton.tools.convert.images import IMAGE_EXTENSIONS, ImageFileField, ImageOptions, sniff_image_format
from beton.tools.convert.parquet import parquet
from beton.tools.convert.report import ConversionError, ConversionReport, ConversionWarning, SkippedSource
from beton.tools.convert.webdataset import webdataset

__all__ = ["imagefolder", "numpy_file", "torch_file", "arrays", "parquet", "webdataset", "ImageOptions",
           "ImageFileField", "ImageFolder", "ConversionReport", "ConversionError", "ConversionWarning", "SkippedSource",
           "sniff_image_format", "IMAGE_EXTENSIONS", "fields_for_arrays"]
