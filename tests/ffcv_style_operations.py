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
