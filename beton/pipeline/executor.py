"""Running a compiled plan on one batch, in one worker thread, inside one slot's preallocated buffers."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from beton.errors import locate
from beton.pipeline.compiler import Plan, Stage, Step
from beton.pipeline.operation import BatchContext, Source, SourceState
from beton.pipeline.ragged import Padded, map_parts
from beton.pipeline.sample_loop import SampleLoop

__all__ = ["run_batch", "warm_up", "step_key"]


def run_batch(plan: Plan, kernel_arguments: dict, buffers: Sequence[np.ndarray], batch: BatchContext,
              share: Callable[[SampleLoop | None], None] | None = None) -> tuple:
    """Run every stage of ``batch`` (its samples, keys and sources) into ``buffers``, its slot's output buffers;
    return one value per output (numpy views of the buffers, tensors, lists). ``share(loop)`` offers each
    per-sample stage to idle workers while it runs, ``share(None)`` withdraws it (see
    :mod:`beton.pipeline.sample_loop`)."""
    count = len(batch.samples)
    values: list[Any] = list(batch.sources)
    in_buffer = [False] * len(values)  # whether values[o] is a whole (batch_size-long) slot buffer
    for stage in plan.stages:
        if stage.kind == "jit":
            _run_jit(stage, plan, kernel_arguments, buffers, batch, values)
            for step in stage.steps:
                values[step.output] = _slot_value(buffers, step.buffer, step.lengths_buffer)
                in_buffer[step.output] = True
            continue
        (step,) = stage.steps
        current = _first(values[step.output], count) if in_buffer[step.output] else values[step.output]
        context = batch.with_key(step_key(step, batch.keys))
        if stage.kind == "sample":
            destination = _slot_value(buffers, step.buffer, step.lengths_buffer)
            _apply_per_sample(plan, step, batch, current, destination, context, share)
            values[step.output], in_buffer[step.output] = destination, True
            continue
        try:
            values[step.output], in_buffer[step.output] = step.operation.apply(current, context), False
        except Exception as error:
            _annotate(error, plan, (step,), batch, None)
            raise
    return tuple(_first(value, count) if whole else value for value, whole in zip(values, in_buffer))


def _apply_per_sample(plan: Plan, step: Step, batch: BatchContext, current: Any, destination: Any,
                      context: BatchContext, share: Callable[[SampleLoop | None], None] | None) -> None:
    loop = SampleLoop(step.operation.apply, batch.samples, current, destination, context)
    if share is not None:
        share(loop)
    try:
        loop.run()
    finally:
        failure = loop.finish()  # also when run() was interrupted: no helper may outlive the batch's buffers
        if share is not None:
            share(None)
    if failure is not None:
        i, error = failure
        if isinstance(error, Exception):
            _annotate(error, plan, (step,), batch, i)
        raise error


def step_key(step: Step, keys: dict[tuple[int, int], np.uint64]) -> Any:
    """The step's random key: its own, or the keys of the operations it follows (a uint64 array)."""
    if step.key_sources:
        return np.array([keys[source] for source in step.key_sources], np.uint64)
    return keys[step.output, step.position]


def _slot_value(buffers: Sequence[np.ndarray], buffer: int, lengths: int | None) -> Any:
    return buffers[buffer] if lengths is None else Padded(buffers[buffer], buffers[lengths])


def _first(value: Any, count: int) -> Any:
    """The first ``count`` samples of a whole slot buffer (or of a padded pair of them)."""
    if type(value) is np.ndarray:  # the common case, without map_parts' calls: this runs per output per batch
        return value[:count]
    return map_parts(lambda part: part[:count], value)


def _copy_into(whole: Any, value: Any) -> None:
    """Copy a batch (an array, or a padded pair, of the batch's rows) into the first rows of slot buffers."""
    if isinstance(value, Padded):
        whole.values[: len(value.values)] = value.values
        whole.lengths[: len(value.lengths)] = value.lengths
    else:
        whole[: len(value)] = value


def _kernel_view(buffers: Sequence[np.ndarray], buffer: int, lengths: int | None) -> Any:
    """What a kernel gets for a slot buffer: the array, or for a padded batch (values as bytes, lengths)."""
    if lengths is None:
        return buffers[buffer]
    values = buffers[buffer]
    return values.reshape(len(values), -1).view(np.uint8), buffers[lengths]


def _jit_arguments(stage: Stage, kernel_arguments: dict, buffers: Sequence[np.ndarray], batch: BatchContext,
                   values: list[Any]) -> list[Any]:
    arguments: list[Any] = []
    for step in stage.steps:
        source = values[step.output]
        if step.copies_input:  # an in-place kernel reads its own buffer: the input goes there first
            _copy_into(_slot_value(buffers, step.buffer, step.lengths_buffer), source)
            source = _kernel_view(buffers, step.buffer, step.lengths_buffer)
        elif step.input_buffer is not None:
            source = _kernel_view(buffers, step.input_buffer, step.input_lengths_buffer)
        elif isinstance(source, Source):
            source = source.as_tuple()
        arguments += [source, _kernel_view(buffers, step.buffer, step.lengths_buffer), step_key(step, batch.keys),
                      kernel_arguments[step.output, step.position]]
    return arguments


def _run_jit(stage: Stage, plan: Plan, kernel_arguments: dict, buffers: Sequence[np.ndarray], batch: BatchContext,
             values: list[Any]) -> None:
    arguments = _jit_arguments(stage, kernel_arguments, buffers, batch, values)
    try:
        stage.function(0, len(batch.samples), batch.samples, *arguments)
    except Exception as error:
        _annotate(error, plan, stage.steps, batch, _first_failing_row(stage, batch, arguments))
        raise


def _first_failing_row(stage: Stage, batch: BatchContext, arguments: list[Any]) -> int | None:
    # The fused loop does not say which sample failed: replay one sample at a time (draws are keyed by
    # sample, so the replay is exact) to name it.
    for i in range(len(batch.samples)):
        try:
            stage.function(i, i + 1, batch.samples, *arguments)
        except Exception:  # noqa: BLE001 - only locating
            return i
    return None


def _annotate(error: BaseException, plan: Plan, steps: Sequence[Step], batch: BatchContext, row: int | None) -> None:
    if getattr(error, "_beton_located", False):
        return
    where = ", ".join(f"pipeline {plan.output_names[s.output]!r} operation {s.position} {s.operation!r}"
                      for s in steps)
    if row is None:
        sample_text = f"samples {batch.samples.tolist()[:8]}{'...' if len(batch.samples) > 8 else ''}"
    else:
        sample_text = f"sample {int(batch.samples[row])}"
    locate(error, note=f"beton: raised in {where}, on {sample_text} (batch {batch.batch} of epoch {batch.epoch})",
           sample=None if row is None else int(batch.samples[row]),
           field=plan.field_names[steps[0].output] if len(steps) == 1 else None)
    error._beton_located = True  # one note per error, from the innermost place that knows most


def warm_up(plan: Plan, kernel_arguments: dict, buffers: Sequence[np.ndarray], sources: Sequence[Source]) -> None:
    """Compile (or load from the disk cache) every jit stage now, with the real argument types, on 0 samples."""
    batch = BatchContext(np.zeros(0, np.int64), 0, batch=-1, sources=tuple(sources),
                         keys={(s.output, s.position): np.uint64(0) for stage in plan.stages for s in stage.steps})
    values: list[Any] = list(sources)
    for stage in plan.stages:
        # only stages whose inputs are known now: decoders' sources and slot buffers (not Python steps' results)
        if stage.kind == "jit" and all(isinstance(s.input_state, SourceState) or s.input_buffer is not None
                                       for s in stage.steps):
            _run_jit(stage, plan, kernel_arguments, buffers, batch, values)
