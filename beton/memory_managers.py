"""FFCV's import path ``ffcv.memory_managers``: the Loader's two memory strategies, under FFCV's names.

The Loader builds them itself (``os_cache=True`` or ``False``); the names are here so that FFCV scripts that
import them keep importing.
"""

from beton.memory.os_cache import OSCache as OSCacheManager
from beton.memory.process_cache import ProcessCache as ProcessCacheManager

__all__ = ["OSCacheManager", "ProcessCacheManager"]
