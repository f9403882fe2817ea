"""numba's threading layer, chosen explicitly before any parallel kernel runs.

beton's own stages are not ``parallel=True`` (worker threads give the parallelism), but users' operations may
be, and they then run from several threads at once. numba's default may pick ``workqueue``, which aborts the
process when two threads enter parallel kernels concurrently. ``threadsafe`` makes numba choose OpenMP or TBB,
both safe for concurrent use. A layer chosen by the user (``NUMBA_THREADING_LAYER`` or
``numba.config.THREADING_LAYER``), or one already started, is left alone.
"""

from __future__ import annotations

import numba

__all__ = ["ensure_thread_safe_layer"]


def ensure_thread_safe_layer() -> str:
    """Select numba's "threadsafe" layer unless a choice was made already; return the configured choice."""
    from numba.np.ufunc import parallel

    if not getattr(parallel, "_is_initialized", False) and numba.config.THREADING_LAYER == "default":
        numba.config.THREADING_LAYER = "threadsafe"
    return numba.config.THREADING_LAYER
