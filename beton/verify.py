"""The import path ``beton.verify`` from before the package was reorganised; it lives in :mod:`beton.storage.verify`."""

from beton.storage.verify import *  # noqa: F401,F403
from beton.storage.verify import __all__  # noqa: F401
