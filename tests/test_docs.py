"""Every Python block of README.md and docs/*.md runs as written.

Blocks of one document run in order in one namespace (later blocks use what earlier ones made), in a fresh
working directory. A block preceded by ``<!-- docs-test: skip (why) -->`` is skipped, with that reason shown.
"""

from __future__ import annotations

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"(?:<!-- docs-test: skip \((?P<skip>[^)]*)\) -->\s*)?```python\n(?P<code>.*?)\n```", re.DOTALL)


def blocks(document: pathlib.Path) -> list[tuple[str, str | None]]:
    return [(match["code"], match["skip"]) for match in BLOCK.finditer(document.read_text(encoding="utf-8"))]


def test_documents_have_python_blocks():
    assert len(blocks(ROOT / "README.md")) >= 3


@pytest.mark.parametrize("document", [d for d in DOCUMENTS if blocks(d)], ids=lambda d: d.name)
def test_python_blocks_run(document, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__main__"}
    skipped = []
    for number, (code, skip) in enumerate(blocks(document), 1):
        if skip is not None:
            skipped.append(f"block {number}: {skip}")
            continue
        exec(compile(code, f"{document.name} block {number}", "exec"), namespace)  # noqa: S102 - our own docs
    namespace.clear()
    if skipped:
        pytest.skip("; ".join(skipped))


def _signatures(code: str):
    """Calls in ``code`` that name every argument (three or more) of a beton dataclass with a literal value:
    signatures shown to say what the defaults are (``RGBImageField(write_mode="raw", max_resolution=None, ...)``),
    not uses such as ``PadToLongest(multiple_of=8)``."""
    import ast
    import dataclasses

    import beton.fields
    import beton.transforms

    classes = {name: getattr(module, name) for module in (beton.fields, beton.transforms) for name in dir(module)}
    for node in ast.walk(ast.parse(code)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.args):
            continue
        cls = classes.get(node.func.id)
        if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
            continue
        arguments = [field for field in dataclasses.fields(cls) if field.init]
        given = {keyword.arg: keyword.value for keyword in node.keywords}
        if len(arguments) >= 3 and set(given) == {field.name for field in arguments}:
            try:
                values = {name: ast.literal_eval(value) for name, value in given.items()}
            except ValueError:
                continue
            yield cls, arguments, values


@pytest.mark.parametrize("document", [d for d in DOCUMENTS if blocks(d)], ids=lambda d: d.name)
def test_signatures_shown_in_documents_give_the_real_defaults(document):
    import dataclasses

    shown = 0
    for code, _ in blocks(document):
        for cls, arguments, values in _signatures(code):
            shown += 1
            for field in arguments:
                default = field.default_factory() if field.default is dataclasses.MISSING else field.default
                assert values[field.name] == default, (
                    f"{document.name} shows {cls.__name__}({field.name}={values[field.name]!r}, ...) as the "
                    f"defaults; the default is {field.name}={default!r}")
    if document.name == "images.md":
        assert shown >= 1  # RGBImageField's signature
