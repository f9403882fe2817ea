"""FFCV's import path ``ffcv.memory_managers``: the Loader's two running memory layers, under FFCV's names.

As in FFCV, the Loader builds them itself, here from ``os_cache=`` or a declared strategy
(``memory=beton.memory.OSCache(...)`` or ``ProcessCache(...)``); the names are here so that FFCV scripts that
import them keep importing.
"""

from beton.memory.os_cache import OSCacheLayer as OSCacheManager
from beton.memory.process_cache import ProcessCacheLayer as ProcessCacheManager

__all__ = ["OSCacheManager", "ProcessCacheManager"]
