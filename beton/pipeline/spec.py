"""From the user's ``pipelines=`` argument to the list of (output, field, operations) the compiler takes.

Rules: a field without a pipeline gets its default decoder followed by ToTensor; ``None`` drops a field;
an ``nn.Module`` or a plain callable in a pipeline is wrapped in ModuleWrapper; the user's dict and lists are
read, never modified.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from beton.errors import PipelineError
from beton.fields import BytesField, FloatField, IntField, JSONField, NDArrayField, RGBImageField, TorchTensorField
from beton.fields.base import Field, UnknownField
from beton.fields.decoders import (
    BytesDecoder,
    FloatDecoder,
    IntDecoder,
    JSONDecoder,
    NDArrayDecoder,
    SimpleRGBImageDecoder,
    TorchTensorDecoder,
)
from beton.pipeline.ffcv_contract import FFCVOperation, follows_ffcv_contract
from beton.pipeline.operation import Operation
from beton.transforms.torch_ops import ModuleWrapper, ToTensor, ViewAs

__all__ = ["resolve_pipelines", "default_pipeline"]


def default_pipeline(field: Field) -> list[Operation]:
    """What a field decodes to when the user gives no pipeline for it."""
    if isinstance(field, IntField):
        return [IntDecoder(), ToTensor()]
    if isinstance(field, FloatField):
        return [FloatDecoder(), ToTensor()]
    if isinstance(field, NDArrayField):
        return [NDArrayDecoder(), ToTensor()]
    if isinstance(field, TorchTensorField):
        return [TorchTensorDecoder(), ToTensor(), ViewAs(field.dtype)]
    if isinstance(field, BytesField):
        return [BytesDecoder()]
    if isinstance(field, JSONField):
        return [JSONDecoder()]
    if isinstance(field, RGBImageField):
        return [SimpleRGBImageDecoder(), ToTensor()]
    default = getattr(field, "default_pipeline", None)
    if callable(default):
        return list(default())
    raise PipelineError(f"field type {field.stored_type_name()} has no default decoder; give a pipeline for it")


def resolve_pipelines(
    fields: Mapping[str, Field], pipelines: Mapping[str, Sequence[Any] | None] | None
) -> list[tuple[str, str, Field, list[Operation]]]:
    pipelines = dict(pipelines or {})
    unknown = set(pipelines) - set(fields)
    if unknown:
        raise PipelineError(f"pipelines name fields the file does not have: {sorted(unknown)}; "
                            f"fields are {list(fields)}")
    resolved = []
    for name, field in fields.items():
        if name in pipelines and pipelines[name] is None:
            continue  # dropped
        if isinstance(field, UnknownField):
            raise PipelineError(f"field {name!r}: {field.reason}")
        operations = default_pipeline(field) if name not in pipelines else [_wrap(op) for op in pipelines[name]]
        resolved.append((name, name, field, operations))
    if not resolved:
        raise PipelineError("every field is dropped: nothing to load")
    return resolved


def _wrap(operation: Any) -> Operation:
    if follows_ffcv_contract(operation):
        return FFCVOperation(operation)
    if isinstance(operation, Operation):
        return operation
    if isinstance(operation, torch.nn.Module) or callable(operation):
        return ModuleWrapper(operation)
    raise PipelineError(f"{operation!r} is neither an Operation nor a callable")
