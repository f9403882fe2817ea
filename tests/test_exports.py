"""The public surface is pinned: adding or removing a name is a decision, not an accident."""

import beton
import beton.errors
import beton.fields


def test_top_level_exports():
    assert sorted(beton.__all__) == sorted([
        "DatasetWriter", "Loader", "OrderOption", "Reader", "verify", "VerifyReport", "BetonError", "FormatError", "CorruptDataError",
        "FieldError", "EncodeError", "DecodeError", "DatasetError", "WriterError", "PipelineError",
        "LoaderError", "StorageError",
    ])
    assert all(hasattr(beton, name) for name in beton.__all__)


def test_field_exports():
    assert sorted(beton.fields.__all__) == sorted([
        "Field", "Encoded", "EncodeContext", "UnknownField", "IntField", "FloatField", "NDArrayField",
        "TorchTensorField", "RaggedArrayField", "BytesField", "JSONField", "RGBImageField", "BUILTIN_FIELDS",
        "register", "unregister", "registered_fields",
    ])


def test_every_error_is_a_beton_error_and_a_builtin():
    for name in beton.errors.__all__:
        error = getattr(beton.errors, name)
        assert issubclass(error, beton.BetonError)
        assert name == "BetonError" or any(
            issubclass(error, builtin) for builtin in (ValueError, RuntimeError, TypeError, OSError)
        )
