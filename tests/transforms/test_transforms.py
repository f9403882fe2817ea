"""Every transform against a plain numpy reference that replays the same random draws."""

from __future__ import annotations

import math
import warnings

import cv2

import numpy as np
import pytest
import torch

from beton import Loader, OrderOption
from beton.fields import IntField, NDArrayField
from beton.decoders import IntDecoder, NDArrayDecoder
from beton.pipeline.operation import BatchContext
from beton.decoders.image_crops import random_resized_crop
from beton.random import integer, operation_key, uniform
from beton.tools.sample_photos import photo_crop
from beton.transforms import (
    Convert,
    Cutout,
    ImageMixup,
    LabelMixup,
    NormalizeImage,
    RandomBrightness,
    RandomContrast,
    RandomErasing,
    RandomHorizontalFlip,
    RandomSaturation,
    RandomSolarization,
    RandomTranslate,
    RandomVerticalFlip,
    ReplaceLabel,
    Squeeze,
    ToTensor,
    ToTorchImage,
)
from beton.errors import PipelineError

from conftest import write

HEIGHT, WIDTH = 12, 10
IMAGES = [photo_crop(i, HEIGHT, WIDTH) for i in range(40)]
SEED = 17


@pytest.fixture(scope="module")
def tile_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiles") / "tiles.beton"
    return write(path, {"image": NDArrayField(np.uint8, (HEIGHT, WIDTH, 3)), "label": IntField()},
                 [(image, i) for i, image in enumerate(IMAGES)])


def run(tile_file, operations, batch_size=8, label_operations=None, num_workers=2):
    """Every (sample, output image, output label, batch number) of epoch 0."""
    pipelines = {"image": [NDArrayDecoder(), *operations], "label": label_operations or [IntDecoder(), ToTensor()]}
    with Loader(tile_file, batch_size=batch_size, num_workers=num_workers, order=OrderOption.RANDOM, seed=SEED,
                pipelines=pipelines, copy=True) as loader:
        return [(images, labels, number) for number, (images, labels) in enumerate(loader)]


def key(position, output=0):
    return operation_key(SEED, 0, output, position)


def to_uint8(values):
    return np.clip(np.floor(np.asarray(values, np.float64) + 0.5), 0, 255).astype(np.uint8)


def check(tile_file, operation, reference, tolerance=0):
    for images, labels, _ in run(tile_file, [operation, ToTensor()]):
        for image, label in zip(images.numpy(), labels.tolist()):
            expected = reference(IMAGES[label].copy(), label)
            assert np.abs(image.astype(int) - expected.astype(int)).max() <= tolerance, (operation, label)


def test_horizontal_and_vertical_flips(tile_file):
    check(tile_file, RandomHorizontalFlip(0.5),
          lambda im, s: im[:, ::-1] if uniform(key(1), s, 0) < 0.5 else im)
    check(tile_file, RandomVerticalFlip(0.3),
          lambda im, s: im[::-1] if uniform(key(1), s, 0) < 0.3 else im)


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.float32])
@pytest.mark.parametrize("channels", [1, 2, 3, 4, 5])
def test_flips_of_any_channel_count_and_dtype(tmp_path, dtype, channels):
    # Odd width: the middle column stays; channel counts 1, 3 and other ones take different loops
    images = [(np.arange(7 * 9 * channels).reshape(7, 9, channels) * (i + 1)).astype(dtype) for i in range(12)]
    fields = {"image": NDArrayField(np.dtype(dtype), (7, 9, channels)), "label": IntField()}
    path = write(tmp_path / "any.beton", fields, [(image, i) for i, image in enumerate(images)])
    for flip, mirror in ((RandomHorizontalFlip(0.5), lambda im: im[:, ::-1]),
                         (RandomVerticalFlip(0.5), lambda im: im[::-1])):
        flipped = 0
        for batch, labels, _ in run(path, [flip]):
            for image, label in zip(batch, labels.tolist()):
                drawn = uniform(key(1), label, 0) < 0.5
                np.testing.assert_array_equal(image, mirror(images[label]) if drawn else images[label])
                flipped += drawn
        assert 0 < flipped < len(images)


def test_cutout(tile_file):
    def reference(image, sample, size=5):
        cy, cx = integer(key(1), sample, 0, 0, HEIGHT), integer(key(1), sample, 1, 0, WIDTH)
        image[max(0, cy - size // 2) : cy - size // 2 + size, max(0, cx - size // 2) : cx - size // 2 + size] = (9, 8, 7)
        return image

    check(tile_file, Cutout(5, fill=(9, 8, 7)), reference)


def test_random_erasing(tile_file):
    def reference(image, sample):
        k = key(1)
        if uniform(k, sample, 0) >= 0.7:
            return image
        for attempt in range(10):
            area = HEIGHT * WIDTH * (0.1 + 0.3 * uniform(k, sample, 1 + 4 * attempt))
            aspect = math.exp(math.log(0.5) + (math.log(2.0) - math.log(0.5)) * uniform(k, sample, 2 + 4 * attempt))
            h, w = int(round(math.sqrt(area * aspect))), int(round(math.sqrt(area / aspect)))
            if h < HEIGHT and w < WIDTH:
                top = integer(k, sample, 3 + 4 * attempt, 0, HEIGHT - h + 1)
                left = integer(k, sample, 4 + 4 * attempt, 0, WIDTH - w + 1)
                image[top : top + h, left : left + w] = 3
                return image
        return image

    check(tile_file, RandomErasing(p=0.7, scale=(0.1, 0.4), ratio=(0.5, 2.0), fill=3), reference)


@pytest.mark.parametrize("padding", [3, 15])  # 15: shifts past the whole image
def test_random_translate(tile_file, padding):
    def reference(image, sample):
        dy = integer(key(1), sample, 0, -padding, padding + 1)
        dx = integer(key(1), sample, 1, -padding, padding + 1)
        padded = np.pad(image, ((padding, padding), (padding, padding), (0, 0)), constant_values=0)
        padded[:padding], padded[-padding:], padded[:, :padding], padded[:, -padding:] = 200, 200, 200, 200
        return padded[padding - dy : padding - dy + HEIGHT, padding - dx : padding - dx + WIDTH]

    check(tile_file, RandomTranslate(padding, fill=200), reference)


def factor(sample, probability, magnitude):
    if uniform(key(1), sample, 0) >= probability:
        return None
    low = max(0.0, 1 - magnitude)
    return low + (1 + magnitude - low) * uniform(key(1), sample, 1)


def luma(image):
    return image[..., 0] * 0.299 + image[..., 1] * 0.587 + image[..., 2] * 0.114


def test_brightness_contrast_saturation(tile_file):
    def brightness(image, sample):
        f = factor(sample, 0.8, 0.4)
        return image if f is None else to_uint8(image.astype(np.float64) * f)

    def contrast(image, sample):
        f = factor(sample, 0.8, 0.4)
        return image if f is None else to_uint8(f * image + (1 - f) * luma(image.astype(np.float64)).mean())

    def saturation(image, sample):
        f = factor(sample, 0.8, 0.4)
        return image if f is None else to_uint8(f * image + (1 - f) * luma(image.astype(np.float64))[..., None])

    # tolerance 1: compiled code may fuse multiply-adds, moving a value that sits on .5 by one level
    check(tile_file, RandomBrightness(0.4, p=0.8), brightness, tolerance=1)
    check(tile_file, RandomContrast(0.4, p=0.8), contrast, tolerance=1)
    check(tile_file, RandomSaturation(0.4, p=0.8), saturation, tolerance=1)


def test_solarization(tile_file):
    def reference(image, sample):
        if uniform(key(1), sample, 0) >= 0.6:
            return image
        return np.where(image >= 100, 255 - image, image).astype(np.uint8)

    check(tile_file, RandomSolarization(0.6, threshold=100), reference)


MEAN, STD = (120.0, 110.0, 100.0), (60.0, 55.0, 50.0)


def test_normalize_compiled_and_as_a_torch_operation(tile_file):
    for operations, channels_first in (([NormalizeImage(MEAN, STD), ToTensor()], False),
                                       ([ToTensor(), ToTorchImage(), NormalizeImage(MEAN, STD)], True),
                                       ([NormalizeImage(MEAN, STD, np.float16), ToTensor()], False)):
        for images, labels, _ in run(tile_file, operations):
            for image, label in zip(images, labels.tolist()):
                expected = (IMAGES[label] - np.array(MEAN)) / np.array(STD)
                got = image.permute(1, 2, 0).numpy() if channels_first else image.numpy()
                np.testing.assert_allclose(got.astype(np.float64), expected, rtol=2e-3, atol=2e-3)


def test_normalize_warns_about_0_to_1_statistics_on_uint8_images(tile_file):
    imagenet = ([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])
    for operations in ([NormalizeImage(*imagenet), ToTensor()], [ToTensor(), ToTorchImage(), NormalizeImage(*imagenet)]):
        with pytest.warns(UserWarning, match="multiply mean and std by 255"):
            run(tile_file, operations)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        run(tile_file, [NormalizeImage([v * 255 for v in imagenet[0]], [v * 255 for v in imagenet[1]]), ToTensor()])
        run(tile_file, [ToTensor(), ToTorchImage(), Convert(torch.float32), lambda images: images / 255,
                        NormalizeImage(*imagenet)])


def test_the_0_to_1_warning_points_at_the_user_s_line_and_prints_plain_numbers(tile_file):
    """Not at beton's pipeline planner, several frames below the user's loop; numpy statistics as 0.485, not
    np.float64(0.485)."""
    with pytest.warns(UserWarning, match=r"mean=\[0.485, 0.456, 0.406\]") as caught:
        run(tile_file, [NormalizeImage(np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])),
                        ToTensor()])
    assert [w.filename for w in caught if "0..1" in str(w.message)] == [__file__]


@pytest.mark.parametrize("channels", [1, 2, 4])
def test_normalize_any_channel_count(tmp_path, channels):
    images = [np.asarray(photo_crop(i, 6, 7)[..., [0, 1, 2, 0][:channels]]) for i in range(10)]
    path = write(tmp_path / "c.beton", {"image": NDArrayField(np.uint8, (6, 7, channels)), "label": IntField()},
                 [(np.ascontiguousarray(image), i) for i, image in enumerate(images)])
    mean, std = [10.0 * (c + 1) for c in range(channels)], [2.0 + c for c in range(channels)]
    for batch, labels, _ in run(path, [NormalizeImage(mean, std)]):
        for image, label in zip(batch, labels.tolist()):
            np.testing.assert_allclose(image, (images[label] - np.array(mean)) / np.array(std), rtol=1e-5, atol=1e-4)


def test_mixup_pairs_images_and_labels_with_the_same_weights(tile_file):
    for same_lambda in (True, False):
        batches = run(tile_file, [ImageMixup(0.4, same_lambda), ToTensor()], batch_size=8,
                      label_operations=[IntDecoder(), LabelMixup(0.4, same_lambda), ToTensor()])
        for images, labels, number in batches:
            mine, partners, weights = labels[:, 0].long(), labels[:, 1].long(), labels[:, 2].numpy()
            context = BatchContext(np.zeros(len(images), np.int64), 0, np.uint64(0), number, SEED)
            permutation, expected_weights = _draws(context, len(images), 0.4, same_lambda)
            np.testing.assert_array_equal(weights, expected_weights)
            assert partners.tolist() == mine[permutation].tolist()
            for image, label, partner, weight in zip(images.numpy(), mine.tolist(), partners.tolist(), weights):
                expected = to_uint8(weight * IMAGES[label].astype(np.float64) + (1 - weight) * IMAGES[partner])
                assert np.abs(image.astype(int) - expected.astype(int)).max() <= 1
            if same_lambda:
                assert len(set(weights.tolist())) == 1


def _draws(context, count, alpha, same_lambda):
    from beton.transforms.mixup import mixup_draws

    return mixup_draws(context, count, alpha, same_lambda)


def test_replace_label(tile_file):
    for images, labels, _ in run(tile_file, [ToTensor()],
                                 label_operations=[IntDecoder(), ReplaceLabel([3, 5, 39], 99), ToTensor()]):
        for image, label in zip(images.numpy(), labels.tolist()):
            original = next(i for i, im in enumerate(IMAGES) if np.array_equal(im, image))
            assert label == (99 if original in (3, 5, 39) else original)


def test_everything_together_is_identical_for_any_number_of_workers(tile_file):
    operations = [RandomHorizontalFlip(), Cutout(3), RandomErasing(), RandomTranslate(2), RandomBrightness(0.3),
                  RandomContrast(0.3), RandomSaturation(0.3), RandomSolarization(), ImageMixup(0.5), ToTensor(),
                  ToTorchImage(), Convert(torch.float32)]
    labels = [IntDecoder(), LabelMixup(0.5), ToTensor()]
    reference = run(tile_file, operations, label_operations=labels, num_workers=1)
    for num_workers in (2, 4):
        for (a, la, _), (b, lb, _) in zip(reference, run(tile_file, operations, label_operations=labels,
                                                           num_workers=num_workers)):
            assert torch.equal(a, b) and torch.equal(la, lb)


@pytest.mark.parametrize("operation", [Cutout(3), RandomErasing(), RandomTranslate(2), RandomBrightness(0.2),
                                       RandomSolarization(), ImageMixup(), RandomHorizontalFlip()])
def test_image_operations_refuse_labels(tile_file, operation):
    with pytest.raises(PipelineError):
        Loader(tile_file, batch_size=4, pipelines={"label": [IntDecoder(), operation]})


def test_to_device_pins_and_copies_asynchronously_only_where_cuda_is(tile_file, monkeypatch):
    from beton.transforms import ToDevice

    for images, labels, _ in run(tile_file, [ToTensor(), ToDevice("cpu")]):
        assert images.device.type == "cpu" and not images.is_pinned()

    class RecordingBatch:  # stands in for a CPU tensor: records what ToDevice asks of it
        device = torch.device("cpu")

        def __init__(self, pinned=False):
            self.calls, self.pinned = [], pinned

        def is_pinned(self):
            return self.pinned

        def pin_memory(self):
            self.calls.append("pin")
            return self

        def to(self, device, non_blocking=False):
            self.calls.append((str(device), non_blocking))
            return self

    # a slot's buffer pinned already: pin_memory() would give the slot itself, so the copy out of it is synchronous
    # (an asynchronous one could still read it when a later batch fills the slot)
    for cuda, pinned, expected in ((True, False, ["pin", ("cuda", True)]), (False, False, [("cuda", False)]),
                                   (True, True, [("cuda", False)])):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
        batch = RecordingBatch(pinned)
        ToDevice("cuda").apply(batch, None)
        assert batch.calls == expected


# ---- FFCV's transforms ---------------------------------------------------------------------------------------


def test_random_resized_crop_on_arrays(tile_file):
    from beton.transforms import RandomResizedCrop

    whole = RandomResizedCrop(scale=(1.0, 1.0), ratio=(WIDTH / HEIGHT, WIDTH / HEIGHT), size=(HEIGHT, WIDTH))
    check(tile_file, whole, lambda image, sample: image)  # the whole image at its own size: exactly the input

    crop = RandomResizedCrop(scale=(0.3, 0.6), ratio=(3 / 4, 4 / 3), size=6)
    outputs = [run(tile_file, [crop, ToTensor()], num_workers=n) for n in (1, 2)]
    for (images, labels, _), (again, _, _) in zip(*outputs):
        assert torch.equal(images, again)  # keyed draws: the same crops for any number of workers
        for image, sample in zip(images.numpy(), labels.tolist()):
            top, left, height, width = random_resized_crop(key(1), sample, HEIGHT, WIDTH, 0.3, 0.6,
                                                           math.log(3 / 4), math.log(4 / 3))
            region = IMAGES[sample][top : top + height, left : left + width]
            errors = [np.abs(cv2.resize(region, (6, 6), interpolation=method).astype(int) - image).max()
                      for method in (cv2.INTER_AREA, cv2.INTER_LINEAR)]
            assert min(errors) <= 1, (sample, errors)  # that box, resized by one of OpenCV's two filters


def test_poison_blends_the_mask_into_chosen_samples(tile_file):
    from beton.transforms import Poison

    mask = np.zeros((HEIGHT, WIDTH, 3), np.uint8)
    mask[2:5, 3:7] = 255
    chosen = {1, 4, 9, 16, 25, 36}

    def reference(image, sample):
        if sample not in chosen:
            return image
        return np.clip(0.7 * image + 0.3 * mask.astype(np.float64), 0, 255).astype(np.uint8)

    check(tile_file, Poison(mask, 0.3, sorted(chosen)), reference, tolerance=1)


@pytest.mark.parametrize("mask_shape", [(HEIGHT, WIDTH), (HEIGHT, WIDTH, 1)], ids=["grayscale HxW", "HxWx1"])
def test_poison_spreads_a_one_channel_mask_over_every_channel(tile_file, mask_shape):
    from beton.transforms import Poison

    mask = np.zeros(mask_shape, np.uint8)
    mask[2:5, 3:7] = 200
    per_channel = np.broadcast_to(mask.reshape(HEIGHT, WIDTH, 1), (HEIGHT, WIDTH, 3)).astype(np.float64)
    chosen = {0, 3, 7}

    def reference(image, sample):
        if sample not in chosen:
            return image
        return np.clip(0.5 * image + 0.5 * per_channel, 0, 255).astype(np.uint8)

    check(tile_file, Poison(mask, 0.5, sorted(chosen)), reference, tolerance=1)


def test_poison_takes_ffcvs_per_pixel_alpha_of_the_images_height_and_width(tile_file):
    from beton.transforms import Poison

    mask = np.full((HEIGHT, WIDTH, 3), 240, np.uint8)
    alpha = np.zeros((HEIGHT, WIDTH), np.float32)  # FFCV's alpha: one opacity per pixel, for every channel
    alpha[1:6, 2:9] = 0.75

    def reference(image, sample):
        if sample != 5:
            return image
        opacity = alpha[:, :, None].astype(np.float64)
        return np.clip((1 - opacity) * image + opacity * mask, 0, 255).astype(np.uint8)

    check(tile_file, Poison(mask, alpha, [5]), reference, tolerance=1)


def test_poison_refuses_a_mask_that_fits_no_image(tile_file):
    from beton.transforms import Poison

    with pytest.raises(PipelineError, match="broadcast to"):
        check(tile_file, Poison(np.zeros((HEIGHT + 1, WIDTH), np.uint8), 0.5, [0]), lambda image, sample: image)


def test_mixup_to_one_hot_matches_the_label_mixup_rows(tile_file):
    from beton.transforms import MixupToOneHot

    def rows(extra):
        labels = [IntDecoder(), LabelMixup(alpha=0.5, same_lambda=False), ToTensor(), *extra]
        return [batch for _, batch, _ in run(tile_file, [ToTensor()], label_operations=labels)]

    for mixed, targets in zip(rows([]), rows([MixupToOneHot(40)])):
        assert targets.shape == (len(mixed), 40)
        expected = torch.zeros(len(mixed), 40, dtype=targets.dtype)
        for k, (label, partner, lam) in enumerate(mixed.tolist()):
            expected[k, int(label)] += lam
            expected[k, int(partner)] += 1 - lam
        torch.testing.assert_close(targets, expected)


def test_view_works_on_numpy_and_torch_batches(tile_file):
    from beton.transforms import View

    for operations in ([View(np.int8), ToTensor()], [ToTensor(), View(torch.int8)]):
        for images, labels, _ in run(tile_file, operations):
            assert images.dtype == torch.int8
            for image, label in zip(images.numpy(), labels.tolist()):
                np.testing.assert_array_equal(image, IMAGES[label].view(np.int8))


def test_squeeze_takes_ffcv_batch_dimensions_or_per_sample_dims():
    from beton.pipeline.operation import State

    state = State((1, 3, 1), torch.float32, kind="torch")
    assert Squeeze(1).output_state(state).shape == (3, 1) == Squeeze(dims=(0,)).output_state(state).shape
    assert Squeeze(-1).output_state(state).shape == (1, 3)
    assert Squeeze().output_state(state).shape == (3,)
    assert Squeeze(1) == Squeeze(dims=(0,))
    with pytest.raises(ValueError, match="dimension 0 is the batch"):
        Squeeze(0)
    with pytest.raises(PipelineError, match="size 1"):
        Squeeze(2).output_state(state)
    batch = torch.zeros(5, 1, 3, 1)
    assert Squeeze(1).apply(batch, None).shape == (5, 3, 1)


def test_normalize_on_torch_refuses_images_whose_channel_axis_it_cannot_tell(tmp_path):
    # (3, 5, 3) per sample after ToTensor is HxWxC with H == C, or would be CxHxW with W == C: taking it for
    # channels-first normalised each row of HxWxC images by the wrong channel's statistics, silently
    path = write(tmp_path / "short.beton", {"image": NDArrayField(np.uint8, (3, 5, 3)), "label": IntField()},
                 [(np.ascontiguousarray(photo_crop(i, 3, 5)), i) for i in range(4)])
    with pytest.raises(PipelineError, match="before ToTensor"):
        run(path, [ToTensor(), NormalizeImage(MEAN, STD)])
    for operations, channels_first in (([NormalizeImage(MEAN, STD), ToTensor()], False),  # these still serve them
                                       ([ToTensor(), ToTorchImage(), NormalizeImage(MEAN, STD)], True)):
        for images, labels, _ in run(path, operations):
            for image, label in zip(images, labels.tolist()):
                expected = (photo_crop(label, 3, 5) - np.array(MEAN)) / np.array(STD)
                got = image.permute(1, 2, 0).numpy() if channels_first else image.numpy()
                np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_normalize_on_torch_rounds_once_to_a_narrow_dtype(dtype):
    # (x - mean) / std computed in float32, then rounded to the output dtype, as the numpy path and FFCV's lookup
    # table do: computed in float16 itself, the rounded mean cancelled to values up to 138 float16 steps off near 0
    mean, std = [v * 255 for v in (0.485, 0.456, 0.406)], [v * 255 for v in (0.229, 0.224, 0.225)]
    images = torch.arange(256, dtype=torch.uint8).repeat(3, 1).reshape(1, 3, 16, 16)
    got = NormalizeImage(mean, std, dtype).apply(images, None)
    exact = (images.double() - torch.tensor(mean).view(1, 3, 1, 1).double()) / torch.tensor(std).view(1, 3, 1, 1).double()
    assert got.dtype == dtype
    torch.testing.assert_close(got, exact.to(torch.float32).to(dtype), rtol=0, atol=0)


def test_normalize_to_float64_on_numpy_images_keeps_float64_precision(tile_file):
    for images, labels, _ in run(tile_file, [NormalizeImage(MEAN, STD, np.float64), ToTensor()]):
        for image, label in zip(images.numpy(), labels.tolist()):
            assert image.dtype == np.float64
            np.testing.assert_allclose(image, (IMAGES[label] - np.array(MEAN)) / np.array(STD), rtol=1e-13, atol=1e-13)


def test_mixup_to_one_hot_refuses_labels_outside_its_classes():
    from beton.errors import DecodeError
    from beton.transforms import MixupToOneHot

    for label in (-1, 4):  # numpy's indexing took -1 for the last class, silently
        rows = np.array([[label, 2.0, 0.7], [3.0, 3.0, 0.2]])
        for batch in (rows, torch.tensor(rows)):
            with pytest.raises(DecodeError, match=f"labels in 0..3, got {label}"):
                MixupToOneHot(4).apply(batch, None)
    np.testing.assert_array_equal(MixupToOneHot(4).apply(np.array([[0.0, 3.0, 0.25]]), None), [[0.25, 0, 0, 0.75]])
