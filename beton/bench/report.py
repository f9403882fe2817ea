"""The import path ``beton.bench.report`` from before the package was reorganised; it lives in :mod:`beton.tools.bench.report`."""

from beton.tools.bench.report import *  # noqa: F401,F403
from beton.tools.bench.report import __all__  # noqa: F401
