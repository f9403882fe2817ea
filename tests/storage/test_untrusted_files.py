"""Files are untrusted input: no type name stored in a file makes beton import or run anything."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap

import pytest

import beton
from beton.errors import FieldError
from beton.fields import Encoded, Field, IntField, UnknownField

from conftest import write

BOOBY_TRAP = textwrap.dedent("""
    import pathlib
    pathlib.Path(__file__).with_name("IMPORTED").write_text("the module ran")

    from beton.fields import Encoded, Field

    class TrapField(Field):
        def encode(self, value, context):
            return Encoded()

        def to_python(self, metadata, payload):
            return None
""")


def field_named(type_name: str) -> Field:
    """A harmless field the writer stores under ``type_name`` (what an attacker's re-signed file could hold)."""

    @dataclasses.dataclass(frozen=True)
    class Named(Field):
        def encode(self, value, context):
            return Encoded()

        def to_python(self, metadata, payload):
            return None

    Named.type_name = type_name
    return Named()


@pytest.fixture
def trap_folder(tmp_path, monkeypatch):
    """A module beside the 'training script' (on sys.path) that leaves a mark when imported."""
    folder = tmp_path / "script"
    folder.mkdir()
    (folder / "dataset_helpers.py").write_text(BOOBY_TRAP)
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.delitem(sys.modules, "dataset_helpers", raising=False)
    return folder


@pytest.mark.parametrize("type_name", ["dataset_helpers.TrapField", "unittest.__main__.X", "venv.__main__.X",
                                       "os.system", "beton.tools.cli.main"])
def test_a_stored_type_name_is_never_imported(tmp_path, trap_folder, type_name):
    path = write(tmp_path / "attack.beton", {"x": field_named(type_name), "n": IntField()}, [(None, 1), (None, 2)])
    modules_before = set(sys.modules)
    with beton.Reader(path) as reader:
        assert isinstance(reader.fields["x"], UnknownField)
        assert reader.fields["n"] == IntField()
        with pytest.raises(FieldError, match="not registered"):
            reader[0]
    assert not (trap_folder / "IMPORTED").exists()
    assert not {"dataset_helpers", "unittest.__main__", "venv.__main__"} & (set(sys.modules) - modules_before)
    with beton.Loader(path, batch_size=2, num_workers=1, pipelines={"x": None}) as loader:  # other fields load
        assert [labels.tolist() for (labels,) in loader] == [[1, 2]]


def test_beton_info_on_an_attacking_file_runs_nothing(tmp_path, trap_folder):
    path = write(tmp_path / "attack.beton", {"x": field_named("dataset_helpers.TrapField")}, [(None,)])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(trap_folder), os.environ.get("PYTHONPATH", "")])}
    outputs = {}
    for command in ("info", "verify"):
        result = subprocess.run([sys.executable, "-m", "beton.tools.cli", command, str(path)], cwd=trap_folder, env=env,
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        outputs[command] = result.stdout
    assert "dataset_helpers.TrapField" in outputs["info"] and outputs["verify"].startswith("OK")
    assert not (trap_folder / "IMPORTED").exists()
    assert not (trap_folder / "venv").exists()


def test_an_installed_package_can_declare_its_fields_as_entry_points(tmp_path, trap_folder, monkeypatch):
    """Installing a package is the user's decision: its ``beton.fields`` entry for the stored name is loaded."""
    dist = trap_folder / "dataset_helpers-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: dataset-helpers\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[beton.fields]\ndataset_helpers.TrapField = dataset_helpers:TrapField\n")
    path = write(tmp_path / "ok.beton", {"x": field_named("dataset_helpers.TrapField")}, [(None,)])
    with beton.Reader(path) as reader:
        assert type(reader.fields["x"]).__name__ == "TrapField"
        assert reader[0] == (None,)
    assert (trap_folder / "IMPORTED").exists()


def test_register_checks_what_it_is_given():
    with pytest.raises(FieldError, match="not a Field subclass"):
        beton.fields.register(int)
    assert not {name for name in beton.fields.registered_fields() if "Trap" in name}
