"""How many cores this process may use (its CPU affinity, not the machine's count)."""

from __future__ import annotations

import os


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
