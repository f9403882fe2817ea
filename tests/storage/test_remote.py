"""Reading .beton files from URLs: a Range-honouring HTTP server and an S3 server (moto), both on loopback and
started here, with faults injected. Every sample read remotely is compared with the local file's: a remote read
either gives the same data or raises a clear error, never other data."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("fsspec", reason="remote reads need fsspec (the 'remote' extra)")
pytest.importorskip("aiohttp", reason="fsspec reads http:// through aiohttp (the 'remote' extra)")

import beton  # noqa: E402
from beton.errors import BetonError, CorruptDataError, FormatError, StorageError  # noqa: E402
from beton.memory import ProcessCache  # noqa: E402
from beton.storage.remote import RemoteOptions, is_url  # noqa: E402
from beton.storage.remote.cache import DiskPageCache  # noqa: E402
from beton.storage.remote.pages import expected_reads  # noqa: E402
from beton.tools.cli import main as cli  # noqa: E402
from conftest import MIXED_FIELDS, mixed_sample, write  # noqa: E402
from processes import moto_s3  # noqa: E402
from range_server import Fault, RangeServer  # noqa: E402
from resume_conformance import check_resume  # noqa: E402

NUM_SAMPLES = 300
PAGE_SIZE = 1024  # small pages: many pages, payloads across page boundaries
FAST = RemoteOptions(retries=4, backoff=0.001, max_backoff=0.01, timeout=2.0)  # retries without long pauses


def fast(**options) -> RemoteOptions:
    """FAST's retries with ``options``: what the tests pass as ``remote=``."""
    return dataclasses.replace(FAST, **options)


LOADER_PIPELINES = {"blob": None, "meta": None}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A mixed file on a local directory served over HTTP: (server, url, local path)."""
    directory = tmp_path_factory.mktemp("served")
    path = write(str(directory / "data.beton"), MIXED_FIELDS, [mixed_sample(i) for i in range(NUM_SAMPLES)],
                 page_size=PAGE_SIZE)
    with RangeServer(directory) as server:
        yield server, server.url("data.beton"), path


@pytest.fixture
def server(served):
    server, _, _ = served
    server.faults.clear()
    server.latency = 0.0
    yield server
    server.faults.clear()


def same(a, b) -> bool:
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and np.array_equal(a, b)
    return type(a) is type(b) and a == b


def assert_same_samples(remote: beton.Reader, local_path: str) -> None:
    with beton.Reader(local_path) as local:
        assert len(remote) == len(local)
        for i in range(len(local)):
            expected, got = local[i], remote[i]
            assert all(same(x, y) for x, y in zip(expected, got)), f"sample {i}: {got} != {expected}"


def loader_batches(path: str, epochs: int = 1, **options) -> list[list[tuple]]:
    settings = {"batch_size": 32, "num_workers": 2, "seed": 3, "pipelines": LOADER_PIPELINES, **options}
    with beton.Loader(path, **settings) as loader:
        return [[tuple(np.array(value.numpy()) for value in batch) for batch in loader] for _ in range(epochs)]


def assert_same_batches(got: list, expected: list) -> None:
    assert len(got) == len(expected)
    for epoch_got, epoch_expected in zip(got, expected):
        assert len(epoch_got) == len(epoch_expected)
        for batch_got, batch_expected in zip(epoch_got, epoch_expected):
            for x, y in zip(batch_got, batch_expected):
                assert np.array_equal(x, y)


# ---- URLs and plain reads -------------------------------------------------------------------------------------

@pytest.mark.parametrize("path, expected", [
    ("https://example.org/a.beton", True), ("s3://bucket/key.beton", True), ("gs://b/k", True),
    ("simplecache::s3://bucket/key", True), ("file:///tmp/a.beton", True),
    ("/tmp/a.beton", False), ("a.beton", False), ("C:\\data\\a.beton", False), ("weird:name.beton", False),
])
def test_is_url(path, expected):
    assert is_url(path) is expected


def test_reader_over_http_gives_every_sample_of_the_local_file(served, server):
    _, url, path = served
    with beton.Reader(url, remote=FAST) as reader:
        assert reader.remote is not None and reader.num_pages > 100
        assert_same_samples(reader, path)


def test_verify_and_cli_accept_urls(served, server, capsys):
    _, url, path = served
    report = beton.verify(url, remote=FAST)
    assert (report.num_samples, report.num_pages) == (NUM_SAMPLES, beton.Reader(path).num_pages)
    assert report.bytes_checked == os.path.getsize(path)
    assert cli(["verify", url]) == 0
    assert cli(["info", url]) == 0
    out = capsys.readouterr().out
    assert f"OK: {url}: {NUM_SAMPLES} samples" in out and f"samples:     {NUM_SAMPLES}" in out


@pytest.mark.parametrize("order", [beton.OrderOption.SEQUENTIAL, beton.OrderOption.RANDOM,
                                   beton.OrderOption.QUASI_RANDOM])
def test_loader_over_http_yields_the_local_batches(served, server, order):
    _, url, path = served
    expected = loader_batches(path, epochs=2, order=order, os_cache=False)
    got = loader_batches(url, epochs=2, order=order, remote=fast())
    assert_same_batches(got, expected)


@pytest.mark.parametrize("order", [beton.OrderOption.RANDOM, beton.OrderOption.QUASI_RANDOM])
@pytest.mark.parametrize("midpoint", [0, 4])
def test_a_loader_over_http_resumes_exactly(served, server, order, midpoint):
    _, url, _ = served
    check_resume(lambda: beton.Loader(url, batch_size=32, num_workers=2, seed=3, order=order,
                                      pipelines=LOADER_PIPELINES, remote=fast()), midpoint, epochs=2)


def test_a_url_is_read_through_the_process_cache_unless_told_otherwise(served, server):
    _, url, path = served
    with beton.Loader(url, batch_size=32, num_workers=1, pipelines=LOADER_PIPELINES) as loader:
        assert isinstance(loader.memory_strategy, ProcessCache)
        got = [[tuple(np.array(value.numpy()) for value in batch) for batch in loader]]
    assert_same_batches(got, loader_batches(path, os_cache=False, num_workers=1))
    for contradiction in ({"os_cache": True}, {"memory": beton.memory.OSCache()}):
        with pytest.raises(ValueError, match="read through the process cache"):
            beton.Loader(url, batch_size=32, **contradiction)


def test_pages_are_fetched_ahead_several_at_once(served, server):
    _, url, _ = served
    server.latency = 0.05  # each answer takes a while, so requests started together overlap
    server.most_at_once = 0
    options = RemoteOptions(max_in_flight=4, request_bytes=PAGE_SIZE, timeout=5.0)
    with beton.Reader(url, remote=options) as reader:
        pages = reader.remote.pages
        pages.will_read(np.arange(12))
        for page in range(12):
            assert pages.page(page).tobytes() == bytes(reader.file_map[slice(*reader.page_bounds(page))])
    assert server.most_at_once >= 3


def test_the_first_pages_of_a_plan_come_in_small_requests_and_later_ones_in_full_ones(served, server):
    """Requests in flight share the link: a plan of consecutive pages fetched in full-size requests would hold its
    first page back until several full requests had arrived."""
    _, url, _ = served
    options = dataclasses.replace(FAST, max_in_flight=1, request_bytes=8 * PAGE_SIZE)
    with beton.Reader(url, remote=options) as reader:
        pages = reader.remote.pages
        requested = []
        fetch = pages.fetcher.fetch
        pages.fetcher.fetch = lambda start, end, what: requested.append((start, end)) or fetch(start, end, what)
        pages.will_read(np.arange(60))
        for page in range(60):
            assert pages.page(page).tobytes() == bytes(reader.file_map[slice(*reader.page_bounds(page))])
    sizes = [(end - start) // PAGE_SIZE for start, end in requested]
    assert sum(sizes) == 60 and len(requested) == len(set(requested))
    assert sizes[:8] == [1] * 8  # the first pages: one per request
    assert sizes[:-1] == sorted(sizes[:-1]) and max(sizes) == 8  # then growing up to request_bytes (the last
    # request holds what is left)
    starts = [start for start, _ in requested]
    assert starts == sorted(starts)  # in the plan's order


def test_expected_reads_follows_a_least_recently_used_cache():
    batches = [np.array([0, 1]), np.array([1, 2]), np.array([0, 3]), np.array([2])]
    assert expected_reads(batches, budget_pages=10).tolist() == [0, 1, 2, 3]
    assert expected_reads(batches, budget_pages=2).tolist() == [0, 1, 2, 0, 3, 2]


# ---- faults ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["drop", "503", "truncate", "short", "slow", "corrupt"])
def test_transient_faults_on_pages_are_retried_and_the_data_is_right(served, server, kind):
    _, url, path = served
    options = RemoteOptions(retries=4, backoff=0.001, max_backoff=0.01, timeout=0.5)
    with beton.Reader(url, remote=options) as reader:
        fetched_before = reader.remote.pages.pages_fetched
        heap = reader.heap_offset
        faults = [Fault(kind, times=2, from_byte=heap, delay=1.5), Fault(kind, times=1, from_byte=heap + 40 * PAGE_SIZE,
                                                                           delay=1.5)]
        server.faults.extend(faults)
        assert_same_samples(reader, path)
        assert all(fault.times == 0 for fault in faults)  # every fault was met
        if kind == "corrupt":
            assert reader.remote.pages.pages_fetched > fetched_before + reader.num_pages  # pages fetched again


@pytest.mark.parametrize("kind", ["drop", "503", "truncate", "corrupt"])
def test_transient_faults_while_opening_are_retried(served, server, kind):
    _, url, path = served
    with beton.Reader(path) as local:
        tables = local.heap_offset + local.heap_size
    fault = Fault(kind, times=1, from_byte=tables)  # the tables, after the heap
    server.faults.append(fault)
    with beton.Reader(url, remote=FAST) as reader:
        assert fault.times == 0
        assert_same_samples(reader, path)


def test_loader_survives_faults_in_the_middle_of_an_epoch(served, server):
    _, url, path = served
    expected = loader_batches(path, order=beton.OrderOption.QUASI_RANDOM, os_cache=False)
    with beton.Reader(path) as local:
        middle = local.heap_offset + local.heap_size // 2
    faults = [Fault(kind, times=1, from_byte=middle) for kind in ("503", "corrupt", "drop", "truncate", "corrupt")]
    server.faults.extend(faults)
    got = loader_batches(url, order=beton.OrderOption.QUASI_RANDOM, remote=fast())
    assert all(fault.times == 0 for fault in faults)
    assert_same_batches(got, expected)


def test_a_server_that_keeps_failing_raises_a_storage_error_naming_url_and_page(served, server):
    _, url, _ = served
    with beton.Reader(url, remote=FAST) as reader:
        page = 7
        server.faults.append(Fault("503", times=1000, from_byte=reader.page_bounds(page)[0]))
        with pytest.raises(StorageError) as caught:
            reader.payload(int(np.argmax(reader.allocation_table[:, 0]["offset"] >= reader.page_bounds(page)[0])),
                           "arr")
    error = caught.value
    assert error.path == url and str(url) in str(error)
    assert "page" in str(error) and f"failed {FAST.retries + 1} times" in str(error) and "503" in str(error)
    assert isinstance(error, OSError) and isinstance(error, BetonError)


def test_a_page_that_keeps_arriving_corrupted_is_never_returned(served, server):
    _, url, _ = served
    with beton.Reader(url, remote=FAST) as reader:
        page = 11
        start, _ = reader.page_bounds(page)
        server.faults.append(Fault("corrupt", times=1000, from_byte=start))
        with pytest.raises(CorruptDataError) as caught:
            reader.file_map[start : start + 10]
    assert caught.value.page == page and caught.value.path == url
    assert f"page {page}" in str(caught.value) and url in str(caught.value)


def test_loader_raises_in_the_training_loop_when_retries_run_out(served, server):
    _, url, _ = served
    loader = beton.Loader(url, batch_size=32, num_workers=2, pipelines=LOADER_PIPELINES, remote=fast())
    with beton.Reader(url, remote=FAST) as reader:
        server.faults.append(Fault("503", times=1000, from_byte=reader.page_bounds(reader.num_pages // 2)[0]))
    delivered = 0
    with pytest.raises(StorageError, match="503"):
        for _ in loader:
            delivered += 1
    loader.close()
    assert 0 < delivered < len(loader)


def test_missing_remote_file_and_a_server_ignoring_ranges(served, server):
    server_, url, _ = served
    with pytest.raises(FileNotFoundError, match="missing.beton"):
        beton.Reader(server_.url("missing.beton"), remote=FAST)
    server.faults.append(Fault("full", times=1))
    with pytest.raises(StorageError, match="does not honour Range"):
        beton.Reader(url, remote=FAST)


def test_a_file_that_is_not_beton_is_refused_like_a_local_one(tmp_path):
    (tmp_path / "text.beton").write_bytes(b"hello, world" * 100)
    with RangeServer(tmp_path) as server, pytest.raises(FormatError, match="not a beton file"):
        beton.Reader(server.url("text.beton"), remote=FAST)


def test_a_file_replaced_on_the_server_is_noticed_at_the_next_epoch(tmp_path):
    path = write(str(tmp_path / "data.beton"), MIXED_FIELDS, [mixed_sample(i) for i in range(50)], page_size=1024)
    with RangeServer(tmp_path) as server:
        loader = beton.Loader(server.url("data.beton"), batch_size=10, num_workers=1, pipelines=LOADER_PIPELINES,
                              remote=fast())
        assert len(list(loader)) == 5
        write(str(tmp_path / "new.beton"), MIXED_FIELDS, [mixed_sample(i + 1) for i in range(50)], page_size=1024)
        os.replace(tmp_path / "new.beton", path)
        with pytest.raises(FormatError, match="changed since it was opened") as caught:
            list(loader)
        assert caught.value.path == server.url("data.beton")
        loader.close()


@settings(max_examples=15)
@given(st.lists(st.tuples(st.sampled_from(["drop", "503", "truncate", "short", "corrupt"]), st.integers(0, 110)),
                max_size=FAST.retries))
def test_any_faults_within_the_retry_budget_leave_the_data_exact(served, faults):
    """At most ``retries`` failed responses, wherever they fall (header, tables, any page), cannot exhaust a
    budget: the data must come back exact."""
    server, url, path = served
    server.faults.clear()
    with beton.Reader(path) as local:
        heap, heap_size = local.heap_offset, local.heap_size
    server.faults.extend(Fault(kind, 1, from_byte=(heap + heap_size * where // 100) if where <= 100 else 0)
                         for kind, where in faults)
    try:
        with beton.Reader(url, remote=FAST) as reader:
            assert_same_samples(reader, path)
    finally:
        server.faults.clear()


# ---- the disk cache -------------------------------------------------------------------------------------------

def test_a_second_epoch_reads_the_disk_cache_and_nothing_from_the_server(served, server, tmp_path):
    _, url, path = served
    expected = loader_batches(path, epochs=2, order=beton.OrderOption.QUASI_RANDOM, os_cache=False)
    requests = []
    with beton.Loader(url, batch_size=32, num_workers=2, seed=3, pipelines=LOADER_PIPELINES,
                      order=beton.OrderOption.QUASI_RANDOM, remote=fast(cache_dir=tmp_path)) as loader:
        got = []
        for _ in range(2):
            before = server.requests
            got.append([tuple(np.array(value.numpy()) for value in batch) for batch in loader])
            requests.append(server.requests - before)
    assert requests[0] > 0 and requests[1] == 0
    assert_same_batches(got, expected)


def test_the_cache_keeps_within_its_limit_and_drops_the_least_recently_used(tmp_path):
    cache = DiskPageCache(tmp_path, limit=3000, url="url", version=(1,))
    for page in range(3):
        cache.put(page, bytes([page]) * 1000)
    assert cache.get(0, 1000) == bytes([0]) * 1000  # now the most recently used
    cache.put(3, bytes([3]) * 1000)
    assert [cache.contains(page) for page in range(4)] == [True, False, True, True]
    cache.put(4, b"x" * 5000)  # larger than the limit: not kept
    assert not cache.contains(4)
    other = DiskPageCache(tmp_path, limit=3000, url="another url", version=(1,))  # one limit for the whole directory
    other.put(0, b"y" * 2500)
    held = sum(os.path.getsize(os.path.join(root, name)) for root, _, names in os.walk(cache.root)
               for name in names if not name.startswith(".") and root != cache.root)
    assert held <= 3000 and other.get(0, 2500) == b"y" * 2500


def test_a_damaged_cached_page_is_fetched_again(served, server, tmp_path):
    _, url, path = served
    with beton.Reader(url, remote=fast(cache_dir=tmp_path)) as reader:
        assert_same_samples(reader, path)
        directory = reader.remote.pages.cache.directory
    damaged = os.path.join(directory, "5")
    with open(damaged, "r+b") as file:
        file.seek(100)
        byte = file.read(1)
        file.seek(100)
        file.write(bytes([byte[0] ^ 1]))
    os.truncate(os.path.join(directory, "6"), 10)
    before = server.requests
    with beton.Reader(url, remote=fast(cache_dir=tmp_path)) as reader:
        assert_same_samples(reader, path)
    assert server.requests - before == 2 + 2  # the two damaged pages, plus header and tables


_CACHE_WORKER = textwrap.dedent("""
    import sys
    import numpy as np
    import beton
    from beton.storage.remote import RemoteOptions
    url, local_path, cache_dir = sys.argv[1:]
    options = RemoteOptions(retries=4, backoff=0.001, timeout=5.0, cache_dir=cache_dir, cache_limit=60_000)
    for _ in range(3):
        with beton.Reader(url, remote=options) as remote, \\
                beton.Reader(local_path) as local:
            for i in np.random.default_rng().permutation(len(local)):
                for x, y in zip(remote[i], local[i]):
                    assert np.array_equal(x, y) if isinstance(x, np.ndarray) else x == y, (i, x, y)
    print("ok")
""")


def test_processes_sharing_one_cache_directory_read_the_right_data(served, server, tmp_path):
    _, url, path = served
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.dirname(os.path.dirname(beton.__file__)),
                                                               os.environ.get("PYTHONPATH", "")])}
    workers = [subprocess.Popen([sys.executable, "-c", _CACHE_WORKER, url, path, str(tmp_path)], env=environment,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outputs = [worker.communicate(timeout=240) for worker in workers]
    assert all(worker.returncode == 0 for worker in workers), [err[-2000:] for _, err in outputs]
    own = os.path.join(tmp_path, f"beton-pages-v1-{os.geteuid()}")
    pages = [os.path.join(root, name) for root, _, names in os.walk(own) for name in names if name.isdigit()]
    assert pages and sum(os.path.getsize(page) for page in pages) <= 60_000
    assert not [name for _, _, names in os.walk(tmp_path) for name in names if name.startswith(".partial")]


# ---- S3 (moto's server) ----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def s3(served):
    with moto_s3() as options:
        import fsspec

        fs = fsspec.filesystem("s3", skip_instance_cache=True, **options)
        fs.mkdir("beton-test")
        _, _, path = served
        fs.put_file(path, "beton-test/data.beton")
        yield "s3://beton-test/data.beton", options, path


def test_reader_and_loader_over_s3(s3):
    url, options, path = s3
    with beton.Reader(url, remote=fast(storage_options=options)) as reader:
        assert ("ETag", reader.remote.identity[1][1]) in reader.remote.identity
        assert_same_samples(reader, path)
    assert beton.verify(url, remote=RemoteOptions(storage_options=options)).num_samples == NUM_SAMPLES
    expected = loader_batches(path, order=beton.OrderOption.QUASI_RANDOM, os_cache=False)
    got = loader_batches(url, order=beton.OrderOption.QUASI_RANDOM, remote=fast(storage_options=options))
    assert_same_batches(got, expected)


def test_s3_credentials_come_from_fsspec_configuration(s3, monkeypatch, capsys):
    url, options, _ = s3
    import fsspec.config

    monkeypatch.setitem(fsspec.config.conf, "s3", dict(options))  # what FSSPEC_S3_* variables or a config file set
    assert cli(["info", url]) == 0
    assert f"samples:     {NUM_SAMPLES}" in capsys.readouterr().out


def test_a_missing_s3_object(s3):
    _, options, _ = s3
    with pytest.raises(FileNotFoundError):
        beton.Reader("s3://beton-test/nothing.beton", remote=fast(storage_options=options))


def test_local_paths_are_unchanged(served):
    _, _, path = served
    with beton.Reader(path, remote=RemoteOptions(cache_dir="/nonexistent/never-used")) as reader:
        assert reader.remote is None
    shutil.copy(path, path + ".copy")
    assert beton.verify(path + ".copy").num_samples == NUM_SAMPLES
