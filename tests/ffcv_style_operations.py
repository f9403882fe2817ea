"""Operations written the way FFCV's documentation tells users to write them (FFCV's import paths under the
``beton`` name, ``declare_state_and_memory`` + ``generate_code``), to check that they run unchanged."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Optional, Tuple

import numpy as np

from beton.pipeline.allocation_query import AllocationQuery
from beton.pipeline.compiler import Compiler
from beton.pipeline.operation import Operation
from beton.pipeline.state import State


class HalveResolution(Operation):
    """Average each 2x2 block of pixels: an HxWxC uint8 image becomes (H//2)x(W//2)xC."""

    def generate_code(self) -> Callable:
        loop = Compiler.get_iterator()

        def halve(images, dst):
            for i in loop(images.shape[0]):
                for y in range(dst.shape[1]):
                    for x in range(dst.shape[2]):
                        for c in range(dst.shape[3]):
                            total = (np.uint32(images[i, 2 * y, 2 * x, c]) + images[i, 2 * y + 1, 2 * x, c]
                                     + images[i, 2 * y, 2 * x + 1, c] + images[i, 2 * y + 1, 2 * x + 1, c])
                            dst[i, y, x, c] = total // 4
            return dst

        halve.is_parallel = True
        return halve

    def declare_state_and_memory(self, previous_state: State) -> Tuple[State, Optional[AllocationQuery]]:
        assert previous_state.jit_mode
        height, width, channels = previous_state.shape
        shape = (height // 2, width // 2, channels)
        return replace(previous_state, shape=shape), AllocationQuery(shape, previous_state.dtype)


class MarkEverySeventh(Operation):
    """In place, using the dataset indices: the label of every seventh sample becomes -1."""

    def generate_code(self) -> Callable:
        loop = Compiler.get_iterator()

        def mark(labels, _, indices):
            for i in loop(labels.shape[0]):
                if indices[i] % 7 == 0:
                    labels[i] = -1
            return labels

        mark.with_indices = True
        return mark

    def declare_state_and_memory(self, previous_state: State) -> Tuple[State, Optional[AllocationQuery]]:
        return previous_state, None


class DoubleOnDevice(Operation):
    """After ToTensor (torch mode): twice the batch, as float32, in memory it asks for on the batch's device."""

    def generate_code(self) -> Callable:
        def double(batch, dst):
            dst[:] = batch
            dst *= 2
            return dst

        return double

    def declare_state_and_memory(self, previous_state: State) -> Tuple[State, Optional[AllocationQuery]]:
        import torch

        assert not previous_state.jit_mode
        state = replace(previous_state, dtype=torch.float32)
        return state, AllocationQuery(previous_state.shape, torch.float32, device=previous_state.device)


class KeepTopLeft(Operation):
    """The top-left ``size`` x ``size`` corner of each image; ``size`` may change between epochs."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size

    def generate_code(self) -> Callable:
        loop = Compiler.get_iterator()

        def keep(images, dst):
            for i in loop(images.shape[0]):
                dst[i] = images[i, : dst.shape[1], : dst.shape[2]]
            return dst

        return keep

    def declare_state_and_memory(self, previous_state: State) -> Tuple[State, Optional[AllocationQuery]]:
        shape = (self.size, self.size, previous_state.shape[2])
        return replace(previous_state, shape=shape), AllocationQuery(shape, previous_state.dtype)


class InvertPixels(Operation):
    """255 minus each value of a uint8 batch, into memory of its own."""

    def generate_code(self) -> Callable:
        loop = Compiler.get_iterator()

        def invert(images, dst):
            for i in loop(images.shape[0]):
                dst[i] = 255 - images[i]
            return dst

        return invert

    def declare_state_and_memory(self, previous_state: State) -> Tuple[State, Optional[AllocationQuery]]:
        return previous_state, AllocationQuery(previous_state.shape, previous_state.dtype)


class AddRowOffsets(Operation):
    """Adds to each label ``step`` times its row in the batch; the offsets are per-batch shared state that
    ``generate_code_for_shared_state`` fills before the operation runs (FFCV's shared-state contract)."""

    def __init__(self, step: int = 3) -> None:
        super().__init__()
        self.step = step

    def declare_shared_memory(self, previous_state: State) -> Optional[AllocationQuery]:
        return AllocationQuery((), np.dtype("<i8"))

    def generate_code_for_shared_state(self) -> Optional[Callable]:
        step = self.step

        def fill(offsets):
            for i in range(offsets.shape[0]):
                offsets[i] = step * i

        return fill

    def generate_code(self) -> Callable:
        def add(labels, dst, offsets):
            for i in range(labels.shape[0]):
                dst[i] = labels[i] + offsets[i]
            return dst

        return add

    def declare_state_and_memory(self, previous_state: State) -> Tuple[State, Optional[AllocationQuery]]:
        state = replace(previous_state, dtype=np.dtype("<i8"))
        return state, AllocationQuery(previous_state.shape, np.dtype("<i8"))


class SubtractSharedPair(Operation):
    """In place, with the dataset indices and two shared arrays (a sequence of queries): label - 2 * index,
    computed as label - index - index through the shared rows."""

    def declare_shared_memory(self, previous_state: State):
        return [AllocationQuery((), np.dtype("<i8")), AllocationQuery((2,), np.dtype("<i4"))]

    def generate_code_for_shared_state(self) -> Optional[Callable]:
        def clear(shared):
            first, second = shared
            first[:] = 0
            second[:] = 0

        return clear

    def generate_code(self) -> Callable:
        def subtract(labels, _, indices, shared):
            first, second = shared
            for i in range(labels.shape[0]):
                first[i] = indices[i]
                second[i, 0] = indices[i]
                labels[i] = labels[i] - first[i] - second[i, 0] + second[i, 1]
            return labels

        subtract.with_indices = True
        return subtract

    def declare_state_and_memory(self, previous_state: State) -> Tuple[State, Optional[AllocationQuery]]:
        return previous_state, None


class ScaleByFieldLength(Operation):
    """Multiplies float vectors by their field's length: uses ``self.field``, and checks that it was given
    ``self.metadata`` and ``self.memory_read`` too, as FFCV gives every operation of a pipeline."""

    def declare_state_and_memory(self, previous_state: State) -> Tuple[State, Optional[AllocationQuery]]:
        assert len(self.metadata) > 0 and self.memory_read is not None
        return previous_state, AllocationQuery(previous_state.shape, previous_state.dtype)

    def generate_code(self) -> Callable:
        factor = np.float32(self.field.length)

        def scale(vectors, dst):
            for i in range(vectors.shape[0]):
                dst[i] = vectors[i] * factor
            return dst

        return scale


class RecordsAccepted(Operation):
    """In place, unchanged values; defines FFCV's accept_field / accept_globals and counts the calls."""

    def __init__(self) -> None:
        super().__init__()
        self.accepted = []

    def accept_field(self, field) -> None:
        self.accepted = [*self.accepted, ("field", type(field).__name__)]
        self.field = field

    def accept_globals(self, metadata, memory_read) -> None:
        self.accepted = [*self.accepted, ("globals", len(metadata))]
        self.metadata, self.memory_read = metadata, memory_read

    def declare_state_and_memory(self, previous_state: State) -> Tuple[State, Optional[AllocationQuery]]:
        assert self.accepted == [("field", "IntField"), ("globals", 203)], self.accepted
        return previous_state, None

    def generate_code(self) -> Callable:
        def same(values, _):
            return values

        return same
