"""The user's ``pipelines=``: its usual slips are PipelineErrors naming the argument and the fix."""

from __future__ import annotations

import numpy as np
import pytest

import beton
from beton.decoders import CenterCropRGBImageDecoder, IntDecoder, SimpleRGBImageDecoder
from beton.errors import BetonError, PipelineError
from beton.fields import IntField, RGBImageField
from beton.fields.rgb_image import RandomResizedCropRGBImageDecoder
from beton.loader.pipelines import check_pipelines
from beton.pipeline import PipelineSpec
from beton.transforms import RandomHorizontalFlip, ToTensor

from conftest import small_image, write


@pytest.fixture(scope="module")
def image_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("pipelines") / "images.beton"
    return write(path, {"image": RGBImageField(), "label": IntField()}, [(small_image(i), i) for i in range(8)])


def loader(path, pipelines):
    return beton.Loader(path, batch_size=4, num_workers=0, pipelines=pipelines)


def raised(path, pipelines) -> PipelineError:
    with pytest.raises(PipelineError) as caught:
        loader(path, pipelines)
    assert isinstance(caught.value, BetonError) and isinstance(caught.value, TypeError)
    return caught.value


@pytest.mark.parametrize("pipelines, message", [
    ({"label": [IntDecoder]}, "pipeline 'label': IntDecoder is a class; pass an instance: IntDecoder()"),
    ({"image": [SimpleRGBImageDecoder, ToTensor()]},
     "pipeline 'image': SimpleRGBImageDecoder is a class; pass an instance: SimpleRGBImageDecoder()"),
])
def test_a_decoder_class_instead_of_an_instance_is_named_with_the_fix(image_file, pipelines, message):
    assert str(raised(image_file, pipelines)) == message


@pytest.mark.parametrize("pipelines, message", [
    pytest.param([IntDecoder(), ToTensor()], "pipelines must be a dict field name -> list of operations (None drops "
                 "a field), got a list: name the field each list is for, as pipelines={'image': [...], "
                 "'label': [...]}", id="a list"),
    pytest.param({"label": IntDecoder()}, "pipeline 'label' must be a list of operations (or None to drop the "
                 "field), got an IntDecoder: write [IntDecoder()]", id="one operation"),
    pytest.param({"image": [RandomResizedCropRGBImageDecoder, ToTensor()]},
                 "pipeline 'image': RandomResizedCropRGBImageDecoder is a class; pass an instance: "
                 "RandomResizedCropRGBImageDecoder()", id="a class with required arguments"),
])
def test_a_pipelines_argument_of_the_wrong_shape_is_named_with_the_fix(image_file, pipelines, message):
    assert str(raised(image_file, pipelines)) == message


@pytest.mark.parametrize("pipelines, message", [
    ([IntDecoder()], "pipelines must be a dict field name -> list of operations (None drops a field), got a list: "
                     "name the field each list is for"),
    ((IntDecoder(),), "got a tuple: name the field each list is for"),
    ("label", "pipelines must be a dict field name -> list of operations (None drops a field), got a str"),
    ({0: [IntDecoder()]}, "pipelines must be keyed by field name, got the key 0 (an int)"),
    ({"label": IntDecoder()}, "pipeline 'label' must be a list of operations (or None to drop the field), got an "
                              "IntDecoder: write [IntDecoder()]"),
    ({"label": IntDecoder}, "got the class IntDecoder: write [IntDecoder()]"),
    ({"label": "int"}, "pipeline 'label' must be a list of operations (or None to drop the field), got a str"),
    ({"label": iter([IntDecoder()])}, "pipeline 'label' must be a list of operations (or None to drop the field), "
                                      "got a list_iterator"),
    ({"image": [RandomResizedCropRGBImageDecoder]},
     "pipeline 'image': RandomResizedCropRGBImageDecoder is a class; pass an instance: "
     "RandomResizedCropRGBImageDecoder()"),
])
def test_check_pipelines_names_each_slip(pipelines, message):
    with pytest.raises(PipelineError) as caught:
        check_pipelines(pipelines)
    assert message in str(caught.value)


def test_check_pipelines_accepts_what_the_loader_takes(image_file):
    for pipelines in (None, {}, {"label": None}, {"label": [IntDecoder(), ToTensor()]}, {"label": (IntDecoder(),)}):
        check_pipelines(pipelines)
    with loader(image_file, {"label": (IntDecoder(), ToTensor()), "image": None}) as ok:
        assert [batch[0].tolist() for batch in ok] == [[0, 1, 2, 3], [4, 5, 6, 7]]


# ---- several outputs of one field (FFCV's PipelineSpec), and FFCV's default decoder -------------------------------


def first_batch(path, pipelines, **options):
    with beton.Loader(path, batch_size=8, num_workers=2, seed=3, pipelines=pipelines, **options) as built:
        return dict(zip(built.plan.output_names, (output.numpy() for output in next(iter(built)))))


def test_a_pipeline_spec_gives_a_field_several_outputs_after_the_fields_own(image_file):
    """Self-supervised FFCV programs build two augmented views of one image so; they could not be ported."""
    crop = lambda: RandomResizedCropRGBImageDecoder((12, 12))  # noqa: E731
    views = first_batch(image_file, {
        "image": [crop(), ToTensor()],
        "second": PipelineSpec("image", crop(), [RandomHorizontalFlip(), ToTensor()]),
        "center": PipelineSpec("image", transforms=[CenterCropRGBImageDecoder((10, 10)), ToTensor()]),
        "plain": PipelineSpec("label")})
    assert list(views) == ["image", "label", "second", "center", "plain"]  # FFCV's order: fields, then the rest
    assert views["image"].shape == views["second"].shape == (8, 12, 12, 3)
    assert not np.array_equal(views["image"], views["second"])  # each output draws its own crop
    alone = first_batch(image_file, {"image": [CenterCropRGBImageDecoder((10, 10)), ToTensor()]})
    np.testing.assert_array_equal(views["center"], alone["image"])  # an output reads its field as the field's own
    np.testing.assert_array_equal(views["plain"], views["label"])  # no decoder, no transforms: the default pipeline
    np.testing.assert_array_equal(views["label"], np.arange(8))


def test_a_pipeline_that_does_not_start_with_a_decoder_gets_the_field_s_default_one(image_file):
    """FFCV's rule: its programs write [ToTensor(), Squeeze()] for a label."""
    given = first_batch(image_file, {"label": [ToTensor()], "image": [ToTensor()]})
    default = first_batch(image_file, {})
    assert given.keys() == default.keys()
    for name in given:
        np.testing.assert_array_equal(given[name], default[name])


def test_a_pipeline_spec_of_another_field_or_of_an_operation_is_refused(image_file):
    assert "fields the file does not have: ['labels']" in str(raised(image_file, {"y": PipelineSpec("labels")}))
    decoder = IntDecoder()
    message = str(raised(image_file, {"label": [decoder], "y": PipelineSpec(decoder, None, [ToTensor()])}))
    assert "source must name a field" in message and "branch" in message
