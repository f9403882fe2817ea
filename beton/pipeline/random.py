"""The kernels' random numbers' earlier import path; they live in :mod:`beton.random` with the other seed schemes."""

from beton.random import integer, mix64, operation_key, uniform

__all__ = ["operation_key", "uniform", "integer", "mix64"]
