"""The side-by-side benchmark suite (``beton bench``); see :mod:`beton.tools.bench.suite`."""

from beton.tools.bench.suite import run_suite

__all__ = ["run_suite"]
