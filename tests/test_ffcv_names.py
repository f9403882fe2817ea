"""Every FFCV import path listed in docs/migrating_from_ffcv.md resolves under the beton name."""

from __future__ import annotations

import importlib
import pathlib
import re

import pytest

DOC = pathlib.Path(__file__).resolve().parents[1] / "docs" / "migrating_from_ffcv.md"


def listed_names() -> list[tuple[str, str]]:
    text = DOC.read_text(encoding="utf-8")
    table = text[text.index("<!-- ffcv-names -->") : text.index("<!-- /ffcv-names -->")]
    pairs = []
    for module, names in re.findall(r"^\| `(ffcv[\w.]*)` \| (.+) \|$", table, re.MULTILINE):
        pairs += [(module, name) for name in re.findall(r"`(\w+)`", names)]
    return pairs


def test_the_table_lists_the_common_paths():
    modules = {module for module, _ in listed_names()}
    assert {"ffcv.loader", "ffcv.fields.decoders", "ffcv.transforms", "ffcv.pipeline.operation"} <= modules
    assert len(listed_names()) >= 75


@pytest.mark.parametrize(("module", "name"), listed_names(), ids=lambda value: value)
def test_ffcv_name_imports_from_beton(module, name):
    beton_module = importlib.import_module("beton" + module[len("ffcv"):])
    assert hasattr(beton_module, name), f"from {beton_module.__name__} import {name} fails"


def test_the_names_real_programs_import_are_what_ffcv_says():
    """Paths from FFCV's documentation examples and real projects, beyond the table's modules' main names."""
    import typing

    from beton.fields.basics import BasicDecoder, FloatDecoder, IntDecoder
    from beton.loader.loader import ORDER_TYPE, OrderOption
    from beton.pipeline.allocation_query import AllocationQuery as Query
    from beton.pipeline.operation import AllocationQuery
    from beton.traversal_order import Random, TraversalOrder

    assert AllocationQuery is Query
    assert issubclass(IntDecoder, BasicDecoder) and issubclass(FloatDecoder, BasicDecoder)
    allowed = typing.get_args(ORDER_TYPE)
    assert OrderOption in allowed and isinstance(Random, allowed) and isinstance(TraversalOrder, allowed)


# FFCV 1.0.2's parameters, in its order, of the classes programs build with positional or keyword arguments
FFCV_PARAMETERS = {
    "fields.RGBImageField": ["write_mode", "max_resolution", "smart_threshold", "jpeg_quality",
                             "compress_probability"],
    "fields.NDArrayField": ["dtype", "shape"],
    "fields.TorchTensorField": ["dtype", "shape"],
    "fields.decoders.RandomResizedCropRGBImageDecoder": ["output_size", "scale", "ratio"],
    "fields.decoders.CenterCropRGBImageDecoder": ["output_size", "ratio"],
    "loader.Loader": ["path", "batch_size", "num_workers", "os_cache", "order", "distributed", "seed", "indices",
                      "pipelines", "custom_fields", "drop_last", "batches_ahead"],  # FFCV names the first fname
    "writer.DatasetWriter": ["path", "fields", "page_size", "num_workers"],  # FFCV names the first fname
    "transforms.RandomBrightness": ["magnitude", "p"],
    "transforms.RandomContrast": ["magnitude", "p"],
    "transforms.RandomSaturation": ["magnitude", "p"],
    "transforms.Cutout": ["crop_size", "fill"],
    "transforms.RandomHorizontalFlip": ["flip_prob"],
    "transforms.ImageMixup": ["alpha", "same_lambda"],
    "transforms.LabelMixup": ["alpha", "same_lambda"],
    "transforms.MixupToOneHot": ["num_classes"],
    "transforms.ModuleWrapper": ["module"],
    "transforms.NormalizeImage": ["mean", "std", "type"],
    "transforms.ToDevice": ["device", "non_blocking"],
    "transforms.ToTorchImage": ["channels_last", "convert_back_int16"],
    "transforms.Convert": ["target_dtype"],
    "transforms.View": ["target_dtype"],
    "transforms.Poison": ["mask", "alpha", "indices", "clamp"],
    "transforms.RandomResizedCrop": ["scale", "ratio", "size"],
    "transforms.ReplaceLabel": ["indices", "new_label"],
    "transforms.RandomTranslate": ["padding", "fill"],
}


@pytest.mark.parametrize("path", sorted(FFCV_PARAMETERS))
def test_ffcv_classes_take_ffcv_s_arguments_in_ffcv_s_order(path):
    """A program passing FFCV's arguments by position or by name means the same under beton:
    RGBImageField("smart", 256, 100_000) is a smart threshold, not a JPEG quality."""
    import inspect

    module, name = path.rsplit(".", 1)
    parameters = list(inspect.signature(getattr(importlib.import_module("beton." + module), name)).parameters.values())
    expected = FFCV_PARAMETERS[path]
    assert [p.name for p in parameters[: len(expected)]] == expected
    assert all(p.kind is p.POSITIONAL_OR_KEYWORD for p in parameters[: len(expected)])


def test_ffcv_programs_keywords_build_the_operations_they_mean():
    import numpy as np
    import torch

    from beton.fields import RGBImageField
    from beton.transforms import Convert, NormalizeImage, ToTorchImage, View

    field = RGBImageField("smart", 256, 100_000, 85, 0.25)
    assert (field.smart_threshold, field.jpeg_quality, field.compress_probability) == (100_000, 85, 0.25)
    assert NormalizeImage([1.0, 2.0, 3.0], [4.0, 5.0, 6.0], type=np.float16).type is np.float16
    assert Convert(target_dtype=torch.float16).target_dtype is torch.float16
    assert View(target_dtype=torch.int16).target_dtype is torch.int16
    assert not ToTorchImage(channels_last=False, convert_back_int16=False).channels_last
