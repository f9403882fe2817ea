"""Batch operations on torch tensors: conversion from numpy, layout, dtype, device, and arbitrary modules."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from beton.errors import PipelineError
from beton.pipeline.operation import BatchContext, BatchOperation, State, torch_dtype
from beton.pipeline.ragged import Packed, Padded, is_ragged, map_parts


__all__ = ["ToTensor", "ToTorchImage", "Squeeze", "Convert", "ViewAs", "View", "ToDevice", "ModuleWrapper"]


_ANY_LAYOUT = frozenset({"dense", "padded", "packed"})


@dataclasses.dataclass(frozen=True)
class ToTensor(BatchOperation):
    """numpy batch -> torch tensor sharing its memory (no copy); both parts of a Padded or Packed batch."""

    layouts = _ANY_LAYOUT

    def output_state(self, previous: State) -> State:
        previous.require(isinstance(previous, State) and previous.kind == "numpy", self, "a numpy batch")
        native = np.dtype(previous.dtype).newbyteorder("=")
        try:
            dtype = torch_dtype(native)
        except TypeError:
            raise PipelineError(f"{self!r}: torch has no dtype for {native} batches; leave ToTensor out to get "
                                f"numpy batches") from None
        return State(previous.shape, dtype, kind="torch", layout=previous.layout)

    def apply(self, batch: Any, context: BatchContext) -> Any:
        if type(batch) is np.ndarray and batch.dtype.isnative:  # the common case, straight: it runs per batch
            return torch.from_numpy(batch)
        return map_parts(_tensor, batch)


def _tensor(array: np.ndarray) -> torch.Tensor:
    """The batch as a tensor sharing its memory; big-endian numbers (which torch cannot view) as a native copy."""
    if not array.dtype.isnative:
        array = array.astype(array.dtype.newbyteorder("="))
    return torch.from_numpy(array)


def _require_torch(operation: BatchOperation, previous: State) -> None:
    previous.require(isinstance(previous, State) and previous.kind == "torch", operation, "a torch batch (add ToTensor())")


@dataclasses.dataclass(frozen=True)
class ToTorchImage(BatchOperation):
    """HWC images -> CHW tensors; with ``channels_last`` the memory stays HWC (torch's channels_last format).

    ``convert_back_int16`` is taken for FFCV's programs and changes nothing: FFCV's NormalizeImage hands float16
    images on as int16 bits for this step to view as float16 again, beton's hands on float16 itself, so every
    int16 batch reaching this step holds int16 values and stays int16.
    """

    channels_last: bool = True
    convert_back_int16: bool = True

    def output_state(self, previous: State) -> State:
        _require_torch(self, previous)
        previous.require(len(previous.shape) == 3, self, "HxWxC images")
        height, width, channels = previous.shape
        return dataclasses.replace(previous, shape=(channels, height, width))

    def apply(self, batch: torch.Tensor, context: BatchContext) -> torch.Tensor:
        chw = batch.permute(0, 3, 1, 2)
        return chw if self.channels_last else chw.contiguous()


@dataclasses.dataclass(frozen=True, init=False)
class Squeeze(BatchOperation):
    """Remove per-sample dimensions of size 1: all of them, or those given.

    ``Squeeze(1)`` counts dimensions of the batch tensor, as FFCV's and ``torch.squeeze`` do (dimension 0 is
    the batch, which cannot be squeezed); ``Squeeze(dims=(0,))`` counts them per sample. Both mean the same.
    """

    dims: tuple[int, ...] | None = None  # per sample

    def __init__(self, *batch_dims: int, dims: tuple[int, ...] | None = None) -> None:
        if batch_dims and dims is not None:
            raise ValueError("give batch dimensions (Squeeze(1)) or per-sample dims= (Squeeze(dims=(0,))), not both")
        if any(d == 0 for d in batch_dims):
            raise ValueError("dimension 0 is the batch and cannot be squeezed; per-sample dimensions start at 1")
        if batch_dims:
            dims = tuple(d - 1 if d > 0 else d for d in batch_dims)
        object.__setattr__(self, "dims", None if dims is None else tuple(dims))

    def output_state(self, previous: State) -> State:
        _require_torch(self, previous)
        if self.dims is None:
            shape = tuple(size for size in previous.shape if size != 1)
        else:
            rank = len(previous.shape)
            previous.require(all(-rank <= d < rank and previous.shape[d] == 1 for d in self.dims), self,
                             f"size 1 at per-sample dims {self.dims}")
            dims = {d % rank for d in self.dims}
            shape = tuple(size for d, size in enumerate(previous.shape) if d not in dims)
        return dataclasses.replace(previous, shape=shape)

    def apply(self, batch: torch.Tensor, context: BatchContext) -> torch.Tensor:
        sample_shape = self.output_state(State(tuple(batch.shape[1:]), batch.dtype, kind="torch")).shape
        return batch.reshape((batch.shape[0],) + sample_shape)


@dataclasses.dataclass(frozen=True)
class Convert(BatchOperation):
    """Change the tensor dtype (values converted, as ``tensor.to(dtype)``; a Padded or Packed batch's values)."""

    target_dtype: Any  # FFCV's name

    layouts = _ANY_LAYOUT

    def output_state(self, previous: State) -> State:
        _require_torch(self, previous)
        return dataclasses.replace(previous, dtype=torch_dtype(self.target_dtype))

    def apply(self, batch: Any, context: BatchContext) -> Any:
        if is_ragged(batch):
            return batch._replace(values=batch.values.to(torch_dtype(self.target_dtype)))
        return batch.to(torch_dtype(self.target_dtype))


@dataclasses.dataclass(frozen=True)
class ViewAs(BatchOperation):
    """Reinterpret the batch's bits as another dtype of the same size (e.g. uint16 -> bfloat16), on numpy
    arrays (``ndarray.view``) or torch tensors (``Tensor.view``)."""

    target_dtype: Any  # FFCV's name

    def output_state(self, previous: State) -> State:
        previous.require(isinstance(previous, State) and previous.kind in ("numpy", "torch"), self,
                         "a numpy or torch batch")
        target = np.dtype(self.target_dtype) if previous.kind == "numpy" else torch_dtype(self.target_dtype)
        previous.require(target.itemsize == previous.dtype.itemsize, self, f"a dtype of {target.itemsize} bytes")
        return dataclasses.replace(previous, dtype=target)

    def apply(self, batch: Any, context: BatchContext) -> Any:
        if isinstance(batch, np.ndarray):
            return batch.view(np.dtype(self.target_dtype))
        target = torch_dtype(self.target_dtype)
        return batch if batch.dtype == target else batch.view(target)


View = ViewAs  # FFCV's name


@dataclasses.dataclass(frozen=True)
class ToDevice(BatchOperation):
    """Move the batch to a device; pinned and non-blocking only when CUDA is there to use it."""

    device: Any
    non_blocking: bool = True

    layouts = _ANY_LAYOUT

    def output_state(self, previous: State) -> State:
        _require_torch(self, previous)
        return dataclasses.replace(previous, device=str(torch.device(self.device)))

    def apply(self, batch: Any, context: BatchContext) -> Any:
        return map_parts(self._move, batch)  # both parts of a Padded or Packed batch

    def _move(self, tensor: torch.Tensor) -> torch.Tensor:
        device = torch.device(self.device)
        if device.type == "cuda" and torch.cuda.is_available() and tensor.device.type == "cpu":
            if tensor.is_pinned():
                # pinned already (a slot's buffer, where an operation asked for pinned memory): pin_memory() would
                # give this very buffer, and an asynchronous copy could still be reading it when the slot is
                # filled with a later batch, so this copy completes before the batch moves on
                return tensor.to(device, non_blocking=False)
            return tensor.pin_memory().to(device, non_blocking=self.non_blocking)
        return tensor.to(device)


@dataclasses.dataclass(frozen=True)
class ModuleWrapper(BatchOperation):
    """Any ``torch.nn.Module`` or callable applied to the whole batch (torch tensors in, tensors out).

    A Padded or Packed batch reaches the callable as it is (a named tuple of tensors); it may return a tensor
    or such a tuple. The output State is found by calling the module once on a one-sample batch of zeros
    (``(1,)`` for a field of scalars such as a label, ``(1, *shape)`` otherwise), on the batch's device.
    """

    module: Callable[[Any], Any]

    layouts = _ANY_LAYOUT

    def output_state(self, previous: State) -> State:
        _require_torch(self, previous)
        with torch.no_grad():
            result = self.module(_probe(previous))
        if isinstance(result, Padded):
            return dataclasses.replace(previous, shape=tuple(result.values.shape[1:]), dtype=result.values.dtype,
                                       layout="padded")
        if isinstance(result, Packed):
            return dataclasses.replace(previous, shape=(previous.shape[0], *result.values.shape[1:]),
                                       dtype=result.values.dtype, layout="packed")
        if not isinstance(result, torch.Tensor):
            raise PipelineError(f"{self!r} returned {type(result).__name__} for a one-sample batch of "
                                f"{previous.describe()}; a callable in a pipeline returns a torch tensor (or a "
                                "Padded or Packed batch of them)")
        return dataclasses.replace(previous, shape=tuple(result.shape[1:]), dtype=result.dtype, layout="dense")

    def apply(self, batch: torch.Tensor, context: BatchContext) -> torch.Tensor:
        return self.module(batch)


def _probe(state: State) -> Any:
    """A one-sample batch of zeros as ``state`` describes it: a tensor, or a Padded or Packed batch.

    Only the layout's own batch is built: a Packed batch's capacity is ``shape[0]``, which a dense batch of
    scalars (shape ``()``) does not have.
    """
    values = torch.zeros((1, *state.shape), dtype=state.dtype, device=state.device)
    if state.layout == "padded":
        return Padded(values, torch.ones(1, dtype=torch.int64, device=state.device))
    if state.layout == "packed":
        capacity = state.shape[0]
        return Packed(values[0], torch.tensor([0, capacity], device=state.device), capacity)
    return values
