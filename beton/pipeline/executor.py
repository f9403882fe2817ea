"""Running a compiled plan on one batch, in one worker thread, inside one slot's preallocated buffers."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from beton.errors import BetonError, add_note
from beton.pipeline.compiler import Plan, Stage, Step
from beton.pipeline.operation import BatchContext, Source
from beton.pipeline.ragged import Padded, map_parts

__all__ = ["BatchJob", "run_batch", "warm_up", "step_key"]


@dataclasses.dataclass(frozen=True)
class BatchJob:
    """One batch to compute: its samples, the epoch's operation keys, and where its inputs come from."""

    index: int  # batch number in the epoch
    position: int  # batch number in this iteration (differs from index after a resume)
    samples: np.ndarray  # int64 dataset indices
    epoch: int
    keys: dict[tuple[int, int], np.uint64]  # (output, position) -> key
    sources: Sequence[Source]  # per output
    seed: int = 0
    scratch: Any = None  # the slot's Scratch
    fidelity: int | None = None


def run_batch(plan: Plan, kernel_arguments: dict, buffers: Sequence[np.ndarray], job: BatchJob) -> tuple:
    """Run every stage; return one value per output (numpy views of the slot's buffers, tensors, lists)."""
    count = len(job.samples)
    values: list[Any] = list(job.sources)
    in_buffer = [False] * len(values)  # whether values[o] is a whole (batch_size-long) slot buffer
    for stage in plan.stages:
        if stage.kind == "jit":
            _run_jit(stage, plan, kernel_arguments, buffers, job, values)
            for step in stage.steps:
                values[step.output] = _slot_value(buffers, step.buffer, step.lengths_buffer)
                in_buffer[step.output] = True
            continue
        (step,) = stage.steps
        current = _first(values[step.output], count) if in_buffer[step.output] else values[step.output]
        context = BatchContext(job.samples, job.epoch, step_key(step, job.keys), job.index, job.seed,
                               job.scratch, job.fidelity)
        with _locate(plan, step, job, None):
            if stage.kind == "sample":
                destination = _slot_value(buffers, step.buffer, step.lengths_buffer)
                for i in range(count):
                    with _locate(plan, step, job, i):
                        step.operation.apply(current, destination, i, int(job.samples[i]), context)
                values[step.output], in_buffer[step.output] = destination, True
            else:
                values[step.output], in_buffer[step.output] = step.operation.apply(current, context), False
    return tuple(_first(value, count) if whole else value for value, whole in zip(values, in_buffer))


def step_key(step: Step, keys: dict[tuple[int, int], np.uint64]) -> Any:
    """The step's random key: its own, or the keys of the operations it follows (a uint64 array)."""
    if step.key_sources:
        return np.array([keys[source] for source in step.key_sources], np.uint64)
    return keys[step.output, step.position]


def _slot_value(buffers: Sequence[np.ndarray], buffer: int, lengths: int | None) -> Any:
    return buffers[buffer] if lengths is None else Padded(buffers[buffer], buffers[lengths])


def _first(value: Any, count: int) -> Any:
    """The first ``count`` samples of a whole slot buffer (or of a padded pair of them)."""
    return map_parts(lambda part: part[:count], value)


def _kernel_view(buffers: Sequence[np.ndarray], buffer: int, lengths: int | None) -> Any:
    """What a kernel gets for a slot buffer: the array, or for a padded batch (values as bytes, lengths)."""
    if lengths is None:
        return buffers[buffer]
    values = buffers[buffer]
    return values.reshape(len(values), -1).view(np.uint8), buffers[lengths]


def _jit_arguments(stage: Stage, kernel_arguments: dict, buffers: Sequence[np.ndarray], job: BatchJob,
                   values: list[Any]) -> list[Any]:
    arguments: list[Any] = []
    for step in stage.steps:
        source = values[step.output]
        if step.input_buffer is not None:
            source = _kernel_view(buffers, step.input_buffer, step.input_lengths_buffer)
        elif isinstance(source, Source):
            source = source.as_tuple()
        arguments += [source, _kernel_view(buffers, step.buffer, step.lengths_buffer), step_key(step, job.keys),
                      kernel_arguments[step.output, step.position]]
    return arguments


def _run_jit(stage: Stage, plan: Plan, kernel_arguments: dict, buffers: Sequence[np.ndarray], job: BatchJob,
             values: list[Any]) -> None:
    arguments = _jit_arguments(stage, kernel_arguments, buffers, job, values)
    try:
        stage.function(0, len(job.samples), job.samples, *arguments)
    except Exception as error:
        _annotate(error, plan, stage.steps, job, _first_failing_position(stage, job, arguments))
        raise


def _first_failing_position(stage: Stage, job: BatchJob, arguments: list[Any]) -> int | None:
    # The fused loop does not say which sample failed: replay one sample at a time (draws are keyed by
    # sample, so the replay is exact) to name it.
    for i in range(len(job.samples)):
        try:
            stage.function(i, i + 1, job.samples, *arguments)
        except Exception:  # noqa: BLE001 - only locating
            return i
    return None


class _locate:
    """Context manager: name the pipeline, operation, batch and sample of an exception passing through."""

    def __init__(self, plan: Plan, step: Step, job: BatchJob, position: int | None) -> None:
        self.arguments = (plan, (step,), job, position)

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, error: BaseException | None, traceback: Any) -> bool:
        if isinstance(error, Exception) and not getattr(error, "_beton_located", False):
            _annotate(error, *self.arguments)
        return False


def _annotate(error: BaseException, plan: Plan, steps: Sequence[Step], job: BatchJob, position: int | None) -> None:
    if getattr(error, "_beton_located", False):
        return
    where = ", ".join(f"pipeline {plan.output_names[s.output]!r} operation {s.position} {s.operation!r}"
                      for s in steps)
    if position is None:
        sample_text = f"samples {job.samples.tolist()[:8]}{'...' if len(job.samples) > 8 else ''}"
    else:
        sample_text = f"sample {int(job.samples[position])}"
        if isinstance(error, BetonError) and error.sample is None:
            error.sample = int(job.samples[position])
    if isinstance(error, BetonError) and error.field is None and len(steps) == 1:
        error.field = plan.field_names[steps[0].output]
    add_note(error, f"beton: raised in {where}, on {sample_text} (batch {job.index} of epoch {job.epoch})")
    error._beton_located = True  # one note per error, from the innermost place that knows most


def warm_up(plan: Plan, kernel_arguments: dict, buffers: Sequence[np.ndarray], sources: Sequence[Source]) -> None:
    """Compile (or load from the disk cache) every jit stage now, with the real argument types, on 0 samples."""
    job = BatchJob(-1, -1, np.zeros(0, np.int64), 0,
                   {(s.output, s.position): np.uint64(0) for stage in plan.stages for s in stage.steps}, sources)
    values: list[Any] = list(sources)
    for stage in plan.stages:
        if stage.kind == "jit" and all(isinstance(values[s.output], Source) or s.input_buffer is not None
                                       for s in stage.steps):
            _run_jit(stage, plan, kernel_arguments, buffers, job, values)
