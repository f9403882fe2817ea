"""Memory is bounded by batch_size x max_length, never by the longest sample of the file, under both memory
layers; the process cache reads and stages only the windows, and gives the memory map's batches bit for bit."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from beton import Loader, OrderOption
from beton.decoders import IntDecoder, RaggedDecoder
from beton.decoders.ragged import WINDOWS
from beton.errors import DecodeError, PipelineError
from beton.fields import IntField, RaggedArrayField
from beton.memory import OSCache, ProcessCache
from beton.pieces import Pieces
from beton.transforms import Pack, PackRows, PadToLongest, ToTensor

from conftest import write
from strategies import ragged_fields

HUGE = 10**7  # elements of the one long sample: 40 MB of int32
HUGE_SAMPLE = 77


def sample(i: int) -> np.ndarray:
    length = HUGE if i == HUGE_SAMPLE else (i * 7) % 50
    return np.arange(length, dtype=np.int32) + i


PAGE = 2**16  # pages far smaller than the long sample: what the process cache reads is then visible


@pytest.fixture(scope="module")
def long_tailed_file(tmp_path_factory):
    return write(tmp_path_factory.mktemp("huge") / "huge.beton", {"tokens": RaggedArrayField(np.int32, (None,))},
                 [(sample(i),) for i in range(200)], page_size=PAGE)


@pytest.mark.parametrize("after", [[], [PadToLongest()], [Pack()], [PackRows(48)]], ids=repr)
@pytest.mark.parametrize("window", ["start", "center", "random"])
@pytest.mark.parametrize("memory", [OSCache(), ProcessCache()], ids=["os-cache", "process-cache"])
def test_one_sample_of_ten_million_elements_costs_no_more_than_small_ones(long_tailed_file, after, window, memory):
    pipelines = {"tokens": [RaggedDecoder(64, window=window), *after, ToTensor()]}
    with Loader(long_tailed_file, batch_size=2, num_workers=1, pipelines=pipelines, indices=[0]):
        pass  # compile (once per process, some MiB of numba's own) before measuring
    tracemalloc.start()
    try:
        with Loader(long_tailed_file, batch_size=32, num_workers=2, seed=0, pipelines=pipelines,
                    memory=memory) as loader:
            seen = 0
            for batch in loader:
                (output,) = batch
                seen += len(output.values) if not after or not isinstance(after[0], (Pack, PackRows)) else 1
            read = loader.memory_counters["bytes_read"]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert seen > 0
    # One slot buffer sized by the longest sample would be 32 x 40 MB; the slots hold 32 x 64 int32 (8 KiB) each.
    # The process cache's page pool and staging buffers are numpy arrays too (their sizes are traced: see
    # test_tracemalloc_sees_the_process_caches_pages_and_staging): whole pages of the long sample, or its whole
    # payload staged, would be 40 MB each.
    assert peak < 4 * 2**20, f"peak {peak / 2**20:.1f} MiB"
    # bytes read (pages by the process cache; the decoders' windows through the memory map)
    assert read < 2**20 if isinstance(memory, ProcessCache) else read < 200 * 64 * 4


def test_tracemalloc_sees_the_process_caches_pages_and_staging(long_tailed_file):
    # The control of the test above: a decoder that keeps the whole long sample makes the process cache read
    # every page of it and stage all of it, and tracemalloc sees both (the slots are allocated before tracing).
    pipelines = {"tokens": [RaggedDecoder(HUGE)]}
    with Loader(long_tailed_file, batch_size=1, num_workers=1, pipelines=pipelines, indices=[HUGE_SAMPLE],
                memory=ProcessCache(), batches_ahead=1) as loader:
        tracemalloc.start()
        try:
            (padded,), = list(loader)
            read = loader.memory_counters["bytes_read"]
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert padded.lengths.tolist() == [HUGE]
    assert read >= HUGE * 4
    assert peak >= 2 * HUGE * 4, f"peak {peak / 2**20:.1f} MiB: pages and staging are not both traced"


def test_the_long_sample_gives_its_window(long_tailed_file):
    with Loader(long_tailed_file, batch_size=8, num_workers=1, indices=[HUGE_SAMPLE, 3],
                pipelines={"tokens": [RaggedDecoder(64, window="center")]}) as loader:
        (padded,), = list(loader)
    start = (HUGE - 64) // 2
    np.testing.assert_array_equal(padded.values[0], np.arange(start, start + 64, dtype=np.int32) + HUGE_SAMPLE)
    assert padded.lengths.tolist() == [64, 21]


def varied(i: int) -> np.ndarray:
    """Rows of 3 int16 (6 bytes: windows never align with 256-byte pages); a few samples far longer."""
    length = 3000 + i if i % 17 == 5 else (i * 13) % 90
    return (np.arange(length * 3, dtype=np.int16) * 7 + i).reshape(length, 3)


@pytest.fixture(scope="module")
def varied_file(tmp_path_factory):
    return write(tmp_path_factory.mktemp("varied") / "varied.beton",
                 {"rows": RaggedArrayField(np.int16, (None, 3)), "index": IntField()},
                 [(varied(i), i) for i in range(150)], page_size=256)


def epochs_of(path, memory, window, seed, num_workers, epochs=2):
    pipelines = {"rows": [RaggedDecoder(40, window=window, pad_value=-1)], "index": [IntDecoder()]}
    with Loader(path, batch_size=16, num_workers=num_workers, order=OrderOption.RANDOM, seed=seed,
                pipelines=pipelines, memory=memory) as loader:
        return [[(padded.values.copy(), padded.lengths.copy(), index.copy()) for padded, index in loader]
                for _ in range(epochs)], loader.memory_counters


@pytest.mark.parametrize("window", ["start", "center", "random"])
@pytest.mark.parametrize("seed", [0, 9])
def test_the_process_cache_gives_the_memory_maps_batches_bit_for_bit(varied_file, window, seed):
    expected, mapped = epochs_of(varied_file, OSCache(), window, seed, 1)
    for num_workers in (0, 1, 3):
        got, counters = epochs_of(varied_file, ProcessCache(), window, seed, num_workers)
        for epoch_expected, epoch_got in zip(expected, got, strict=True):
            for (values, lengths, index), (values2, lengths2, index2) in zip(epoch_expected, epoch_got, strict=True):
                np.testing.assert_array_equal(index, index2)
                np.testing.assert_array_equal(lengths, lengths2)
                assert values.tobytes() == values2.tobytes()
        assert counters["bytes_read"] < sum(varied(i).nbytes for i in range(150)) / 2  # windows, not samples
    for epoch in expected:  # and both are the windows numpy cuts
        for values, lengths, index in epoch:
            for row, length, i in zip(values, lengths, index.tolist()):
                whole = varied(i)
                if len(whole) <= 40:
                    np.testing.assert_array_equal(row[:length], whole)
                else:
                    windows = [whole[s : s + 40] for s in range(len(whole) - 39)]
                    assert any(np.array_equal(row, w) for w in windows)
                    if window != "random":
                        start = 0 if window == "start" else (len(whole) - 40) // 2
                        np.testing.assert_array_equal(row, whole[start : start + 40])
                assert (row[length:] == -1).all()


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(field=ragged_fields(max_length=40), count=st.integers(1, 30), max_length=st.integers(1, 12),
       window=st.sampled_from(sorted(WINDOWS)), seed=st.integers(0, 2**31), page_size=st.sampled_from([256, 512]),
       num_workers=st.integers(0, 3), data=st.data())
def test_any_dtype_row_shape_and_window_read_through_the_process_cache_is_the_memory_maps(
        tmp_path_factory, field, count, max_length, window, seed, page_size, num_workers, data):
    field, values = field
    path = write(tmp_path_factory.mktemp("any") / "any.beton", {"rows": field},
                 [(data.draw(values),) for _ in range(count)], page_size=page_size)
    pipelines = {"rows": [RaggedDecoder(max_length, window=window)]}

    def batches(memory, workers):
        with Loader(path, batch_size=4, num_workers=workers, order=OrderOption.RANDOM, seed=seed,
                    pipelines=pipelines, memory=memory) as loader:
            return [(padded.values.tobytes(), padded.lengths.tolist()) for _ in range(2) for (padded,) in loader]

    assert batches(ProcessCache(), num_workers) == batches(OSCache(), 1)


def test_a_decoder_that_reads_other_rows_than_it_declared_raises_instead_of_returning_them(varied_file, monkeypatch):
    declared = RaggedDecoder.payload_pieces

    def shifted(self, previous, key):  # a broken contract: the parts staged are one row later than the window
        pieces = declared(self, previous, key)
        return Pieces(pieces.starts + 6 * (pieces.starts > 0), pieces.lengths)

    monkeypatch.setattr(RaggedDecoder, "payload_pieces", shifted)
    with Loader(varied_file, batch_size=16, num_workers=1, memory=ProcessCache(),
                pipelines={"rows": [RaggedDecoder(40, window="center")], "index": None}) as loader:
        with pytest.raises(DecodeError, match="other rows of this payload than the decoder's window"):
            for _ in loader:
                pass


def test_over_a_url_only_the_windows_pages_are_fetched_and_batches_match_the_local_file(long_tailed_file):
    pytest.importorskip("aiohttp", reason="fsspec reads http:// through aiohttp (the 'remote' extra)")
    from range_server import RangeServer

    from beton import RemoteOptions

    pipelines = {"tokens": [RaggedDecoder(64, window="random"), PadToLongest()]}

    def batches(path, **options):
        with Loader(path, batch_size=32, num_workers=2, seed=3, pipelines=pipelines, **options) as loader:
            return [(padded.values.copy(), padded.lengths.copy()) for (padded,) in loader]

    expected = batches(long_tailed_file, memory=OSCache())
    with RangeServer(long_tailed_file.parent) as server:
        got = batches(server.url(long_tailed_file.name), remote=RemoteOptions(prefetch_bytes=4 * PAGE))
        sent = server.bytes_sent
    assert len(got) == len(expected) == 7
    for (values, lengths), (values2, lengths2) in zip(expected, got):
        assert values.tobytes() == values2.tobytes() and np.array_equal(lengths, lengths2)
    assert sent < 2**20, f"{sent} bytes fetched: more than the windows' pages"  # the long sample alone is 40 MB


@pytest.mark.parametrize("memory", [OSCache(), ProcessCache()], ids=["os-cache", "process-cache"])
def test_a_decoder_that_declares_rows_outside_its_payloads_is_refused(varied_file, monkeypatch, memory):
    declared = RaggedDecoder.payload_pieces

    def beyond(self, previous, key):  # one row past the end of each payload
        pieces = declared(self, previous, key)
        return Pieces(pieces.starts + 6 * previous.metadata["length"][:, None], pieces.lengths)

    monkeypatch.setattr(RaggedDecoder, "payload_pieces", beyond)
    with Loader(varied_file, batch_size=16, num_workers=1, memory=memory,
                pipelines={"rows": [RaggedDecoder(40)], "index": None}) as loader:
        with pytest.raises(PipelineError, match=r"lie outside sample \d+'s payload"):
            iter(loader)

