"""The Loader's grouped options, and the older keywords they replace (still accepted, with a DeprecationWarning).

| older keyword | now |
|---|---|
| ``readahead=`` | ``memory=OSCache(readahead=...)`` |
| ``process_cache_pages=`` | ``memory=ProcessCache(pages=...)`` |
| ``read_bandwidth=`` | ``memory=ProcessCache(read_bandwidth=...)`` |
| ``quasi_random_window=`` | ``order_kwargs={"window_pages": ...}`` |
| ``kernel_cache_dir=`` | ``compile_options=CompileOptions(kernel_cache_dir=...)`` |
| ``fuse_stages=`` | ``compile_options=CompileOptions(fuse_stages=...)`` |
"""

from __future__ import annotations

import dataclasses
import inspect
import warnings
from collections.abc import Mapping
from typing import Any

from beton.memory import OSCache, ProcessCache
from beton.memory.base import MemoryStrategy

__all__ = ["CompileOptions", "legacy_keywords", "resolve_memory", "resolve_compile_options", "resolve_order_kwargs"]


@dataclasses.dataclass(frozen=True)
class CompileOptions:
    """How the Loader compiles its pipelines.

    ``kernel_cache_dir``: where generated stages and numba's compiled code are kept (default
    ``$BETON_CACHE_DIR`` or ``~/.cache/beton/kernels``). ``fuse_stages=False`` compiles each operation
    separately (slower; for measuring what fusion gains).
    """

    kernel_cache_dir: str | None = None
    fuse_stages: bool = True


_MEMORY_KEYWORDS = {"readahead": (OSCache, "readahead"), "process_cache_pages": (ProcessCache, "pages"),
                    "read_bandwidth": (ProcessCache, "read_bandwidth")}
_COMPILE_KEYWORDS = {"kernel_cache_dir": "kernel_cache_dir", "fuse_stages": "fuse_stages"}
_ORDER_KEYWORDS = {"quasi_random_window": "window_pages"}


def legacy_keywords(given: Mapping[str, Any]) -> dict[str, Any]:
    """The older keywords among ``given`` (each warned about, naming its new spelling); any other name is a
    TypeError, as for any unknown keyword argument."""
    unknown = sorted(set(given) - set(_MEMORY_KEYWORDS) - set(_COMPILE_KEYWORDS) - set(_ORDER_KEYWORDS))
    if unknown:
        raise TypeError(f"Loader() got an unexpected keyword argument {unknown[0]!r}")
    for name in given:
        if name in _MEMORY_KEYWORDS:
            kind, option = _MEMORY_KEYWORDS[name]
            new = f"memory={kind.__name__}({option}=...)"
        elif name in _COMPILE_KEYWORDS:
            new = f"compile_options=CompileOptions({_COMPILE_KEYWORDS[name]}=...)"
        else:
            new = f"order_kwargs={{{_ORDER_KEYWORDS[name]!r}: ...}}"
        warnings.warn(f"Loader({name}=...) is deprecated: use {new}", DeprecationWarning, stacklevel=3)
    return dict(given)


def resolve_memory(os_cache: bool | None, memory: MemoryStrategy | None, legacy: Mapping[str, Any]) -> MemoryStrategy:
    """The memory strategy from ``memory=``, FFCV's ``os_cache=`` shorthand and the older keywords, which must
    agree."""
    given = {name: legacy[name] for name in _MEMORY_KEYWORDS if name in legacy}
    if memory is not None:
        if not isinstance(memory, MemoryStrategy):
            raise TypeError(f"memory must be beton.memory.OSCache(...) or ProcessCache(...), got {memory!r}")
        if given:
            raise ValueError(f"give the memory options inside memory={memory!r}, not as {sorted(given)}")
        if os_cache is not None and os_cache != isinstance(memory, OSCache):
            raise ValueError(f"os_cache={os_cache} contradicts memory={memory!r}; give one of them")
        return memory
    kind = ProcessCache if os_cache is False else OSCache  # the default (os_cache=None) is FFCV's: the OS cache
    wrong = sorted(name for name in given if _MEMORY_KEYWORDS[name][0] is not kind)
    if wrong:
        other = ProcessCache if kind is OSCache else OSCache
        raise ValueError(f"{', '.join(wrong)} apply to {other.__name__}, but os_cache={os_cache} chose "
                         f"{kind.__name__}: pass memory={other.__name__}(...) instead")
    return kind(**{_MEMORY_KEYWORDS[name][1]: value for name, value in given.items()})


def resolve_compile_options(compile_options: CompileOptions | None, legacy: Mapping[str, Any]) -> CompileOptions:
    given = {_COMPILE_KEYWORDS[name]: legacy[name] for name in _COMPILE_KEYWORDS if name in legacy}
    if compile_options is not None and given:
        raise ValueError(f"give {sorted(given)} inside compile_options={compile_options!r}, not beside it")
    return compile_options if compile_options is not None else CompileOptions(**given)


def resolve_order_kwargs(order_kwargs: Mapping[str, Any] | None, order_class: Any,
                         legacy: Mapping[str, Any]) -> dict[str, Any]:
    """``order_kwargs``, plus the older ``quasi_random_window`` for the orders that take a window (it was
    ignored by the others)."""
    kwargs = dict(order_kwargs or {})
    window = legacy.get("quasi_random_window")
    if window is not None and isinstance(order_class, type) and "window_pages" in _parameters(order_class):
        if "window_pages" in kwargs:
            raise ValueError("give window_pages in order_kwargs only, not also quasi_random_window=")
        kwargs["window_pages"] = window
    return kwargs


def _parameters(cls: type) -> Mapping[str, inspect.Parameter]:
    try:
        return inspect.signature(cls).parameters
    except (TypeError, ValueError):
        return {}
