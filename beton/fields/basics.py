"""FFCV's import path ``ffcv.fields.basics``: the scalar fields and their decoders."""

from beton.decoders.basic import FloatDecoder, IntDecoder
from beton.fields.scalar import FloatField, IntField

__all__ = ["IntField", "FloatField", "IntDecoder", "FloatDecoder"]
