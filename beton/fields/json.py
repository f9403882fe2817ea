"""FFCV's import path ``ffcv.fields.json``."""

from beton.fields.bytes import JSONField
from beton.fields.decoders import JSONDecoder

__all__ = ["JSONField", "JSONDecoder"]
