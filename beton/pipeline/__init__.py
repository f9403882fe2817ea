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

__all__ = ["Operation", "JitOperation", "SampleOperation", "BatchOperation", "State", "SourceState", "Source",
           "BatchContext"]
