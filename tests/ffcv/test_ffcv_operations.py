"""Operations written to FFCV's contract run in beton pipelines, compiled, with beton's guarantees kept."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from beton import Loader
from beton.errors import PipelineError
from beton.decoders import IntDecoder, NDArrayDecoder
from beton.pipeline.compiler import Compiler
from beton.pipeline.operation import Operation
from beton.transforms import ToTensor

from conftest import small_image
from ffcv_style_operations import DoubleOnDevice, HalveResolution, MarkEverySeventh


def halved(image: np.ndarray) -> np.ndarray:
    blocks = image.astype(np.uint32).reshape(4, 2, 4, 2, 3).sum(axis=(1, 3))
    return (blocks // 4).astype(np.uint8)


def run(image_file, num_workers=2, **options):
    pipelines = {"image": [NDArrayDecoder(), HalveResolution(), ToTensor(), DoubleOnDevice()],
                 "label": [IntDecoder(), MarkEverySeventh(), ToTensor()]}
    with Loader(image_file, batch_size=16, num_workers=num_workers, pipelines=pipelines, **options) as loader:
        return list(loader)  # kept batches: each must stay valid


def check(batches):
    seen = 0
    for images, labels in batches:
        assert images.dtype == torch.float32 and images.shape[1:] == (4, 4, 3)
        for k, label in enumerate(labels.tolist()):
            sample = seen + k
            assert label == (-1 if sample % 7 == 0 else sample)
            np.testing.assert_array_equal(images[k].numpy(), 2 * halved(small_image(sample)).astype(np.float32))
        seen += len(labels)
    assert seen == 203


@pytest.mark.parametrize("num_workers", [0, 1, 2])
def test_ffcv_style_operations_give_the_reference_results(image_file, num_workers):
    check(run(image_file, num_workers))


def test_ffcv_style_operations_are_compiled_unless_disabled(image_file):
    with Loader(image_file, batch_size=16, num_workers=1,
                pipelines={"image": [NDArrayDecoder(), HalveResolution(), ToTensor()], "label": None}) as loader:
        (step,) = [s for stage in loader.plan.stages for s in stage.steps if "FFCV contract" in repr(s.operation)]
        assert hasattr(step.operation._function, "signatures")  # a numba dispatcher
        assert "HalveResolution() (FFCV contract)" in loader.explain()
    Compiler.set_enabled(False)
    try:
        check(run(image_file, num_workers=1))
    finally:
        Compiler.set_enabled(True)


def test_an_operation_following_neither_contract_is_a_clear_error(image_file):
    class Nothing(Operation):
        pass

    with pytest.raises(PipelineError, match="neither output_state"):
        Loader(image_file, batch_size=4, pipelines={"image": [NDArrayDecoder(), Nothing()]})

    class BadDeclaration(HalveResolution):
        def declare_state_and_memory(self, previous_state):
            return previous_state.shape

    with pytest.raises(PipelineError, match=r"must return \(State, AllocationQuery or None\)"):
        Loader(image_file, batch_size=4, pipelines={"image": [NDArrayDecoder(), BadDeclaration()]})


def test_an_operation_changed_between_epochs_takes_effect_at_the_next_epoch(image_file):
    """ffcv-imagenet's progressive resizing sets an operation's attribute before each epoch."""
    from ffcv_style_operations import KeepTopLeft

    corner = KeepTopLeft(2)
    pipelines = {"image": [NDArrayDecoder(), corner, ToTensor()], "label": [IntDecoder(), ToTensor()]}
    with Loader(image_file, batch_size=16, num_workers=2, pipelines=pipelines) as loader:
        kept = []
        for size in (2, 5, 3):
            corner.size = size
            for images, labels in loader:
                assert images.shape[1:] == (size, size, 3)
                kept.append((images, labels))
        for images, labels in kept:  # batches of earlier epochs keep their own memory and shape
            size = images.shape[1]
            for image, label in zip(images.numpy(), labels.tolist()):
                np.testing.assert_array_equal(image, small_image(label)[:size, :size])
