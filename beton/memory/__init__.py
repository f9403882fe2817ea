"""Where decoders read payloads from: a declared strategy, :class:`OSCache` (a memory map of the file, the OS
page cache) or :class:`ProcessCache` (pages read ahead into a bounded pool of this process).

``Loader(memory=OSCache(readahead=False))``, ``Loader(memory=ProcessCache(pages=..., read_bandwidth=...))``;
FFCV's ``os_cache=True``/``False`` is the shorthand for the defaults of each. :mod:`beton.memory.base` holds
the protocol the epoch engine calls.
"""

from beton.memory.base import MemoryCounters, MemoryLayer, MemoryStrategy
from beton.memory.os_cache import OSCache, OSCacheLayer
from beton.memory.process_cache import ProcessCache, ProcessCacheLayer

__all__ = ["OSCache", "ProcessCache", "MemoryStrategy", "MemoryLayer", "MemoryCounters", "OSCacheLayer",
           "ProcessCacheLayer"]
