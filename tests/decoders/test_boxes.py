"""Boxes move with their image: a box drawn into each image is found again, after the crop and the flips, where
the boxes decoder says it is."""

from __future__ import annotations

import numpy as np
import pytest

from beton import Loader
from beton.decoders import (BoxesDecoder, CenterCropRGBImageDecoder, RaggedDecoder, RandomResizedCropRGBImageDecoder,
                            SimpleRGBImageDecoder)
from beton.errors import PipelineError
from beton.fields import IntField, RaggedArrayField, RGBImageField
from beton.transforms import NormalizeImage, RandomHorizontalFlip, RandomVerticalFlip

from conftest import write

OUT = 64


def drawn(i: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """An image of a random size with one white box on black, its box (normalised, with a label column), a
    second box far outside any crop's reach is not needed: crops may drop the first."""
    height, width = (int(v) for v in rng.integers(80, 200, 2))
    image = np.zeros((height, width, 3), np.uint8)
    y0, x0 = int(rng.integers(0, height - 20)), int(rng.integers(0, width - 20))
    y1, x1 = y0 + int(rng.integers(15, min(80, height - y0) + 1)), x0 + int(rng.integers(15, min(80, width - x0) + 1))
    image[y0:y1, x0:x1] = 255
    boxes = np.array([[x0 / width, y0 / height, x1 / width, y1 / height, i % 5]], np.float32)
    return image, boxes, np.array([i % 5], np.int64), i


@pytest.fixture(scope="module", params=["raw", "jpg"])
def boxes_file(request, tmp_path_factory):
    rng = np.random.default_rng(0)
    samples = [drawn(i, rng) for i in range(48)]
    return write(tmp_path_factory.mktemp(f"boxes_{request.param}") / "b.beton",
                 {"image": RGBImageField(write_mode=request.param, jpeg_quality=95),
                  "boxes": RaggedArrayField(np.float32, (None, 5)),
                  "labels": RaggedArrayField(np.int64, (None,)), "index": IntField()}, samples), request.param


def white_box(image: np.ndarray) -> tuple[float, float, float, float] | None:
    ys, xs = np.nonzero(image[..., 0] > 127)
    return None if len(xs) == 0 else (xs.min(), ys.min(), xs.max() + 1, ys.max() + 1)


def check_found(images, boxes, lengths, indices, tolerance):
    moved = 0
    for image, rows, length, index in zip(images, boxes, lengths, indices.tolist()):
        found, box = white_box(image), rows[0]
        if length == 0:  # dropped: nothing of the box in the crop, or a sliver that resampling erased
            assert found is None or (found[2] - found[0]) * (found[3] - found[1]) <= 2 * tolerance * OUT
            continue
        assert length == 1 and box[4] == index % 5  # the label column travels with its box
        assert found is not None, f"sample {index}: box {box[:4] * OUT} but no white pixels"
        np.testing.assert_allclose(box[:4] * OUT, found, atol=tolerance, err_msg=f"sample {index}")
        moved += 1
    return moved


@pytest.mark.parametrize("num_workers", [0, 2])
def test_boxes_follow_random_resized_crop_and_both_flips(boxes_file, num_workers):
    path, mode = boxes_file
    crop = RandomResizedCropRGBImageDecoder((OUT, OUT), scale=(0.25, 1.0))
    horizontal, vertical = RandomHorizontalFlip(), RandomVerticalFlip(0.3)
    pipelines = {"image": [crop, horizontal, vertical],
                 "boxes": [BoxesDecoder(4, follow=(crop, horizontal, vertical))], "labels": None}
    tolerance = 1.01 if mode == "raw" else 2.0  # JPEG: ringing, and reduced-scale decoding's pixel grid
    moved = 0
    with Loader(path, batch_size=16, num_workers=num_workers, seed=5, pipelines=pipelines) as loader:
        for epoch in range(3):
            for images, boxes, indices in loader:
                moved += check_found(images, boxes.values, boxes.lengths, indices, tolerance)
    assert moved > 100  # most boxes stay in their crops


def test_boxes_follow_center_crop_and_whole_images(boxes_file):
    path, mode = boxes_file
    tolerance = 1.01 if mode == "raw" else 2.0
    crop = CenterCropRGBImageDecoder((OUT, OUT), ratio=0.8)
    with Loader(path, batch_size=48, num_workers=1,
                pipelines={"image": [crop], "boxes": [BoxesDecoder(2, follow=(crop,))], "labels": None}) as loader:
        (images, boxes, indices), = list(loader)
    assert check_found(images, boxes.values, boxes.lengths, indices, tolerance) > 30


def test_boxes_kept_in_place_keep_a_labels_field_aligned(boxes_file):
    path, _ = boxes_file
    crop = RandomResizedCropRGBImageDecoder((OUT, OUT), scale=(0.05, 0.1))  # small crops: many boxes fall out
    pipelines = {"image": [crop], "boxes": [BoxesDecoder(3, follow=(crop,), drop_outside=False)],
                 "labels": [RaggedDecoder(3)]}
    dropping = {**pipelines, "boxes": [BoxesDecoder(3, follow=(crop,))]}
    with Loader(path, batch_size=48, num_workers=1, seed=1, pipelines=pipelines) as loader:
        (images, kept, labels, indices), = list(loader)
    with Loader(path, batch_size=48, num_workers=1, seed=1, pipelines=dropping) as loader:
        (_, dropped, _, _), = list(loader)
    np.testing.assert_array_equal(kept.lengths, labels.lengths)  # box i is still box i
    outside = dropped.lengths == 0
    assert outside.any() and not outside.all()
    assert (kept.values[outside, 0, :4] == 0).all()  # kept as (0, 0, 0, 0)
    np.testing.assert_array_equal(kept.values[~outside], dropped.values[~outside])


def test_unfollowed_boxes_are_clipped_to_the_image(tmp_path):
    boxes = [np.array([[-0.5, 0.1, 0.5, 0.6], [1.2, 0, 1.5, 1], [np.nan, 0, 1, 1], [0.2, 0.2, 0.1, 0.4]], np.float32)]
    path = write(tmp_path / "c.beton", {"boxes": RaggedArrayField(np.float32, (None, 4))}, [(b,) for b in boxes])
    with Loader(path, batch_size=1, num_workers=1, pipelines={"boxes": [BoxesDecoder(4)]}) as loader:
        (padded,), = list(loader)
    assert padded.lengths.tolist() == [1]  # outside, NaN and inverted boxes dropped
    np.testing.assert_allclose(padded.values[0, 0], [0, 0.1, 0.5, 0.6])
    assert not padded.values[0, 1:].any()


def test_follow_errors_name_the_mistake(boxes_file):
    path, _ = boxes_file
    crop = RandomResizedCropRGBImageDecoder((OUT, OUT))
    flip = RandomHorizontalFlip()
    with pytest.raises(PipelineError, match="no pipeline of this loader holds it"):
        Loader(path, batch_size=4, pipelines={"image": [crop], "boxes": [BoxesDecoder(2, follow=(crop, flip))],
                                              "labels": None})
    with pytest.raises(PipelineError, match="sits in 2 places"):
        Loader(path, batch_size=4, pipelines={"image": [crop, flip, flip], "labels": None,
                                              "boxes": [BoxesDecoder(2, follow=(crop, flip))]})
    with pytest.raises(PipelineError, match="at most one image decoder"):
        BoxesDecoder(2, follow=(crop, SimpleRGBImageDecoder()))
    with pytest.raises(PipelineError, match="at most one image decoder"):
        BoxesDecoder(2, follow=(NormalizeImage(np.zeros(3), np.ones(3), np.float32),))
    with pytest.raises(PipelineError, match="reads boxes stored as"):
        Loader(path, batch_size=4, pipelines={"image": None, "boxes": None, "labels": [BoxesDecoder(2)]})
