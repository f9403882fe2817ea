"""How many cores this process may use (its CPU affinity, not the machine's count)."""

from __future__ import annotations

import numbers
import os


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def resolve_workers(num_workers: int, minimum: int) -> int:
    """-1 means every usable core; otherwise a whole number of at least ``minimum`` (0 for the writer: encode
    in-process)."""
    if isinstance(num_workers, bool) or not isinstance(num_workers, numbers.Integral) \
            or num_workers != -1 and num_workers < minimum:
        raise ValueError(f"num_workers must be -1 (all cores) or a whole number of at least {minimum}, "
                         f"got {num_workers!r}")
    num_workers = int(num_workers)
    return usable_cores() if num_workers == -1 else num_workers
