"""Content checks on read (``verify_content=True``) hash each heap page once per Loader, whichever memory layer and
however many workers need the page at the same moment; a forged page is still refused."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import beton.errors
import beton.storage.digests as digests
from beton import Loader, Reader
from beton.memory import OSCache, ProcessCache
from beton.order import OrderOption
from beton.fields import IntField, NDArrayField

from conftest import write

PAGE = 4096
FIELDS = {"label": IntField(), "blob": NDArrayField(np.uint8, (1000,))}


@pytest.fixture
def written(tmp_path):
    return write(tmp_path / "pages.beton", FIELDS, [(i, np.full(1000, i % 251, np.uint8)) for i in range(64)],
                 page_size=PAGE)


@pytest.fixture
def hashed(monkeypatch):
    """Every page hashed, by size; each hash slowed down, so that two workers needing a page find each other."""
    sizes: list[int] = []
    lock = threading.Lock()
    honest = digests.digest

    def slow_digest(data):
        with lock:
            sizes.append(memoryview(data).nbytes)
        time.sleep(0.01)
        return honest(data)

    monkeypatch.setattr(digests, "digest", slow_digest)
    return sizes


@pytest.mark.parametrize("memory", [OSCache(), ProcessCache()], ids=["os_cache", "process_cache"])
def test_each_page_is_hashed_once_per_loader(written, hashed, memory):
    with Loader(written, batch_size=8, num_workers=3, order=OrderOption.RANDOM, seed=1, memory=memory,
                verify_content=True) as loader:
        first = [label.numpy().reshape(-1).copy() for label, _ in loader]
        hashed_first = len(hashed)
        second = [label.numpy().reshape(-1).copy() for label, _ in loader]
    with Reader(written) as reader:
        num_pages = reader.num_pages
        sizes = sorted(end - start for start, end in map(reader.page_bounds, range(num_pages)))
    assert sorted(hashed) == sizes  # every page once, whole, in the first epoch
    assert hashed_first == num_pages and len(hashed) == num_pages  # and nothing in the second
    assert sorted(np.concatenate(first).tolist()) == sorted(np.concatenate(second).tolist()) == list(range(64))


def test_a_thread_waiting_for_a_page_another_found_forged_raises_too():
    """Thread A hashes page 0, held until B has decided what to do about it: B waits for A rather than hashing the
    page too. The page does not match: both raise, naming it (B hashing it once A let go)."""
    expected = np.frombuffer(digests.digest(b"honest"), np.uint8)[None, :]
    pages = digests.PageDigests(["f.beton"], expected.copy(), np.array([0, 1]), np.zeros(1, bool))
    a_hashes, b_decided, errors = threading.Event(), threading.Event(), {}
    b_did: list[str] = []

    class Observed:
        """A's event for page 0, as B sees it."""

        def __init__(self, event: threading.Event) -> None:
            self._event = event

        def wait(self, timeout: float | None = None) -> bool:
            b_did.append("waited")
            b_decided.set()
            return self._event.wait(timeout)

    def page_bytes(name):
        def read(page):
            if name == "a":
                a_hashes.set()
                assert b_decided.wait(10)
            else:
                b_did.append("hashed")
                b_decided.set()
            return b"forged"
        return read

    def check(name):
        try:
            pages.check_pages([0], page_bytes(name))
        except beton.errors.CorruptDataError as error:
            errors[name] = error

    a = threading.Thread(target=check, args=("a",))
    a.start()
    assert a_hashes.wait(10)  # A has claimed page 0
    with pages._lock:
        pages._hashing[0] = Observed(pages._hashing[0])
    b = threading.Thread(target=check, args=("b",))
    b.start()
    a.join(10), b.join(10)
    assert b_did == ["waited", "hashed"]  # B did not hash page 0 while A was hashing it, and did once A let go
    assert set(errors) == {"a", "b"} and all(error.page == 0 and error.path == "f.beton" for error in errors.values())
