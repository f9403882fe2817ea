"""Files written today are byte-identical to those the writer produced before the package was reorganised."""

from __future__ import annotations

import pytest

from conftest import DATA
from golden_files import datasets, write_all

GOLDEN = DATA / "golden"


def test_every_dataset_has_a_golden_file():
    assert sorted(p.stem for p in GOLDEN.glob("*.beton")) == sorted(datasets())


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    return {path.stem: path for path in write_all(tmp_path_factory.mktemp("golden"))}


@pytest.mark.parametrize("name", sorted(datasets()))
def test_written_bytes_match_the_golden_file(written, name):
    expected = (GOLDEN / f"{name}.beton").read_bytes()
    actual = written[name].read_bytes()
    assert len(actual) == len(expected), name
    differing = next((i for i, (a, b) in enumerate(zip(actual, expected)) if a != b), None)
    assert differing is None, f"{name}: first differing byte at offset {differing}"
