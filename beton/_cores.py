"""How many cores this process may use (its CPU affinity, not the machine's count)."""

from __future__ import annotations

import os


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def resolve_workers(num_workers: int, minimum: int) -> int:
    """-1 means every usable core; otherwise at least ``minimum`` (0 for the writer: encode in-process)."""
    if num_workers == -1:
        return usable_cores()
    if num_workers < minimum:
        raise ValueError(f"num_workers must be -1 (all cores) or at least {minimum}, got {num_workers}")
    return num_workers
