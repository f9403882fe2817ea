"""The public surface is pinned: adding or removing a name is a decision, not an accident."""

import beton
import beton.errors
import beton.fields


def test_top_level_exports():
    assert sorted(beton.__all__) == sorted([
        "DatasetWriter", "Loader", "OrderOption", "Reader", "RemoteOptions", "verify", "VerifyReport", "BetonError", "FormatError", "CorruptDataError",
        "FieldError", "EncodeError", "DecodeError", "DatasetError", "WriterError", "PipelineError",
        "LoaderError", "ResumeError", "StorageError",
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


#: Test helpers that must reach inside by design, and why.
WHITE_BOX = {"epoch_stress.py": "wraps the epoch engine's internal hand-offs with random delays to shake out races"}


def test_the_tests_import_only_public_names():
    """Tests use beton as users do: a private name they need is a name the package should make public."""
    import ast
    import pathlib

    private = []
    for path in sorted(pathlib.Path(__file__).parent.rglob("*.py")):
        if path.name in WHITE_BOX:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("beton"):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names if alias.name.startswith("beton")]
            else:
                continue
            dotted = [f"{node.module}.{name}" if isinstance(node, ast.ImportFrom) else name for name in names]
            private += [f"{path.name}:{node.lineno} {name}" for name in dotted
                        if any(part.startswith("_") and part != "__version__" for part in name.split("."))]
    assert not private
