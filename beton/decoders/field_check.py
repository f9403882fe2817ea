"""Which field a decoder reads: checked against the field's class path, since decoders sit below the fields.

A field names its default decoder (:meth:`beton.fields.Field.default_pipeline`), so the decoders may not
import the field classes; they name the classes they read instead. The check follows the field's class
hierarchy, so a user's subclass of ``IntField`` is read by ``IntDecoder`` as an ``IntField`` is.
"""

from __future__ import annotations

from typing import Any

from beton.errors import PipelineError
from beton.pipeline.operation import SourceState

__all__ = ["require_field", "is_field"]


def is_field(field: Any, *class_paths: str) -> bool:
    """Whether ``field`` is an instance of one of the classes named ``module.ClassName`` (or a subclass)."""
    return any(f"{cls.__module__}.{cls.__qualname__}" in class_paths for cls in type(field).__mro__)


def require_field(operation: Any, previous: Any, *class_paths: str) -> SourceState:
    """The source a decoder reads; PipelineError unless the decoder comes first and reads one of the classes."""
    names = " or ".join(path.rsplit(".", 1)[-1] for path in class_paths)
    if not isinstance(previous, SourceState):
        described = previous.describe() if hasattr(previous, "describe") else repr(previous)
        raise PipelineError(f"{operation!r} decodes {names} and must be the first operation of a pipeline, "
                            f"not after {described}")
    if not is_field(previous.field, *class_paths):
        raise PipelineError(f"{operation!r} decodes {names}, but field {previous.field_name!r} is "
                            f"{previous.field.describe()}")
    return previous
