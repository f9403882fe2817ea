"""OS cache and process cache: same data, counted reads, pages read once per epoch under QUASI_RANDOM."""

from __future__ import annotations

import mmap
import threading
import time

import numpy as np
import pytest

from beton import Loader, OrderOption, Reader
from beton.errors import FormatError
from beton.fields import IntField, NDArrayField
from beton.memory import OSCache, ProcessCache, ProcessCacheLayer
from beton.memory.base import EpochReads, StoredField
from beton.memory.page_reader import READ_LEAD
from beton.memory.slots import Slot, SlotGate

from conftest import checked_labels, small_image, write


@pytest.fixture(scope="module")
def paged_file(tmp_path_factory):
    """600 images of 192 bytes on 256-byte pages: exactly one sample per page, 600 pages."""
    path = tmp_path_factory.mktemp("paged") / "paged.beton"
    return write(path, {"image": NDArrayField(np.uint8, (8, 8, 3)), "label": IntField()},
                 [(small_image(i), i) for i in range(600)], page_size=256)


@pytest.mark.parametrize("window", [2, 8])
def test_process_cache_reads_every_needed_page_once_per_epoch_under_quasi_random(paged_file, window):
    with Loader(paged_file, batch_size=20, num_workers=2, memory=ProcessCache(), order=OrderOption.QUASI_RANDOM,
                order_kwargs={"window_pages": window}, seed=0, indices=np.arange(0, 600, 3)) as loader:
        for epoch in range(2):
            count = sum(len(images) for images, _ in loader)
            counters = loader.memory_counters
            assert count == 200
            assert counters["pages_read"] == 200  # the 200 selected pages, each once
            assert counters["bytes_read"] == 200 * 256


def test_process_cache_budget_is_respected_and_data_is_right(paged_file):
    with Loader(paged_file, batch_size=10, num_workers=2, memory=ProcessCache(pages=5), order=OrderOption.RANDOM,
                seed=1) as loader:
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


@pytest.mark.parametrize("readahead", [True, False])
def test_os_cache_readahead_reaches_the_mapping(paged_file, monkeypatch, readahead):
    advice = []

    class RecordingMap(mmap.mmap):  # the layer's own map, as the OS would be asked
        def madvise(self, option, *args):
            advice.append(option)
            return super().madvise(option, *args)

    monkeypatch.setattr(mmap, "mmap", RecordingMap)
    with Loader(paged_file, batch_size=50, num_workers=2, order=OrderOption.RANDOM, seed=3,
                memory=OSCache(readahead=readahead)) as loader:
        assert type(loader.memory.mapping) is RecordingMap
        assert sorted(checked_labels(loader)) == list(range(600))
    assert advice == ([] if readahead else [mmap.MADV_RANDOM])


# ---- the process cache's parts, through their interfaces -----------------------------------------------------


class FakePages:
    """A PageSource that is no file: bytes held in memory, handed out slowly, failing at one page if asked.

    It has exactly the interface's members (no descriptor, no path), so a cache that reads through it depends on
    nothing else."""

    def __init__(self, data: bytes, delay: float = 0.0, failing_page: int | None = None) -> None:
        self.description, self.size = "fake://pages", len(data)
        self._data, self._delay, self._failing = np.frombuffer(data, np.uint8), delay, failing_page
        self.reads: list[str] = []
        self.closed = False

    def read_into(self, offset: int, out: np.ndarray, what: str) -> None:
        time.sleep(self._delay)
        if what == f"page {self._failing}":
            raise FormatError(f"{self.description}: {what} failed its CRC32 check after 3 tries")
        self.reads.append(what)
        out[:] = self._data[offset : offset + len(out)]

    def check(self) -> None:
        pass

    def check_path(self) -> None:
        pass

    def will_serve(self, samples) -> None:
        pass

    def sample_file(self, sample: int) -> tuple[str, int]:
        return self.description, sample

    def will_read(self, batch_pages, budget_pages) -> None:
        self.announced = [pages.tolist() for pages in batch_pages]

    def close(self) -> None:
        self.closed = True


def _epoch_through(layer, reader, batches, num_slots=4, on_batch=None):
    """Drive a memory layer as the epoch engine does, in this thread; each batch's payloads, as read."""
    gate = SlotGate(num_slots, 0)
    stored = StoredField.of(reader, "image")
    layer.start_epoch(EpochReads(batches, 0, (stored.payload,), {}, gate))
    slots = [Slot([]) for _ in range(num_slots)]
    payloads = []
    try:
        for batch, samples in enumerate(batches):
            if on_batch is not None:
                on_batch(batch)
            source = layer.source(stored, samples, batch, slots[batch % num_slots])
            payloads.append([source.memory[o : o + n].tobytes() for o, n in zip(source.offsets, source.sizes)])
            layer.batch_done(batch)
            gate.asked_for(batch + 1)
    finally:
        gate.close()
    return payloads


def test_the_page_reader_reads_through_any_page_source(paged_file):
    batches = [np.arange(b, 600, 60)[:7] for b in range(12)]
    with Reader(paged_file) as reader:
        pages = FakePages(open(paged_file, "rb").read(), delay=0.002)
        layer = ProcessCacheLayer(reader, 4, file=pages)
        got = _epoch_through(layer, reader, batches)
        expected = [[reader.payload(int(i), "image").tobytes() for i in samples] for samples in batches]
        layer.close()
    assert got == expected
    assert sorted(pages.reads) == sorted(f"page {int(i)}" for samples in batches for i in samples)  # 1 sample/page
    assert layer.counters.snapshot() == {"pages_read": len(pages.reads), "bytes_read": 256 * len(pages.reads)}
    assert pages.closed


def test_a_failing_page_source_raises_its_own_error_in_the_batch_that_needs_the_page(paged_file):
    batches = [np.arange(10 * b, 10 * b + 10) for b in range(6)]
    with Reader(paged_file) as reader:
        layer = ProcessCacheLayer(reader, 4, file=FakePages(open(paged_file, "rb").read(), failing_page=34))
        delivered = []
        with pytest.raises(FormatError, match="fake://pages: page 34 failed its CRC32 check"):
            _epoch_through(layer, reader, batches, on_batch=delivered.append)
        layer.close()
    assert delivered == [0, 1, 2, 3]  # batches before the one holding page 34 were served


def test_the_page_reader_waits_on_the_slot_gate_as_the_workers_do(paged_file):
    batches = [np.arange(5 * b, 5 * b + 5) for b in range(12)]  # 5 pages per batch, none shared
    with Reader(paged_file) as reader:
        pages = FakePages(open(paged_file, "rb").read())
        layer = ProcessCacheLayer(reader, 5, file=pages)
        gate = SlotGate(5, 0)  # 5 slots: workers may start batches 0-2 before the loop asks for anything
        layer.start_epoch(EpochReads(batches, 0, (0,), {}, gate))

        def batches_read(expected):
            deadline = time.monotonic() + 5
            while len(pages.reads) < 5 * expected and time.monotonic() < deadline:
                time.sleep(0.005)
            time.sleep(0.05)  # a reader that ignored the gate would go on meanwhile
            return len(pages.reads) / 5

        assert batches_read(3 + READ_LEAD) == 3 + READ_LEAD  # the workers' batches, and its lead
        gate.asked_for(0)  # the loop asks for batch 0: batch 3's slot is free
        assert batches_read(4 + READ_LEAD) == 4 + READ_LEAD
        gate.asked_for(2)
        assert batches_read(6 + READ_LEAD) == 6 + READ_LEAD
        gate.close()  # the epoch ends: the reader stops, a worker waiting for a batch is not left waiting
        with pytest.raises(RuntimeError, match="closed"):
            layer.source(StoredField.of(reader, "image"), batches[11], 11, Slot([]))
        layer.close()
    assert len(pages.reads) == 5 * (6 + READ_LEAD)


def test_the_gate_frees_a_slot_once_the_loop_asks_for_the_batch_after_next():
    gate = SlotGate(4, first=10)  # a resumed epoch: batch numbers go on from 10
    assert gate.wait(10) and gate.wait(11)
    passed = threading.Event()
    waiter = threading.Thread(target=lambda: gate.wait(12) and passed.set())
    waiter.start()
    assert not passed.wait(0.05)  # batch 12 takes batch 8's slot: free once the loop asks for 12 - 4 + 2 = 10
    gate.asked_for(9)
    assert not passed.wait(0.05)
    gate.asked_for(10)
    assert passed.wait(5)
    waiter.join()
    results = []
    late = threading.Thread(target=lambda: results.append(gate.wait(20)))
    late.start()
    time.sleep(0.02)
    gate.close()  # the epoch ends: every waiter returns False at once
    late.join(5)
    assert results == [False] and not gate.wait(0)
