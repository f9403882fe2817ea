"""The remote page cache on disk is safe where other local users can write (issue #25 item 3): planted links,
FIFOs, devices, directories and files of the wrong size or owner are cache misses (the page is fetched again over
a loopback HTTP server, the entry replaced without following it), never errors, hangs or writes elsewhere; each
user keeps pages in a directory of their own, and one that is not theirs alone is refused with CacheDirError.

Reads that a bad entry could hang or blow up (a FIFO, /dev/zero, a huge sparse file) run in a child process
(tests/cache_reader.py) with a time limit and an address-space limit, so that a regression fails the test instead
of hanging it or exhausting the machine's memory. Cases that need another user run as root: the child drops to
``nobody`` once it has imported what it needs."""

from __future__ import annotations

import dataclasses
import os
import shutil
import stat
import subprocess
import sys
import tempfile

import pytest

pytest.importorskip("fsspec", reason="remote reads need fsspec (the 'remote' extra)")
pytest.importorskip("aiohttp", reason="fsspec reads http:// through aiohttp (the 'remote' extra)")

import beton  # noqa: E402
from beton.errors import CacheDirError  # noqa: E402
from beton.storage.remote import RemoteOptions  # noqa: E402
from cache_reader import FAST, read_everything  # noqa: E402
from conftest import MIXED_FIELDS, mixed_sample, write  # noqa: E402
from range_server import RangeServer  # noqa: E402

NUM_SAMPLES = 120
PAGE_SIZE = 1024
CHILD = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "cache_reader.py")
NOBODY = 65534
as_root = pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0,
                             reason="acting as a second user needs root (to chown, or to setuid to nobody)")


def fast(**options) -> RemoteOptions:
    return dataclasses.replace(FAST, **options)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    directory = tmp_path_factory.mktemp("served")
    path = write(str(directory / "data.beton"), MIXED_FIELDS, [mixed_sample(i) for i in range(NUM_SAMPLES)],
                 page_size=PAGE_SIZE)
    with RangeServer(directory) as server:
        yield server, server.url("data.beton"), path


def read_in_child(url: str, local_path: str, cache_dir: str, user: int | None = None, timeout: float = 120) -> int:
    """Read every sample in a child process (tests/cache_reader.py; as ``user`` when given), within ``timeout``
    seconds and 2 GiB more address space than it starts with; the pages it fetched over the network. A hang, a
    MemoryError or any other error fails the test."""
    command = [sys.executable, CHILD, url, local_path, cache_dir, "-" if user is None else str(user)]
    try:
        child = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"reading through the cache hung for {timeout} s")
    assert child.returncode == 0 and child.stdout.startswith("fetched "), child.stdout + child.stderr[-4000:]
    return int(child.stdout.split()[1])


@pytest.fixture
def warm(served, tmp_path):
    """A cache directory holding every page of the served file: (url, local path, cache_dir, the file's page
    directory, its number of pages)."""
    _, url, path = served
    reader = read_everything(url, path, str(tmp_path))
    directory = reader.remote.pages.cache.directory
    pages = sorted(int(name) for name in os.listdir(directory) if name.isdigit())
    assert pages == list(range(reader.num_pages))
    return url, path, str(tmp_path), directory, reader.num_pages


def _page_elsewhere(page: str, outside: str) -> None:
    """A link to a file outside the cache holding the page's own (correct) bytes: a link is never followed."""
    shutil.copy(page, outside)
    os.unlink(page)
    os.symlink(outside, page)


def _not_empty_directory(page: str, _: str) -> None:
    os.unlink(page)
    os.mkdir(page)
    with open(os.path.join(page, "inside"), "wb") as file:
        file.write(b"x")


def _others_file(page: str, _: str) -> None:
    os.chown(page, NOBODY, NOBODY)  # the right bytes, but not this user's: not read


#: what is planted where a cached page was: (how, whether the entry ends up a regular file again)
BAD_PAGES = {
    "link to /dev/zero": (lambda page, _: (os.unlink(page), os.symlink("/dev/zero", page)), True),
    "FIFO": (lambda page, _: (os.unlink(page), os.mkfifo(page)), True),
    "huge sparse file": (lambda page, _: os.truncate(page, 64 << 30), True),  # read whole: MemoryError
    "empty directory": (lambda page, _: (os.unlink(page), os.mkdir(page)), True),
    "directory with a file": (_not_empty_directory, False),
    "link to a copy elsewhere": (_page_elsewhere, True),
    "another user's file": (_others_file, True),
}


@pytest.mark.parametrize("kind", list(BAD_PAGES))
def test_an_unexpected_entry_where_a_page_should_be_is_a_miss_and_is_replaced(warm, tmp_path_factory, kind):
    if kind == "another user's file" and os.geteuid() != 0:
        pytest.skip("giving a file to another user needs root")
    url, path, cache_dir, directory, num_pages = warm
    plant, replaced = BAD_PAGES[kind]
    outside = str(tmp_path_factory.mktemp("outside") / "page")
    bad = [3, num_pages // 2]
    for page in bad:
        plant(os.path.join(directory, str(page)), f"{outside}-{page}")
    fetched = read_in_child(url, path, cache_dir)
    assert fetched == len(bad)  # the bad pages, fetched again; every other page came from the cache
    for page in bad:
        status = os.lstat(os.path.join(directory, str(page)))
        assert stat.S_ISREG(status.st_mode) == replaced and (not replaced or status.st_size <= PAGE_SIZE)
        if replaced:
            assert status.st_uid == os.geteuid()
    if kind == "link to a copy elsewhere":
        assert all(os.path.getsize(f"{outside}-{page}") <= PAGE_SIZE for page in bad)  # untouched, not replaced
    assert read_in_child(url, path, cache_dir) == (0 if replaced else len(bad))


# ---- links planted beside the pages ---------------------------------------------------------------------------

def test_links_planted_for_usage_lock_and_a_page_directory_write_nothing_elsewhere(warm, served, tmp_path_factory):
    url, path, cache_dir, directory, _ = warm
    root = os.path.dirname(directory)
    outside = tmp_path_factory.mktemp("victim")
    victim_file = outside / "precious"
    victim_file.write_bytes(b"keep me")
    elsewhere = outside / "pages"
    elsewhere.mkdir()
    for name in ("usage", "lock"):
        if os.path.lexists(os.path.join(root, name)):
            os.unlink(os.path.join(root, name))
    os.symlink(victim_file, os.path.join(root, "usage"))  # an overwrite of the usage file would land there
    os.symlink(outside / "created-by-lock", os.path.join(root, "lock"))  # O_CREAT through a link creates it
    os.symlink(victim_file, os.path.join(root, f"usage.{os.getpid()}"))  # the temporary name beton once used
    shutil.rmtree(directory)
    os.symlink(elsewhere, directory)  # pages written through it would land elsewhere
    # a limit makes every store read and write the usage file under the lock, and evict
    read_everything(url, path, cache_dir, cache_limit=40 * PAGE_SIZE)
    assert victim_file.read_bytes() == b"keep me"
    assert sorted(os.listdir(outside)) == ["pages", "precious"] and os.listdir(elsewhere) == []
    for name in ("usage", "lock"):
        assert stat.S_ISREG(os.lstat(os.path.join(root, name)).st_mode)
    assert stat.S_ISDIR(os.lstat(directory).st_mode) and os.listdir(directory)
    assert int(open(os.path.join(root, "usage")).read()) <= 40 * PAGE_SIZE


# ---- whose directory ------------------------------------------------------------------------------------------

def own_root(cache_dir) -> str:
    return os.path.join(cache_dir, f"beton-pages-v1-{os.geteuid()}")


def test_pages_live_in_a_directory_of_this_user_with_mode_0700(served, tmp_path):
    _, url, path = served
    read_everything(url, path, str(tmp_path))
    status = os.lstat(own_root(tmp_path))
    assert stat.S_ISDIR(status.st_mode) and stat.S_IMODE(status.st_mode) == 0o700
    assert status.st_uid == os.geteuid()
    entries = os.listdir(own_root(tmp_path))
    (key,) = [name for name in entries if name not in ("lock", "usage") and not name.endswith(".version")]
    (marker,) = [name for name in entries if name.endswith(".version")]  # which version of the URL is cached
    assert stat.S_IMODE(os.lstat(os.path.join(own_root(tmp_path), marker)).st_mode) == 0o600
    pages = os.path.join(own_root(tmp_path), key)
    assert stat.S_IMODE(os.lstat(pages).st_mode) == 0o700
    assert {stat.S_IMODE(os.lstat(os.path.join(pages, name)).st_mode) for name in os.listdir(pages)} == {0o600}


def test_a_link_planted_where_this_users_directory_belongs_is_refused(served, tmp_path, tmp_path_factory):
    _, url, _ = served
    elsewhere = tmp_path_factory.mktemp("attacker")
    os.symlink(elsewhere, own_root(tmp_path))
    with pytest.raises(CacheDirError, match="symbolic link") as caught:
        beton.Reader(url, remote=fast(cache_dir=tmp_path))
    assert own_root(tmp_path) in str(caught.value) and "cache_dir" in str(caught.value)
    assert os.listdir(elsewhere) == []


def test_a_directory_of_this_user_that_others_can_write_is_refused(served, tmp_path):
    _, url, _ = served
    os.mkdir(own_root(tmp_path))
    os.chmod(own_root(tmp_path), 0o777)
    with pytest.raises(CacheDirError, match="writable by group or others") as caught:
        beton.Reader(url, remote=fast(cache_dir=tmp_path))
    assert own_root(tmp_path) in str(caught.value) and "Remove" in str(caught.value)


@as_root
def test_another_users_directory_in_this_users_place_is_refused(served, tmp_path):
    _, url, _ = served
    os.mkdir(own_root(tmp_path), 0o700)
    os.chown(own_root(tmp_path), NOBODY, NOBODY)
    with pytest.raises(CacheDirError, match=f"belongs to user id {NOBODY}"):
        beton.Reader(url, remote=fast(cache_dir=tmp_path))


@as_root
def test_a_cache_dir_of_another_user_open_to_all_holds_a_private_directory_of_this_user(served, tmp_path):
    _, url, path = served
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chown(shared, NOBODY, NOBODY)
    os.chmod(shared, 0o777)
    read_everything(url, path, str(shared))
    status = os.lstat(own_root(shared))
    assert (status.st_uid, stat.S_IMODE(status.st_mode)) == (os.geteuid(), 0o700)


@as_root
def test_two_users_share_one_cache_directory_each_with_their_own_pages(served):
    server, url, path = served
    # outside pytest's own temporary directory, which only root may enter
    shared = tempfile.mkdtemp(prefix="beton-shared-cache-")
    readable = tempfile.mkdtemp(prefix="beton-served-copy-")
    try:
        os.chmod(shared, 0o1777)  # as /tmp
        os.chmod(readable, 0o755)
        local = shutil.copy(path, readable)
        os.chmod(local, 0o644)
        assert read_in_child(url, local, shared) > 0  # root first: its pages are 0600 in its own directory
        assert read_in_child(url, local, shared, user=NOBODY) > 0  # nobody: a cold cache of its own
        assert read_in_child(url, local, shared, user=NOBODY) == 0  # and warm
        assert read_in_child(url, local, shared) == 0  # root's pages are still there
        for user in (0, NOBODY):
            status = os.lstat(os.path.join(shared, f"beton-pages-v1-{user}"))
            assert (status.st_uid, stat.S_IMODE(status.st_mode)) == (user, 0o700)
    finally:
        shutil.rmtree(shared, ignore_errors=True)
        shutil.rmtree(readable, ignore_errors=True)
