"""From the user's ``pipelines=`` argument to the list of (output, field, operations) the compiler takes.

Rules: a field without a pipeline gets its default (``Field.default_pipeline``: its decoder, then ToTensor);
``None`` drops a field; an ``nn.Module`` or a plain callable in a pipeline is wrapped in ModuleWrapper; the
user's dict and lists are read, never modified.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from beton.errors import PipelineError
from beton.fields.base import Field, UnknownField
from beton.pipeline.ffcv_contract import FFCVOperation, follows_ffcv_contract
from beton.pipeline.operation import Operation
from beton.transforms.torch_ops import ModuleWrapper

__all__ = ["resolve_pipelines"]


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
        if name in pipelines:
            operations = [_wrap(op) for op in pipelines[name]]
        else:
            try:
                operations = list(field.default_pipeline())
            except PipelineError as error:
                raise PipelineError(f"field {name!r}: {error}") from None
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
