"""FFCV's import path ``ffcv.fields.decoders``; beton's decoders live in :mod:`beton.decoders`."""

from beton.decoders import *  # noqa: F401,F403
from beton.decoders import __all__  # noqa: F401
