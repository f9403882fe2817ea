"""Operations a user would write in their own module, used by the robustness tests."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import numba
import numpy as np

from beton.pipeline.operation import BatchOperation, JitOperation, SampleOperation, State


@numba.njit(nogil=True, cache=True)
def _fail_on_sample_kernel(src, dst, i, sample, key, args):
    (bad_sample,) = args
    if sample == bad_sample:
        raise ValueError("this sample is cursed")
    dst[i] = src[i]


@dataclasses.dataclass(frozen=True)
class FailOnSample(JitOperation):
    """Compiled; raises ValueError on one sample."""

    bad_sample: int

    def output_state(self, previous: Any) -> State:
        return previous

    def kernel(self) -> Any:
        return _fail_on_sample_kernel

    def kernel_arguments(self, previous: Any) -> tuple:
        return (np.int64(self.bad_sample),)


@dataclasses.dataclass(frozen=True)
class TorchFailOnSample(BatchOperation):
    """A torch-level operation that raises KeyError in the batch holding one sample, after a random sleep."""

    bad_sample: int
    max_sleep: float = 0.0

    def output_state(self, previous: Any) -> State:
        return previous

    def apply(self, batch: Any, context: Any) -> Any:
        time.sleep(np.random.default_rng(int(context.samples[0])).random() * self.max_sleep)
        if self.bad_sample in context.samples.tolist():
            raise KeyError(f"sample {self.bad_sample} rejected")
        return batch


@dataclasses.dataclass(frozen=True)
class PythonFailOnSample(SampleOperation):
    """A per-sample Python operation (a copy of its input row) that raises LookupError on one sample."""

    bad_sample: int

    def output_state(self, previous: Any) -> State:
        return previous

    def apply(self, src: Any, dst: np.ndarray, i: int, sample: int, context: Any) -> None:
        if sample == self.bad_sample:
            raise LookupError(f"sample {sample} has no row")
        dst[i] = src[i]
