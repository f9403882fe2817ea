"""The import path ``beton.bench.contenders`` from before the package was reorganised; it lives in :mod:`beton.tools.bench.contenders`."""

from beton.tools.bench.contenders import *  # noqa: F401,F403
from beton.tools.bench.contenders import __all__  # noqa: F401
