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
    """Thread A hashes page 0 (held until B waits for it); the page does not match: both raise, naming it."""
    expected = np.frombuffer(digests.digest(b"honest"), np.uint8)[None, :]
    pages = digests.PageDigests(["f.beton"], expected.copy(), np.array([0, 1]), np.zeros(1, bool))
    b_waits, errors = threading.Event(), {}
    asked: list[str] = []

    def page_bytes(name):
        def read(page):
            asked.append(name)
            if name == "a":
                assert b_waits.wait(10)
            return b"forged"
        return read

    def check(name):
        try:
            pages.check_pages([0], page_bytes(name))
        except beton.errors.CorruptDataError as error:
            errors[name] = error

    a = threading.Thread(target=check, args=("a",))
    a.start()
    while not pages._hashing:  # A has claimed page 0
        time.sleep(0.001)
    b = threading.Thread(target=check, args=("b",))
    b.start()
    time.sleep(0.05)
    assert asked == ["a"]  # B did not hash page 0 while A was hashing it
    b_waits.set()
    a.join(10), b.join(10)
    assert set(errors) == {"a", "b"} and all(error.page == 0 and error.path == "f.beton" for error in errors.values())
