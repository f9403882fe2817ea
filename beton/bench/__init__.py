"""The side-by-side benchmark suite (``beton bench``); see :mod:`beton.bench.suite`."""

from beton.bench.suite import run_suite

__all__ = ["run_suite"]
