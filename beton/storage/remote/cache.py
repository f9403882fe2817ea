"""The page cache on local disk: remote pages kept between epochs, shared by the processes of one node.

Layout: ``<cache_dir>/beton-pages-v1/<file key>/<page number>``, one file per page, plus ``lock`` and ``usage``
in ``beton-pages-v1``. The file key is a hash of the URL, the object's size and version markers (ETag...) and
its header bytes, so a changed remote file never meets the pages of its former self.

Concurrency model (several processes, e.g. one per GPU, and several threads in each):

* A page is written to a temporary name in its directory and renamed onto its final name, so a reader opens
  either nothing or a whole page (rename is atomic within a file system); two processes that fetch the same
  page both rename, and either copy is the page. Every page read back is checked against its CRC32 by the
  caller (:mod:`beton.storage.remote.pages`), so even a page damaged on disk is fetched again, never used.
* Recency: reading a page sets its modification time to now (``os.utime``); eviction drops the pages with the oldest
  times first (least recently used across every process).
* Size: ``usage`` holds the bytes the cache holds; it is read and updated under an exclusive ``flock`` of
  ``lock`` whenever a page is added. When a page would take it past ``cache_limit`` the directory is scanned
  (correcting any drift from crashed processes) and the oldest pages are removed until the new one fits.
  A page removed while another process reads it stays readable through that process's open descriptor.

The limit counts page bytes only (not directories or file system blocks). A page larger than the limit is not
cached.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import tempfile
import time
from collections.abc import Iterator

__all__ = ["DiskPageCache"]

_ROOT = "beton-pages-v1"


class DiskPageCache:
    def __init__(self, cache_dir: str | os.PathLike[str], limit: int | None, key_parts: tuple[object, ...]) -> None:
        self.root = os.path.join(os.fspath(cache_dir), _ROOT)
        self.key = hashlib.sha256(repr(key_parts).encode("utf-8")).hexdigest()[:32]
        self.directory = os.path.join(self.root, self.key)
        self.limit = limit
        os.makedirs(self.directory, exist_ok=True)
        self._lock_path = os.path.join(self.root, "lock")
        self._usage_path = os.path.join(self.root, "usage")

    def _path(self, page: int) -> str:
        return os.path.join(self.directory, str(page))

    def contains(self, page: int) -> bool:
        return os.path.exists(self._path(page))

    def get(self, page: int) -> bytes | None:
        """The cached bytes of a page (unchecked: the caller checks its CRC32), or None."""
        path = self._path(page)
        try:
            with open(path, "rb") as file:
                data = file.read()
        except FileNotFoundError:
            return None
        _touch(path)
        return data

    def discard(self, page: int) -> None:
        """Forget a page whose bytes failed their checksum."""
        try:
            size = os.path.getsize(self._path(page))
            os.unlink(self._path(page))
        except FileNotFoundError:
            return
        with self._locked():
            self._write_usage(max(0, self._read_usage() - size))

    def put(self, page: int, data: bytes | memoryview) -> None:
        """Store a page (already checked) unless it cannot fit under the limit."""
        size = len(data)
        if self.limit is not None and size > self.limit:
            return
        descriptor, temporary = tempfile.mkstemp(prefix=".partial-", dir=self.directory)
        try:
            with os.fdopen(descriptor, "wb") as file:
                file.write(data)
            with self._locked():
                usage = self._read_usage()
                if self.limit is not None and usage + size > self.limit:
                    usage = self._evict(self.limit - size)
                replaced = _size_or_zero(self._path(page))
                os.replace(temporary, self._path(page))
                temporary = None
                _touch(self._path(page))
                self._write_usage(usage - replaced + size)
        finally:
            if temporary is not None:
                _unlink_quietly(temporary)

    # ---- under the lock -------------------------------------------------------------------------------------

    def _evict(self, target: int) -> int:
        """Remove the least recently used pages until the cache holds at most ``target`` bytes; its new size."""
        entries = sorted(_pages(self.root), key=lambda entry: entry[1])  # (path, mtime, size), oldest first
        total = sum(size for _, _, size in entries)
        for path, _, size in entries:
            if total <= target:
                break
            _unlink_quietly(path)
            total -= size
        return total

    def _read_usage(self) -> int:
        try:
            with open(self._usage_path, "rb") as file:
                return max(0, int(file.read().strip() or b"0"))
        except (FileNotFoundError, ValueError):
            return sum(size for _, _, size in _pages(self.root))

    def _write_usage(self, usage: int) -> None:
        temporary = f"{self._usage_path}.{os.getpid()}"
        with open(temporary, "wb") as file:
            file.write(str(usage).encode("ascii"))
        os.replace(temporary, self._usage_path)

    def _locked(self) -> _FileLock:
        return _FileLock(self._lock_path)


class _FileLock:
    """An exclusive ``flock`` on a file, held for a ``with`` block (between processes, and between threads,
    since every use opens its own descriptor)."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._descriptor = -1

    def __enter__(self) -> _FileLock:
        self._descriptor = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o666)
        fcntl.flock(self._descriptor, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc_info: object) -> None:
        fcntl.flock(self._descriptor, fcntl.LOCK_UN)
        os.close(self._descriptor)


def _pages(root: str) -> Iterator[tuple[str, int, int]]:
    """Every cached page under ``root``: (path, modification time, size); temporary files are not pages."""
    try:
        directories = list(os.scandir(root))
    except FileNotFoundError:
        return
    for directory in directories:
        if not directory.is_dir(follow_symlinks=False):
            continue
        try:
            entries = list(os.scandir(directory.path))
        except FileNotFoundError:
            continue
        for entry in entries:
            if entry.name.startswith(".") or not entry.is_file(follow_symlinks=False):
                continue
            try:
                status = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            yield entry.path, status.st_mtime_ns, status.st_size


def _touch(path: str) -> None:
    """Mark a page used now. The time is given explicitly: file systems stamp times from a coarse clock
    (milliseconds), under which pages used one after the other would tie."""
    now = time.time_ns()
    try:
        os.utime(path, ns=(now, now))
    except OSError:  # removed meanwhile by another process's eviction: nothing to mark
        pass


def _size_or_zero(path: str) -> int:
    try:
        return os.path.getsize(path)
    except FileNotFoundError:
        return 0


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
