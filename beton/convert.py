"""Converters as Python calls, one beside each ``beton convert`` command (no subprocess needed in a notebook)::

    import beton.convert

    report = beton.convert.imagefolder("train/", "train.beton", max_resolution=256, on_error="skip")
    print(report.summary())
    beton.convert.numpy("arrays.npz", "arrays.beton")
    beton.convert.torch("tensors.pt", "tensors.beton")
    beton.convert.arrays({"x": x, "y": y}, "xy.beton")
    beton.convert.parquet("hf_dataset/", "hf.beton", columns=["image", "label"])
    beton.convert.webdataset("shards/train-{000..009}.tar", "train.beton", extensions=["jpg;png", "cls"])

The implementations live in :mod:`beton.tools.convert`.
"""

from beton.tools.convert import (
    ConversionError,
    ConversionReport,
    ConversionWarning,
    ImageOptions,
    SkippedSource,
    arrays,
    imagefolder,
    numpy_file as numpy,
    parquet,
    torch_file as torch,
    webdataset,
)

__all__ = ["imagefolder", "numpy", "torch", "arrays", "parquet", "webdataset", "ImageOptions", "ConversionReport",
           "ConversionError", "ConversionWarning", "SkippedSource"]
