"""The import path ``beton.fields.rgb_image_decoders`` from before the package was reorganised; it lives in :mod:`beton.decoders.rgb_image`."""

from beton.decoders.rgb_image import *  # noqa: F401,F403
from beton.decoders.rgb_image import __all__  # noqa: F401
