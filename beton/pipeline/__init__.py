"""Operations, the compiler that fuses them into numba stages, and the executor that runs a plan."""

from beton.pipeline.operation import (
    BatchContext,
    BatchOperation,
    JitOperation,
    Operation,
    SampleOperation,
    Source,
    SourceState,
    State,
)
from beton.pipeline.spec import PipelineSpec

__all__ = ["Operation", "JitOperation", "SampleOperation", "BatchOperation", "State", "SourceState", "Source",
           "BatchContext", "PipelineSpec"]
