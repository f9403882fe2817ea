"""OS cache and process cache: same data, counted reads, pages read once per epoch under QUASI_RANDOM."""

from __future__ import annotations

import numpy as np
import pytest

from beton import Loader, OrderOption
from beton.fields import IntField, NDArrayField

from conftest import checked_labels, small_image, write


@pytest.fixture(scope="module")
def paged_file(tmp_path_factory):
    """600 images of 192 bytes on 256-byte pages: exactly one sample per page, 600 pages."""
    path = tmp_path_factory.mktemp("paged") / "paged.beton"
    return write(path, {"image": NDArrayField(np.uint8, (8, 8, 3)), "label": IntField()},
                 [(small_image(i), i) for i in range(600)], page_size=256)


@pytest.mark.parametrize("window", [2, 8])
def test_process_cache_reads_every_needed_page_once_per_epoch_under_quasi_random(paged_file, window):
    with Loader(paged_file, batch_size=20, num_workers=2, os_cache=False, order=OrderOption.QUASI_RANDOM,
                quasi_random_window=window, seed=0, indices=np.arange(0, 600, 3)) as loader:
        for epoch in range(2):
            count = sum(len(images) for images, _ in loader)
            counters = loader.memory_counters
            assert count == 200
            assert counters["pages_read"] == 200  # the 200 selected pages, each once
            assert counters["bytes_read"] == 200 * 256


def test_process_cache_budget_is_respected_and_data_is_right(paged_file):
    with Loader(paged_file, batch_size=10, num_workers=2, os_cache=False, order=OrderOption.RANDOM, seed=1,
                process_cache_pages=5) as loader:
        assert sorted(checked_labels(loader)) == list(range(600))
        # the requested 5 pages are too few for the batches in flight: the minimum that cannot deadlock wins
        assert loader.memory.budget_pages == 10 * (loader.num_slots + 1)


def test_os_cache_counts_payload_bytes(paged_file):
    with Loader(paged_file, batch_size=50, num_workers=2) as loader:
        for _ in loader:
            pass
        assert loader.memory_counters["bytes_read"] == 600 * 192


def test_large_payloads_spanning_pages_through_the_process_cache(tmp_path):
    # 3,200 bytes each on 1 KiB pages; every value differs, and the first one says which sample an array is
    arrays = [np.arange(i * 1600, (i + 1) * 1600, dtype=np.uint16).reshape(40, 40) for i in range(12)]
    path = write(tmp_path / "big.beton", {"x": NDArrayField(np.uint16, (40, 40))}, [(a,) for a in arrays],
                 page_size=1024)
    for os_cache in (True, False):
        with Loader(path, batch_size=5, num_workers=2, os_cache=os_cache, order=OrderOption.RANDOM, seed=2) as loader:
            for _ in range(2):
                seen = []
                for (batch,) in loader:
                    for array in batch.numpy():
                        sample = int(array[0, 0]) // 1600
                        np.testing.assert_array_equal(array, arrays[sample])
                        seen.append(sample)
                assert sorted(seen) == list(range(12)) and seen != list(range(12))


def test_os_cache_without_readahead_reads_the_same_data(paged_file):
    with Loader(paged_file, batch_size=50, num_workers=2, order=OrderOption.RANDOM, seed=3,
                readahead=False) as loader:
        assert sorted(checked_labels(loader)) == list(range(600))
