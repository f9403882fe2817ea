"""The import path ``beton.fields.lossless_codec`` from before the package was reorganised; it lives in :mod:`beton.codecs.lossless`."""

from beton.codecs.lossless import *  # noqa: F401,F403
from beton.codecs.lossless import __all__  # noqa: F401
