"""Fuzzing as a habit: six hundred seeded hostile files per run, each through open, read, verify, describe and a
Loader epoch in a worker process, so that a crash or a hang is counted rather than fatal.

The engine is ``benchmarks/fuzz.py`` (``python benchmarks/fuzz.py --cases 10000`` for the long run); this test
runs 600 of its cases (cases 0-599, or from ``$BETON_FUZZ_FIRST``) and fails on any outcome but ``ok`` or a
BetonError.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import sys

import pytest

FUZZ = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "fuzz.py"
CASES = 600


@pytest.fixture(scope="module")
def fuzz():
    spec = importlib.util.spec_from_file_location("beton_fuzz", FUZZ)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up while being defined
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[spec.name]


def test_hostile_files_end_in_beton_errors_only(fuzz, tmp_path):
    first = int(os.environ.get("BETON_FUZZ_FIRST", "0"))  # the same cases every run unless asked for others
    summary = fuzz.fuzz(range(first, first + CASES), jobs=2, timeout=60, keep=tmp_path)
    assert summary.bugs == 0, (f"cases {first}..{first + CASES - 1} (replay one with python benchmarks/fuzz.py "
                               f"--replay CASE):\n{summary.report()}")
    assert summary.counts["ok"] + summary.counts["BetonError"] == CASES
    assert summary.worst_rss[0] < fuzz.RSS_GOAL
