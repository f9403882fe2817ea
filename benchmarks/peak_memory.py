"""The peak resident memory of a stretch of this process (Linux), for the attack scripts beside this file."""

from __future__ import annotations

__all__ = ["reset_peak", "peak_growth_mb"]


def reset_peak() -> int | None:
    """Restart the peak RSS (VmHWM) from the current RSS and return that, in KiB; None where it cannot."""
    try:
        with open("/proc/self/clear_refs", "w") as file:
            file.write("5")
        return _status("VmRSS")
    except OSError:
        return None


def peak_growth_mb(before: int | None) -> float | None:
    """How far the peak RSS rose above ``before`` (from :func:`reset_peak`), in MB; None where unknown."""
    return None if before is None else round((_status("VmHWM") - before) / 1024, 1)


def _status(name: str) -> int:
    with open("/proc/self/status") as file:
        return next(int(line.split()[1]) for line in file if line.startswith(name + ":"))
