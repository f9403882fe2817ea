"""The import path ``beton.bench.suite`` from before the package was reorganised; it lives in :mod:`beton.tools.bench.suite`."""

from beton.tools.bench.suite import *  # noqa: F401,F403
from beton.tools.bench.suite import __all__  # noqa: F401
