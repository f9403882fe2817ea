"""Every FFCV import path listed in docs/migrating_from_ffcv.md resolves under the beton name."""

from __future__ import annotations

import importlib
import pathlib
import re

import pytest

DOC = pathlib.Path(__file__).resolve().parents[1] / "docs" / "migrating_from_ffcv.md"


def listed_names() -> list[tuple[str, str]]:
    text = DOC.read_text(encoding="utf-8")
    table = text[text.index("<!-- ffcv-names -->") : text.index("<!-- /ffcv-names -->")]
    pairs = []
    for module, names in re.findall(r"^\| `(ffcv[\w.]*)` \| (.+) \|$", table, re.MULTILINE):
        pairs += [(module, name) for name in re.findall(r"`(\w+)`", names)]
    return pairs


def test_the_table_lists_the_common_paths():
    modules = {module for module, _ in listed_names()}
    assert {"ffcv.loader", "ffcv.fields.decoders", "ffcv.transforms", "ffcv.pipeline.operation"} <= modules
    assert len(listed_names()) >= 75


@pytest.mark.parametrize(("module", "name"), listed_names(), ids=lambda value: value)
def test_ffcv_name_imports_from_beton(module, name):
    beton_module = importlib.import_module("beton" + module[len("ffcv"):])
    assert hasattr(beton_module, name), f"from {beton_module.__name__} import {name} fails"


def test_the_names_real_programs_import_are_what_ffcv_says():
    """Paths from FFCV's documentation examples and real projects, beyond the table's modules' main names."""
    import typing

    from beton.fields.basics import BasicDecoder, FloatDecoder, IntDecoder
    from beton.loader.loader import ORDER_TYPE, OrderOption
    from beton.pipeline.allocation_query import AllocationQuery as Query
    from beton.pipeline.operation import AllocationQuery
    from beton.traversal_order import Random, TraversalOrder

    assert AllocationQuery is Query
    assert issubclass(IntDecoder, BasicDecoder) and issubclass(FloatDecoder, BasicDecoder)
    allowed = typing.get_args(ORDER_TYPE)
    assert OrderOption in allowed and isinstance(Random, allowed) and isinstance(TraversalOrder, allowed)
