"""Operations written to FFCV's contract compile into beton's fused stages: fewer compiled calls, the same
batches as when each runs on its own (or as Python), kept batches valid; and FFCV's accept_field /
accept_globals and shared state reach every operation of a pipeline."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from beton import Loader
from beton.decoders import IntDecoder, NDArrayDecoder
from beton.errors import PipelineError
from beton.fields import IntField
from beton.loader import CompileOptions
from beton.pipeline.allocation_query import AllocationQuery
from beton.pipeline.compiler import Compiler
from beton.transforms import RandomHorizontalFlip, ToTensor

from conftest import small_image, write
from ffcv_style_fields import RawImageDecoder, RawImageField, VectorDecoder, VectorField
from ffcv_style_operations import (
    AddRowOffsets,
    HalveResolution,
    InvertPixels,
    MarkEverySeventh,
    RecordsAccepted,
    ScaleByFieldLength,
    SubtractSharedPair,
)

NUM_SAMPLES = 203


@pytest.fixture(scope="module")
def raw_file(tmp_path_factory):
    """203 8x8x3 images in a field written to FFCV's field contract, their labels, and a vector each."""
    path = tmp_path_factory.mktemp("ffcv_fusion") / "raw.beton"
    fields = {"image": RawImageField((8, 8, 3)), "label": IntField(), "vector": VectorField(4)}
    samples = [(small_image(i), i, np.arange(4, dtype=np.float32) + i) for i in range(NUM_SAMPLES)]
    return write(path, fields, samples, page_size=1024, chunksize=17)


CUSTOM = {"image": RawImageField, "vector": VectorField}


def four_step_pipelines() -> dict:
    """An FFCV-style decoder, two FFCV-style transforms and a native compiled transform; labels beside."""
    return {"image": [RawImageDecoder(), HalveResolution(), InvertPixels(), RandomHorizontalFlip(), ToTensor()],
            "label": [IntDecoder(), MarkEverySeventh(), ToTensor()], "vector": None}


def halved_inverted(sample: int) -> np.ndarray:
    blocks = small_image(sample).astype(np.uint32).reshape(4, 2, 4, 2, 3).sum(axis=(1, 3))
    return (255 - blocks // 4).astype(np.uint8)


def batches(path, **options) -> list:
    with Loader(path, batch_size=16, num_workers=2, seed=5, custom_fields=CUSTOM, pipelines=four_step_pipelines(),
                **options) as loader:
        return [list(loader) for _ in range(2)]  # kept batches, two epochs: each must stay valid


def test_decoder_two_ffcv_transforms_and_a_native_one_compile_into_one_stage(raw_file):
    with Loader(raw_file, batch_size=16, num_workers=1, custom_fields=CUSTOM,
                pipelines=four_step_pipelines()) as loader:
        stages = [(stage.kind, [repr(step.operation).split("(")[0] for step in stage.steps])
                  for stage in loader.plan.stages]
        explained = loader.explain()
    assert stages == [("jit", ["RawImageDecoder", "HalveResolution", "InvertPixels", "RandomHorizontalFlip",
                               "IntDecoder", "MarkEverySeventh"]),
                      ("batch", ["ToTensor"]), ("batch", ["ToTensor"])]
    # the native kernels run in loops, the FFCV-style ones once per batch between them, in each pipeline's order
    assert "kernel_0(src_0, dst_0, start, end, samples, key_0, args_0)  # RawImageDecoder() (FFCV contract)" \
        in explained
    assert "kernel_3(src_3, dst_3, i, sample, key_3, args_3)  # RandomHorizontalFlip" in explained
    with Loader(raw_file, batch_size=16, num_workers=1, custom_fields=CUSTOM, pipelines=four_step_pipelines(),
                compile_options=CompileOptions(fuse_stages=False)) as loader:
        assert [stage.kind for stage in loader.plan.stages] == ["jit"] * 4 + ["batch"] + ["jit"] * 2 + ["batch"]


def test_fused_batches_are_those_of_each_operation_alone_and_of_python(raw_file):
    fused = batches(raw_file)
    alone = batches(raw_file, compile_options=CompileOptions(fuse_stages=False))
    Compiler.set_enabled(False)  # FFCV's switch: the FFCV-style functions run as Python, one batch stage each
    try:
        python = batches(raw_file)
    finally:
        Compiler.set_enabled(True)
    for other in (alone, python):
        for epoch, other_epoch in zip(fused, other):
            assert len(epoch) == len(other_epoch) == -(-NUM_SAMPLES // 16)
            for (images, labels), (other_images, other_labels) in zip(epoch, other_epoch):
                assert torch.equal(images, other_images) and torch.equal(labels, other_labels)
    flipped = 0
    for epoch in fused:
        seen = []
        for images, labels in epoch:  # and they are right, every kept batch of both epochs
            for image, label in zip(images.numpy(), labels.tolist()):
                candidates = [label] if label != -1 else range(0, NUM_SAMPLES, 7)  # MarkEverySeventh: -1
                (sample,) = [s for s in candidates if is_halved_inverted(image, s)]
                flipped += not np.array_equal(image, halved_inverted(sample))
                seen.append(sample)
        assert sorted(seen) == list(range(NUM_SAMPLES))
    assert 0 < flipped < 2 * NUM_SAMPLES


def is_halved_inverted(image: np.ndarray, sample: int) -> bool:
    """Whether ``image`` is sample's image halved, inverted and maybe mirrored (RandomHorizontalFlip)."""
    expected = halved_inverted(sample)
    return np.array_equal(image, expected) or np.array_equal(image, expected[:, ::-1])


def test_fused_ffcv_decoders_under_both_memory_layers(raw_file):
    for os_cache in (True, False):
        pipelines = {"image": [RawImageDecoder()], "label": [IntDecoder()],
                     "vector": [VectorDecoder(), ScaleByFieldLength()]}
        with Loader(raw_file, batch_size=10, num_workers=3, os_cache=os_cache, custom_fields=CUSTOM,
                    pipelines=pipelines) as loader:
            assert [stage.kind for stage in loader.plan.stages] == ["jit"]
            kept = list(loader)
        for images, labels, vectors in kept:
            for image, label, vector in zip(images, labels, vectors):
                np.testing.assert_array_equal(image, small_image(label))
                np.testing.assert_array_equal(vector, (np.arange(4, dtype=np.float32) + label) * 4)


def test_every_operation_of_a_pipeline_gets_field_and_globals_on_a_copy(image_file):
    accepting = RecordsAccepted()
    with Loader(image_file, batch_size=16, num_workers=1,
                pipelines={"image": None, "label": [IntDecoder(), accepting, ToTensor()]}) as loader:
        labels = torch.cat([labels for (labels,) in loader])
    assert labels.tolist() == list(range(NUM_SAMPLES))
    assert accepting.accepted == [] and not hasattr(accepting, "field")  # the user's object is not changed


@pytest.mark.parametrize("compiled", [True, False])
def test_shared_state_is_filled_for_each_batch_and_passed_last(image_file, compiled):
    pipelines = {"image": None, "label": [IntDecoder(), AddRowOffsets(3), SubtractSharedPair(), ToTensor()]}
    Compiler.set_enabled(compiled)
    try:
        with Loader(image_file, batch_size=16, num_workers=2, pipelines=pipelines) as loader:
            kinds = [(stage.kind, len(stage.steps)) for stage in loader.plan.stages]
            assert kinds == ([("jit", 3), ("batch", 1)] if compiled else [("jit", 1)] + [("batch", 1)] * 3)
            kept = list(loader)
    finally:
        Compiler.set_enabled(True)
    for number, (labels,) in enumerate(kept):
        samples = np.arange(16 * number, min(16 * number + 16, NUM_SAMPLES))
        # label + 3 * row (AddRowOffsets), then - 2 * sample (SubtractSharedPair, label == sample)
        assert labels.tolist() == (samples + 3 * np.arange(len(samples)) - 2 * samples).tolist()


def test_an_operation_with_shared_state_placed_twice_is_refused(raw_file):
    shared = AddRowOffsets()
    with pytest.raises(PipelineError, match=r"shared state .* placed in 2 places \(label\[1\], vector\[1\]\)"):
        Loader(raw_file, batch_size=4, custom_fields=CUSTOM,
               pipelines={"image": None, "label": [IntDecoder(), shared], "vector": [IntDecoder(), shared]})


class ReturnsFloats(InvertPixels):
    """Declares uint8 output but returns float64: a broken declaration, refused rather than cast."""

    def generate_code(self):
        def invert(images, dst):
            return 255.0 - images

        return invert


class ReturnsAFreshArray(InvertPixels):
    """Returns a new array instead of filling ``dst``: allowed by FFCV's contract; copied into the slot."""

    def generate_code(self):
        def invert(images, dst):
            return np.uint8(255) - images  # numba makes 255 - uint8 an int64 array

        return invert


class InPlaceReturnsACopy(InvertPixels):
    def declare_state_and_memory(self, previous_state):
        return previous_state, None

    def generate_code(self):
        def invert(images, _):
            result = images.copy()
            for i in range(images.shape[0]):
                result[i] = 255 - images[i]
            return result

        return invert


class WrongShape(InvertPixels):
    def generate_code(self):
        def invert(images, dst):
            return dst[:, :1]

        return invert


@pytest.mark.parametrize("operation", [ReturnsAFreshArray(), InPlaceReturnsACopy()])
def test_a_result_that_is_not_the_output_memory_is_copied_there(image_file, operation):
    pipelines = {"image": [NDArrayDecoder(), operation, ToTensor()], "label": [IntDecoder(), ToTensor()]}
    with Loader(image_file, batch_size=16, num_workers=2, pipelines=pipelines) as loader:
        assert loader.plan.stages[0].kind == "jit" and len(loader.plan.stages[0].steps) == 3
        for images, labels in list(loader):
            for image, label in zip(images.numpy(), labels.tolist()):
                np.testing.assert_array_equal(image, 255 - small_image(label))


@pytest.mark.parametrize(("operation", "message"), [
    (ReturnsFloats(), r"returned array\(float64, 4d, C\), but declared 3-dimensional uint8 samples"),
    (WrongShape(), r"returned an array whose shape is not \(batch, \*the shape its State declared\)"),
])
def test_a_result_unlike_the_declared_state_is_a_clear_error(image_file, operation, message):
    pipelines = {"image": [NDArrayDecoder(), operation], "label": None}
    with Loader(image_file, batch_size=16, num_workers=1, pipelines=pipelines) as loader:
        with pytest.raises(PipelineError, match=message) as caught:
            next(iter(loader))
    assert f"{type(operation).__name__}() (FFCV contract)" in str(caught.value.__notes__)  # which operation


def test_output_memory_unlike_the_state_runs_as_its_own_batch_stage(image_file):
    class OnTheSide(InvertPixels):  # asks for memory of another shape than its State: not a slot buffer
        def declare_state_and_memory(self, previous_state):
            state, _ = super().declare_state_and_memory(previous_state)
            return state, AllocationQuery((8, 8, 3, 1), np.dtype("u1"))

        def generate_code(self):
            def invert(images, dst):
                for i in range(images.shape[0]):
                    dst[i, :, :, :, 0] = 255 - images[i]
                return dst[:, :, :, :, 0]

            return invert

    pipelines = {"image": [NDArrayDecoder(), OnTheSide(), ToTensor()], "label": [IntDecoder(), ToTensor()]}
    with Loader(image_file, batch_size=16, num_workers=2, pipelines=pipelines) as loader:
        assert [stage.kind for stage in loader.plan.stages] == ["jit", "batch", "batch", "batch"]
        for images, labels in list(loader):
            for image, label in zip(images.numpy(), labels.tolist()):
                np.testing.assert_array_equal(image, 255 - small_image(label))
