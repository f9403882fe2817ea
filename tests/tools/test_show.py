"""``beton show``: the grid shows the stored images, or the loader's first batch exactly, captioned with names."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

import beton
import beton.show
from beton.decoders import IntDecoder, RandomResizedCropRGBImageDecoder
from beton.fields import IntField, JSONField, RGBImageField
from beton.tools.sample_photos import photo_crop
from beton.tools.show import caption, fitted
from beton.transforms import NormalizeImage, RandomHorizontalFlip, ToTensor, ToTorchImage

from cli_runs import run_cli
from conftest import write

MEAN = [0.485 * 255, 0.456 * 255, 0.406 * 255]
STD = [0.229 * 255, 0.224 * 255, 0.225 * 255]
PIPELINES = {"image": [RandomResizedCropRGBImageDecoder((32, 32)), RandomHorizontalFlip(), NormalizeImage(MEAN, STD),
                       ToTensor(), ToTorchImage()]}


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    path = tmp_path_factory.mktemp("show") / "photos.beton"
    samples = [(photo_crop(i, 40 + i % 3 * 10, 50), i % 3, {"i": i}) for i in range(20)]
    return write(path, {"image": RGBImageField(write_mode="raw"), "label": IntField(), "meta": JSONField()}, samples,
                 metadata={"classes": {"label": ["astronaut", "cat", "café"]}})


def cell(picture, number, columns, height, width):
    """The image part of cell ``number`` of a grid whose images are height x width (see beton.tools.show)."""
    row, column = divmod(number, columns)
    top, left = 2 + row * (height + 14 + 2), 2 + column * (width + 2)
    return picture[top : top + height, left : left + width]


def test_stored_images_are_fitted_into_cells(photos, tmp_path):
    picture = beton.show.grid(photos, tmp_path / "g.png", count=7, columns=3, cell=48)
    assert picture.shape == (3 * (48 + 14 + 2) + 2, 3 * (48 + 2) + 2, 3)
    np.testing.assert_array_equal(cv2.cvtColor(cv2.imread(str(tmp_path / "g.png")), cv2.COLOR_BGR2RGB), picture)
    with beton.Reader(photos) as reader:
        for number in range(7):
            np.testing.assert_array_equal(cell(picture, number, 3, 48, 48), fitted(reader[number][0], 48))
    chosen = beton.show.grid(photos, count=2, columns=2, cell=48, indices=[5, 0])
    with beton.Reader(photos) as reader:
        np.testing.assert_array_equal(cell(chosen, 0, 2, 48, 48), fitted(reader[5][0], 48))


def test_the_loader_batch_is_shown_exactly_and_the_seed_decides_it(photos):
    picture = beton.show.grid(photos, count=8, columns=4, pipelines=PIPELINES, seed=3, epoch=1)
    again = beton.show.grid(photos, count=8, columns=4, pipelines=PIPELINES, seed=3, epoch=1, num_workers=2)
    other = beton.show.grid(photos, count=8, columns=4, pipelines=PIPELINES, seed=4, epoch=1)
    np.testing.assert_array_equal(picture, again)
    assert not np.array_equal(picture, other)
    with beton.Loader(photos, batch_size=8, order=beton.OrderOption.RANDOM, seed=3, num_workers=1,
                      pipelines={**PIPELINES, "label": [IntDecoder()], "meta": None}) as loader:
        loader.set_epoch(1)
        images, labels = next(iter(loader))
    pixels = (images.permute(0, 2, 3, 1).numpy().astype(np.float64) * STD + MEAN).clip(0, 255).round()
    for number in range(8):
        np.testing.assert_array_equal(cell(picture, number, 4, 32, 32), pixels[number].astype(np.uint8))


def test_captions_name_the_sample_and_its_class():
    classes = ["astronaut", "cat", "café"]
    assert caption(4, 1, classes) == "#4 cat" and caption(2, 2, classes) == "#2 café"
    assert caption(4, 7, classes) == "#4 label 7" and caption(4, 7, None) == "#4 label 7"
    assert caption(4, None, None) == "#4"


def test_captions_are_drawn_under_the_images(photos):
    labelled = beton.show.grid(photos, count=3, columns=3, cell=48)
    unlabelled = beton.show.grid(photos, count=3, columns=3, cell=48, label_field="meta")
    strip = slice(2 + 48, 2 + 48 + 14)
    assert (labelled[strip] > 100).any() and not np.array_equal(labelled[strip], unlabelled[strip])
    np.testing.assert_array_equal(labelled[:2 + 48], unlabelled[:2 + 48])


def test_the_command_writes_the_png_and_takes_the_users_pipelines(photos, tmp_path):
    done = run_cli("show", photos, "-o", tmp_path / "s.png", "--count", "4", "--cell", "40")
    assert done.returncode == 0, done.stderr
    assert cv2.imread(str(tmp_path / "s.png")).shape == (1 * (40 + 16) + 2, 4 * 42 + 2, 3)
    (tmp_path / "mine.py").write_text(
        "from beton.decoders import RandomResizedCropRGBImageDecoder\n"
        "from beton.transforms import ToTensor\n"
        "def pipelines():\n"
        "    return {'image': [RandomResizedCropRGBImageDecoder((24, 24)), ToTensor()]}\n")
    done = run_cli("show", photos, "-o", tmp_path / "p.png", "--count", "4",
                   "--pipeline", f"{tmp_path / 'mine.py'}:pipelines", "--seed", "1")
    assert done.returncode == 0, done.stderr
    picture = cv2.cvtColor(cv2.imread(str(tmp_path / "p.png")), cv2.COLOR_BGR2RGB)
    expected = beton.show.grid(photos, count=4, pipelines={"image": [RandomResizedCropRGBImageDecoder((24, 24)),
                                                                     ToTensor()]}, seed=1)
    np.testing.assert_array_equal(picture, expected)
    bad = run_cli("show", photos, "--pipeline", f"{tmp_path / 'mine.py'}:missing")
    assert bad.returncode == 1 and "has no 'missing'" in bad.stderr


def test_files_without_one_image_field_are_refused_plainly(tmp_path):
    path = write(tmp_path / "n.beton", {"label": IntField()}, [(1,), (2,)])
    with pytest.raises(beton.BetonError, match="image fields: none"):
        beton.show.grid(path)
    with pytest.raises(beton.PipelineError, match="drop the image field"):
        beton.show.grid(write(tmp_path / "i.beton", {"image": RGBImageField(), "label": IntField()},
                              [(photo_crop(0, 8, 8), 0)]), pipelines={"image": None})
