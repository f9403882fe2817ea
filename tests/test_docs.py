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
