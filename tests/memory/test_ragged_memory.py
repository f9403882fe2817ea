"""Memory is bounded by batch_size x max_length, never by the longest sample of the file."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from beton import Loader
from beton.decoders import RaggedDecoder
from beton.fields import RaggedArrayField
from beton.transforms import Pack, PackRows, PadToLongest, ToTensor

from conftest import write

HUGE = 10**7  # elements of the one long sample: 40 MB of int32
HUGE_SAMPLE = 77


def sample(i: int) -> np.ndarray:
    length = HUGE if i == HUGE_SAMPLE else (i * 7) % 50
    return np.arange(length, dtype=np.int32) + i


@pytest.fixture(scope="module")
def long_tailed_file(tmp_path_factory):
    return write(tmp_path_factory.mktemp("huge") / "huge.beton", {"tokens": RaggedArrayField(np.int32, (None,))},
                 [(sample(i),) for i in range(200)])


@pytest.mark.parametrize("after", [[], [PadToLongest()], [Pack()], [PackRows(48)]], ids=repr)
@pytest.mark.parametrize("window", ["start", "random"])
def test_one_sample_of_ten_million_elements_costs_no_more_than_small_ones(long_tailed_file, after, window):
    pipelines = {"tokens": [RaggedDecoder(64, window=window), *after, ToTensor()]}
    with Loader(long_tailed_file, batch_size=2, num_workers=1, pipelines=pipelines, indices=[0]):
        pass  # compile (once per process, some MiB of numba's own) before measuring
    tracemalloc.start()
    try:
        with Loader(long_tailed_file, batch_size=32, num_workers=2, seed=0, pipelines=pipelines) as loader:
            seen = 0
            for batch in loader:
                (output,) = batch
                seen += len(output.values) if not after or not isinstance(after[0], (Pack, PackRows)) else 1
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert seen > 0
    # One slot buffer sized by the longest sample would be 32 x 40 MB; the slots hold 32 x 64 int32 (8 KiB) each.
    assert peak < 4 * 2**20, f"peak {peak / 2**20:.1f} MiB"


def test_the_long_sample_gives_its_window(long_tailed_file):
    with Loader(long_tailed_file, batch_size=8, num_workers=1, indices=[HUGE_SAMPLE, 3],
                pipelines={"tokens": [RaggedDecoder(64, window="center")]}) as loader:
        (padded,), = list(loader)
    start = (HUGE - 64) // 2
    np.testing.assert_array_equal(padded.values[0], np.arange(start, start + 64, dtype=np.int32) + HUGE_SAMPLE)
    assert padded.lengths.tolist() == [64, 21]
