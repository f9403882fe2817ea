"""FFCV's memory rule, as FFCV's basic, partial-pipeline and partial-batch tests use it (issue #26): an
``AllocationQuery`` with a numpy dtype gives numpy memory whatever its device (pinned where it names a CUDA device
and CUDA is there), one with a torch dtype gives torch tensors on its device."""

from __future__ import annotations

from typing import Callable

import numpy as np
import pytest
import torch

from beton.errors import PipelineError
from beton.fields import FloatField, IntField
from beton.fields.basics import FloatDecoder
from beton.ffcv.operations import allocate, pins
from beton.loader import Loader
from beton.pipeline.allocation_query import AllocationQuery
from beton.pipeline.operation import Operation
from beton.pipeline.state import State
from beton.transforms.ops import ToTensor

from conftest import write

LENGTH = 60


class Doubler(Operation):
    """FFCV's tests' operation: asks for memory like its input, on the State's device (a torch.device)."""

    def generate_code(self) -> Callable:
        def code(x, dst):
            dst[: x.shape[0]] = x * 2
            return dst

        return code

    def declare_state_and_memory(self, previous_state: State):
        return previous_state, AllocationQuery(previous_state.shape, previous_state.dtype, previous_state.device)


class DoublerForGPU(Doubler):
    """The same, with numpy memory meant for copies to a GPU."""

    def declare_state_and_memory(self, previous_state: State):
        return previous_state, AllocationQuery(previous_state.shape, previous_state.dtype, torch.device("cuda:0"))


class SeesItsMemory(Operation):
    """Torch mode, Python: records the type and device of the memory it is given."""

    def __init__(self, query_dtype, device, seen: list) -> None:
        super().__init__()
        self.query_dtype, self.device, self.seen = query_dtype, device, seen

    def generate_code(self) -> Callable:
        seen = self.seen

        def code(x, dst):
            seen.append(dst)
            dst[:] = x if isinstance(dst, torch.Tensor) else x.numpy()
            return dst

        return code

    def declare_state_and_memory(self, previous_state: State):
        return previous_state, AllocationQuery(previous_state.shape, self.query_dtype, self.device)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    samples = [(i, float(np.sin(i))) for i in range(LENGTH)]
    return write(tmp_path_factory.mktemp("rule") / "values.beton", {"index": IntField(), "value": FloatField()},
                 samples)


def test_a_numpy_query_on_the_states_device_is_compiled_into_the_stage(dataset):
    with Loader(dataset, 8, num_workers=2, seed=17,
                pipelines={"value": [FloatDecoder(), Doubler(), ToTensor()]}) as loader:
        (stage,) = [stage for stage in loader.plan.stages if stage.kind == "jit"]
        assert "Doubler() (FFCV contract)" in [repr(step.operation) for step in stage.steps]
        indices, values = next(iter(loader))
    assert np.allclose(indices.squeeze().numpy(), np.arange(8))
    assert np.allclose(2 * np.sin(np.arange(8)), values.squeeze().numpy())


def test_a_partial_pipeline(dataset):
    with Loader(dataset, 8, num_workers=2, seed=17,
                pipelines={"value": [FloatDecoder(), Doubler(), ToTensor()], "index": None}) as loader:
        result = next(iter(loader))
    assert len(result) == 1
    assert np.allclose(2 * np.sin(np.arange(8)), result[0].squeeze().numpy())


@pytest.mark.parametrize(("batch_size", "drop_last", "expected"), [(7, True, 8), (7, False, 9)])
def test_partial_batches(dataset, batch_size, drop_last, expected):
    with Loader(dataset, batch_size, num_workers=2, seed=17, drop_last=drop_last,
                pipelines={"value": [FloatDecoder(), Doubler(), ToTensor()]}) as loader:
        assert len(loader) == expected
        batches = list(loader)  # kept: each must stay valid
    assert len(batches) == expected
    values = torch.cat([values for _, values in batches]).numpy()
    assert np.allclose(values, 2 * np.sin(np.arange(len(values))))
    assert [len(values) for _, values in batches[:-1]] == [batch_size] * (expected - 1)


def test_the_rule():
    cuda = torch.device("cuda:0")
    assert isinstance(allocate(AllocationQuery((2,), np.dtype("<f4"), cuda), 3), np.ndarray)
    assert allocate(AllocationQuery((2,), np.dtype("<f4"), cuda), 3).shape == (3, 2)
    assert isinstance(allocate(AllocationQuery((2,), "uint8", torch.device("cpu")), 3), np.ndarray)
    tensor = allocate(AllocationQuery((2,), torch.float16, "cpu"), 3, zeroed=True)
    assert isinstance(tensor, torch.Tensor) and tensor.dtype == torch.float16 and not tensor.any()
    assert allocate(None, 3) is None
    assert pins(AllocationQuery((2,), np.dtype("<f4"), cuda)) and pins(AllocationQuery((2,), "u1", "cuda"))
    assert not pins(AllocationQuery((2,), np.dtype("<f4"), torch.device("cpu")))
    assert not pins(AllocationQuery((2,), np.dtype("<f4")))
    assert not pins(AllocationQuery((2,), torch.float32, cuda))  # torch memory: made on the device itself
    with pytest.raises(PipelineError, match="neither a numpy nor a torch dtype"):
        allocate(AllocationQuery((2,), object()), 3)


@pytest.mark.parametrize(("query_dtype", "memory"), [(np.dtype("<f8"), np.ndarray), (torch.float64, torch.Tensor)])
def test_python_operations_get_the_memory_their_query_names(dataset, query_dtype, memory):
    seen: list = []
    operation = SeesItsMemory(query_dtype, torch.device("cpu"), seen)
    with Loader(dataset, 8, num_workers=1, pipelines={"value": [FloatDecoder(), ToTensor(), operation],
                                                      "index": None}) as loader:
        (values,) = next(iter(loader))
    assert seen and all(type(dst) is memory for dst in seen)
    assert np.allclose(np.asarray(values), np.sin(np.arange(8)))


def test_a_compiled_function_asking_for_torch_memory_is_a_clear_error(dataset):
    class TorchMemory(Doubler):
        def declare_state_and_memory(self, previous_state: State):
            return previous_state, AllocationQuery(previous_state.shape, torch.float64, previous_state.device)

    with pytest.raises(PipelineError, match="asks for torch memory"):
        Loader(dataset, 8, pipelines={"value": [FloatDecoder(), TorchMemory()]})


def test_memory_for_a_gpu_is_a_plain_buffer_without_cuda(dataset):
    assert not torch.cuda.is_available()  # this machine: the plan asks, the slot gives plain memory
    with Loader(dataset, 8, num_workers=1, pipelines={"value": [FloatDecoder(), DoublerForGPU()]}) as loader:
        (step,) = [s for stage in loader.plan.stages for s in stage.steps if "FFCV" in repr(s.operation)]
        assert loader.plan.buffers[step.buffer].pinned
        assert not any(spec.pinned for number, spec in enumerate(loader.plan.buffers) if number != step.buffer)
        _, values = next(iter(loader))
    assert np.allclose(values, 2 * np.sin(np.arange(8)))


def test_pinned_slot_buffers_keep_kept_batches_valid(dataset, monkeypatch):
    """With CUDA, a pinned buffer is a numpy view of a pinned tensor: a batch the loop keeps must still be seen as
    referenced, so its slot gets fresh (pinned) memory. Pinning itself needs CUDA: here it is stood in for."""
    pinned: list = []

    def pin(tensor, *arguments, **keywords):
        pinned.append(tensor)
        return tensor

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.Tensor, "pin_memory", pin)
    with Loader(dataset, 4, num_workers=2, pipelines={"value": [FloatDecoder(), DoublerForGPU()],
                                                      "index": None}) as loader:
        allocated = len(pinned)
        assert allocated == loader.num_slots  # one pinned buffer per slot
        batches = [values for (values,) in loader]
        assert len(pinned) > allocated  # kept batches: their slots got fresh pinned buffers
    assert all(isinstance(values, np.ndarray) for values in batches)
    assert np.allclose(np.concatenate(batches), 2 * np.sin(np.arange(LENGTH)))

