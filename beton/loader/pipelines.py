"""From the user's ``pipelines=`` argument to the list of (output, field, operations) the compiler takes.

Rules: a field without a pipeline gets its default (``Field.default_pipeline``: its decoder, then ToTensor);
``None`` drops a field; an ``nn.Module`` or a plain callable in a pipeline is wrapped in ModuleWrapper; the
user's dict and lists are read, never modified. :func:`check_pipelines` refuses the argument's usual slips (a list
instead of a dict, one operation instead of a list, a class instead of an instance) naming the fix, before anything
else reads it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import torch

from beton.errors import PipelineError
from beton.fields.base import Field, UnknownField
from beton.pipeline.contracts import as_operation
from beton.pipeline.operation import Operation
from beton.pipeline.spec import PipelineSpec
from beton.transforms.torch_ops import ModuleWrapper

__all__ = ["check_pipelines", "resolve_pipelines"]


def check_pipelines(pipelines: Any) -> None:
    """Refuse a ``pipelines=`` argument that is not a dict of field name -> list of operation instances (or None),
    with a PipelineError naming the argument and the fix; the file is not needed (the fields are checked later)."""
    if pipelines is None:
        return
    if not isinstance(pipelines, Mapping):
        hint = (": name the field each list is for, as pipelines={'image': [...], 'label': [...]}"
                if isinstance(pipelines, (list, tuple)) else "")
        raise PipelineError("pipelines must be a dict field name -> list of operations (None drops a field), got "
                            f"{_a(pipelines)}{hint}")
    for name, operations in pipelines.items():
        if not isinstance(name, str):
            raise PipelineError(f"pipelines must be keyed by field name, got the key {name!r} ({_a(name)})")
        if operations is None:
            continue
        if isinstance(operations, PipelineSpec):
            if not isinstance(operations.source, str):
                raise PipelineError(f"pipeline {name!r}: a PipelineSpec's source must name a field; one whose source "
                                    "is another pipeline's operation (FFCV's branch, sharing that operation's "
                                    "result) is not supported: give each output its own decoder from the field")
            operations = operations.operations()
        if isinstance(operations, (str, bytes, Mapping, Iterator)) or not isinstance(operations, Iterable):
            # an iterator would be used up by the first of the loader's readings
            single = isinstance(operations, type) or isinstance(operations, Operation) or callable(operations)
            raise PipelineError(f"pipeline {name!r} must be a list of operations (or None to drop the field), got "
                                f"{_a(operations)}" + (f": write [{_instance(operations)}]" if single else ""))
        for operation in operations:
            if isinstance(operation, type):
                raise PipelineError(f"pipeline {name!r}: {operation.__name__} is a class; pass an instance: "
                                    f"{_instance(operation)}")


def _a(value: Any) -> str:
    """``a list``, ``an IntDecoder``, ``the class IntDecoder``: what the user passed."""
    if isinstance(value, type):
        return f"the class {value.__name__}"
    kind = type(value).__name__
    return f"{'an' if kind[:1].lower() in 'aeiou' else 'a'} {kind}"


def _instance(operation: Any) -> str:
    """How the user writes ``operation`` as an instance: ``IntDecoder()`` for the class, its repr otherwise."""
    return f"{operation.__name__}()" if isinstance(operation, type) else repr(operation)


def resolve_pipelines(
    fields: Mapping[str, Field], pipelines: Mapping[str, Sequence[Any] | None] | None
) -> list[tuple[str, str, Field, list[Operation]]]:
    check_pipelines(pipelines)
    pipelines = dict(pipelines or {})
    sources = {name: spec.source if isinstance(spec, PipelineSpec) else name for name, spec in pipelines.items()}
    unknown = {source for source in sources.values() if source not in fields}
    if unknown:
        raise PipelineError(f"pipelines name fields the file does not have: {sorted(unknown)}; "
                            f"fields are {list(fields)}")
    # FFCV's order: the fields' outputs in the file's order, then the outputs named after no field, as given
    names = [name for name in fields if pipelines.get(name, ()) is not None]
    names += [name for name, spec in pipelines.items() if name not in fields and spec is not None]
    resolved = []
    for name in names:
        source = sources.get(name, name)
        field = fields[source]
        if isinstance(field, UnknownField):
            raise PipelineError(f"field {source!r}: {field.reason}")
        resolved.append((name, source, field, _operations(name, field, pipelines.get(name))))
    if not resolved:
        raise PipelineError("every field is dropped: nothing to load")
    _check_shared_state_placed_once(resolved)
    return resolved


def _operations(name: str, field: Field, given: Sequence[Any] | PipelineSpec | None) -> list[Operation]:
    """Output ``name``'s operations: the field's default pipeline where none is given (or an empty
    PipelineSpec); else those given, the field's default decoder first where they do not start with a decoder
    (FFCV's rule: ``[ToTensor()]`` for an int field is its IntDecoder, then ToTensor)."""
    operations = None if given is None else given.operations() if isinstance(given, PipelineSpec) else list(given)
    if not operations:
        try:
            return list(field.default_pipeline())
        except PipelineError as error:
            raise PipelineError(f"field {name!r}: {error}") from None
    wrapped = [_wrap(name, op) for op in operations]
    if not (wrapped[0].is_decoder or wrapped[0].decodes_when_first):
        try:
            decoder = field.default_pipeline()[0]
        except PipelineError as error:
            raise PipelineError(f"pipeline {name!r} starts with {wrapped[0]!r}, not a decoder, and {error}") from None
        wrapped.insert(0, decoder)
    return wrapped


def _check_shared_state_placed_once(resolved: list[tuple[str, str, Field, list[Operation]]]) -> None:
    """FFCV gives an operation with shared state placed in several pipelines one memory for all of them; beton
    runs each placement on its own, so that is refused rather than run differently
    (:meth:`Operation.placement_key`)."""
    places: dict[int, list[str]] = {}
    for name, _, _, operations in resolved:
        for position, operation in enumerate(operations):
            key = operation.placement_key()
            if key is not None:
                places.setdefault(id(key), []).append(f"{name}[{position}]")
    for found in places.values():
        if len(found) > 1:
            raise PipelineError(f"an operation with shared state (FFCV's generate_code_for_shared_state) is placed "
                                f"in {len(found)} places ({', '.join(found)}); beton runs shared state for an "
                                "operation placed once: give each pipeline its own instance")


def _wrap(name: str, operation: Any) -> Operation:
    adapted = as_operation(operation)  # written to another library's contract (FFCV's)
    if adapted is not None:
        return adapted
    if isinstance(operation, Operation):
        return operation
    if isinstance(operation, torch.nn.Module) or callable(operation):
        return ModuleWrapper(operation)
    raise PipelineError(f"pipeline {name!r}: {operation!r} is neither an Operation nor a callable")
