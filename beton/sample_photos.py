"""The import path ``beton.sample_photos`` from before the package was reorganised; it lives in :mod:`beton.tools.sample_photos`."""

from beton.tools.sample_photos import *  # noqa: F401,F403
from beton.tools.sample_photos import __all__  # noqa: F401
