"""Fields: what a column of a dataset is, how it is stored and read back. See :mod:`beton.fields.base`."""

from beton.fields.base import Encoded, EncodeContext, Field, UnknownField
from beton.fields.bytes import BytesField, JSONField
from beton.fields.ndarray import NDArrayField, TorchTensorField
from beton.fields.ragged import RaggedArrayField
from beton.fields.rgb_image import RGBImageField
from beton.fields.registry import register, registered_fields, unregister
from beton.fields.scalar import FloatField, IntField

__all__ = [
    "Field",
    "Encoded",
    "EncodeContext",
    "UnknownField",
    "IntField",
    "FloatField",
    "NDArrayField",
    "TorchTensorField",
    "RaggedArrayField",
    "BytesField",
    "JSONField",
    "RGBImageField",
    "BUILTIN_FIELDS",
    "register",
    "unregister",
    "registered_fields",
]

#: Stored type name -> class, for the fields beton ships.
BUILTIN_FIELDS: dict[str, type[Field]] = {
    cls.type_name: cls
    for cls in (IntField, FloatField, NDArrayField, TorchTensorField, RaggedArrayField, BytesField, JSONField,
                RGBImageField)
}
