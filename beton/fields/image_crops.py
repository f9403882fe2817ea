"""The import path ``beton.fields.image_crops`` from before the package was reorganised; it lives in :mod:`beton.decoders.image_crops`."""

from beton.decoders.image_crops import *  # noqa: F401,F403
from beton.decoders.image_crops import __all__  # noqa: F401
