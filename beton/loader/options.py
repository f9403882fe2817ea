"""The Loader's grouped options: how it compiles, and where its memory comes from."""

from __future__ import annotations

import dataclasses

from beton.memory import OSCache, ProcessCache
from beton.memory.base import MemoryStrategy

__all__ = ["CompileOptions", "resolve_memory"]


@dataclasses.dataclass(frozen=True)
class CompileOptions:
    """How the Loader compiles its pipelines.

    ``kernel_cache_dir``: where generated stages and numba's compiled code are kept (default
    ``$BETON_CACHE_DIR`` or ``~/.cache/beton/kernels``). ``fuse_stages=False`` compiles each operation
    separately (slower; for measuring what fusion gains).
    """

    kernel_cache_dir: str | None = None
    fuse_stages: bool = True


def resolve_memory(os_cache: bool | None, memory: MemoryStrategy | None) -> MemoryStrategy:
    """The memory strategy from ``memory=`` and FFCV's ``os_cache=`` shorthand, which must agree."""
    if memory is None:
        return ProcessCache() if os_cache is False else OSCache()  # the default (os_cache=None) is FFCV's
    if not isinstance(memory, MemoryStrategy):
        raise TypeError(f"memory must be beton.memory.OSCache(...) or ProcessCache(...), got {memory!r}")
    if os_cache is not None and os_cache != isinstance(memory, OSCache):
        raise ValueError(f"os_cache={os_cache} contradicts memory={memory!r}; give one of them")
    return memory
