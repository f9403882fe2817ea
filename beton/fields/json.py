"""FFCV's import path ``ffcv.fields.json``."""

from beton.fields.bytes import JSONField
from beton.decoders.basic import JSONDecoder

__all__ = ["JSONField", "JSONDecoder"]
