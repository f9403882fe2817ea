"""FFCV's import path ``ffcv.fields.basics``: the scalar fields, their decoders and the decoders' base,
``BasicDecoder``."""

from beton.decoders.basic import BasicDecoder, FloatDecoder, IntDecoder
from beton.fields.scalar import FloatField, IntField

__all__ = ["IntField", "FloatField", "IntDecoder", "FloatDecoder", "BasicDecoder"]
