"""Where decoders read payloads from: the OS page cache (memory map) or a process-level page cache."""

from beton.memory.os_cache import OSCache
from beton.memory.process_cache import ProcessCache

__all__ = ["OSCache", "ProcessCache"]
