"""The public surface is pinned: adding or removing a name is a decision, not an accident."""

import beton
import beton.errors
import beton.fields


def test_top_level_exports():
    assert sorted(beton.__all__) == sorted([
        "DatasetWriter", "Loader", "OrderOption", "Reader", "verify", "VerifyReport", "BetonError", "FormatError", "CorruptDataError",
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


#: Import paths users had before the package was reorganised (1ac545e: the README, docs and examples showed
#: them), with the names each one offered then.
OLD_PATHS = {
    "beton.verify": ["verify", "VerifyReport"],
    "beton.tune": ["HostProfile", "MixPlan", "measure_host", "measure_read_bandwidth", "plan_mix",
                   "write_balanced", "tune"],
    "beton.cli": ["main", "describe"],
    "beton.sample_photos": ["PHOTO_NAMES", "load_photo", "photo_crop"],
    "beton.convert": ["ImageFolder", "convert_image_folder", "convert_arrays", "fields_for_arrays"],
    "beton.bench": ["run_suite"],
    "beton.bench.report": [],
    "beton.bench.data": [],
    "beton.bench.timing": ["epoch_rate", "alternating_runs", "alternating_rates", "paired_ratio"],
    "beton.bench.suite": [],
    "beton.bench.contenders": [],
    "beton.fields.rgb_image_decoders": ["SimpleRGBImageDecoder", "RandomResizedCropRGBImageDecoder",
                                        "CenterCropRGBImageDecoder", "choose_dct_factor"],
    "beton.fields.lossless_codec": ["encode_lossless", "decode_lossless", "decode_lossless_region", "tile_grid",
                                    "DEFAULT_TILE_LOG2", "lossless_region_bounds"],
    "beton.fields.image_crops": ["random_resized_crop", "center_crop"],
    "beton.fields.decoders": ["IntDecoder", "NDArrayDecoder", "SimpleRGBImageDecoder"],
    "beton.reader": ["Reader"],
    "beton.writer": ["DatasetWriter"],
}

OLD_PATHS_CHECK = """
import importlib, json, sys
import beton
found = {}
for module, names in json.loads(sys.argv[1]).items():
    loaded = importlib.import_module(module)
    found[module] = [name for name in names if not hasattr(loaded, name)]
found["beton.verify is the function"] = [] if callable(beton.verify) and beton.verify.__name__ == "verify" else ["no"]
print(json.dumps(found))
"""


def test_import_paths_from_before_the_reorganisation_keep_working():
    # a fresh interpreter: what a user's script imports first must not matter (``import beton.verify`` once
    # rebound the name ``beton.verify``, the function, to the module)
    import json
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-c", OLD_PATHS_CHECK, json.dumps(OLD_PATHS)], capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    missing = {module: names for module, names in json.loads(result.stdout).items() if names}
    assert not missing, missing
    # each old module gives the very objects of the new home (no second copy with its own state)
    import beton.bench.timing
    import beton.fields.rgb_image_decoders
    import beton.tools.bench.timing
    from beton.decoders import RandomResizedCropRGBImageDecoder

    assert beton.fields.rgb_image_decoders.RandomResizedCropRGBImageDecoder is RandomResizedCropRGBImageDecoder
    assert beton.bench.timing.paired_ratio is beton.tools.bench.timing.paired_ratio


def test_the_tests_import_only_public_names():
    """Tests use beton as users do: a private name they need is a name the package should make public."""
    import ast
    import pathlib

    private = []
    for path in sorted(pathlib.Path(__file__).parent.rglob("*.py")):
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
