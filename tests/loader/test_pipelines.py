"""The user's ``pipelines=``: its usual slips are PipelineErrors naming the argument and the fix."""

from __future__ import annotations

import pytest

import beton
from beton.decoders import IntDecoder, SimpleRGBImageDecoder
from beton.errors import BetonError, PipelineError
from beton.fields import IntField, RGBImageField
from beton.fields.rgb_image import RandomResizedCropRGBImageDecoder
from beton.loader.pipelines import check_pipelines
from beton.transforms import ToTensor

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
