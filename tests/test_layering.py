"""The package's layers, read from its own imports: no module imports a layer above its own.

Lower layers know nothing of higher ones, so each can be read, tested and replaced on its own (see
docs/architecture.md for what each layer holds). Every import counts, also one inside a function: a deferred
import still makes the lower layer depend on the higher one. A new module must be placed in a layer here.
"""

from __future__ import annotations

import ast
import importlib
import pathlib
import re

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "beton"

#: Lowest first. A module belongs to the longest prefix listed.
LAYERS: list[tuple[str, ...]] = [
    ("beton.errors", "beton._version", "beton.bounded_json", "beton._cores", "beton.limits", "beton.dtypes",
     "beton.pieces", "beton.random", "beton.threading_layer", "beton.private_dirs", "beton.contracts",
     "beton.user_warnings"),
    ("beton.codecs",),
    ("beton.pipeline",),
    ("beton.decoders",),
    ("beton.transforms",),
    ("beton.fields",),
    ("beton.storage",),
    ("beton.dataset",),
    ("beton.memory",),
    ("beton.order",),
    ("beton.loader",),
    # FFCV's contracts, adapted: above the core, which reaches them only through seams in the layers below
    ("beton.ffcv",),
    ("beton.tools",),
    # beton on Ray Data (the optional extra beton[ray]): writes with the storage layer, reads datasets
    ("beton.ray",),
    # faces: the package's top-level names and FFCV's import paths, which gather names from every layer
    ("beton", "beton.__main__", "beton.reader", "beton.writer", "beton.memory_managers", "beton.libffcv",
     "beton.convert", "beton.show", "beton.traversal_order"),
]


def module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> int:
    best, best_length = None, -1
    for number, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            matches = module == prefix or (module.startswith(prefix + ".") and prefix != "beton")
            if matches and len(prefix) > best_length:
                best, best_length = number, len(prefix)
    if best is None:
        raise AssertionError(f"{module} is in no layer: add it to LAYERS in {__file__}")
    return best


def imports_of(path: pathlib.Path) -> set[str]:
    module = module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            # "from beton import x" imports the submodule x when there is one
            for alias in node.names:
                candidate = f"{target}.{alias.name}"
                found.add(candidate if (PACKAGE.parent / (candidate.replace(".", "/") + ".py")).exists()
                          or (PACKAGE.parent / candidate.replace(".", "/")).is_dir() else target)
    return {name for name in found if name == "beton" or name.startswith("beton.")}


MODULES = sorted(PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda path: module_name(path))
def test_no_module_imports_a_higher_layer(path):
    module = module_name(path)
    own = layer_of(module)
    upward = sorted(name for name in imports_of(path) if layer_of(name) > own)
    assert not upward, f"{module} (layer {own}) imports higher layers: {upward}"


def test_the_rule_catches_an_upward_import():
    assert layer_of("beton.fields.rgb_image") > layer_of("beton.decoders.rgb_image")
    assert layer_of("beton.storage.reader") < layer_of("beton.loader.loader")
    assert layer_of("beton") == len(LAYERS) - 1 and layer_of("beton.errors") == 0
    with pytest.raises(AssertionError, match="in no layer"):
        layer_of("beton.somewhere_new")


def test_folders_form_no_cycle():
    folders: dict[str, set[str]] = {}
    for path in MODULES:
        folder = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
        if folder == "beton":
            continue
        folders.setdefault(folder, set()).update(
            name.rpartition(".")[0] if name.count(".") > 1 else name for name in imports_of(path))
    graph = {folder: {target for target in targets if target in folders and target != folder}
             for folder, targets in folders.items()}
    visiting, done = set(), set()

    def visit(folder: str, trail: list[str]) -> None:
        if folder in done:
            return
        assert folder not in visiting, f"import cycle between folders: {' -> '.join(trail + [folder])}"
        visiting.add(folder)
        for target in sorted(graph[folder]):
            visit(target, trail + [folder])
        visiting.discard(folder)
        done.add(folder)

    for folder in sorted(graph):
        visit(folder, [])


def test_decoders_name_field_classes_that_exist():
    """Decoders name the field classes they read (they may not import them): the names must stay true."""
    named = set()
    for path in (PACKAGE / "decoders").glob("*.py"):
        named.update(re.findall(r'"(beton\.fields\.\w+\.\w+Field)"', path.read_text(encoding="utf-8")))
    assert named, "no field class named by the decoders"
    for class_path in sorted(named):
        module, _, name = class_path.rpartition(".")
        assert isinstance(getattr(importlib.import_module(module), name, None), type), class_path
