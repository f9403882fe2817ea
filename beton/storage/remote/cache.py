"""The page cache on local disk: remote pages kept between epochs, shared by the processes of one node.

Layout: ``<cache_dir>/beton-pages-v1-<uid>/<file key>/<page number>``, one file per page, plus ``lock`` and
``usage`` in ``beton-pages-v1-<uid>``. The file key is a hash of the URL, the object's size and version markers
(ETag...) and its header bytes, so a changed remote file never meets the pages of its former self.

Stale versions: ``<url key>.version`` in ``beton-pages-v1-<uid>`` (the URL's hash) names the file key last opened
for that URL. Opening another version of the file (the object changed since its pages were cached) removes the
former version's pages, whatever ``cache_limit`` says: no reader can use them again, and without a limit they would
stay for ever (the cache held four times its dataset after a few re-uploads). One small file per URL, read under
the lock: opening a file costs no scan of the cache, however many files it holds.

Safety (several users on one node; see :mod:`beton.private_dirs`):

* Each user has a directory of their own, ``beton-pages-v1-<uid>`` (the effective user id), under ``cache_dir``,
  which may be shared (``/tmp``, mode 1777): it is created with mode 0700 and must be a directory (not a link)
  owned by the user and not writable by group or others, or opening the cache raises
  :class:`~beton.errors.CacheDirError`. Every operation opens it again and checks the descriptor, then works
  relative to it (``dir_fd=``): renaming or replacing the path meanwhile changes nothing.
* Inside, no link is ever followed (``O_NOFOLLOW``); new files are created with ``O_EXCL`` under random names and
  renamed into place (a rename replaces a link, never follows it); only regular files of this user's are read,
  checked before they are opened (a FIFO or device is never opened) and through the descriptor, and a page must
  hold exactly its page's bytes before a byte is read. Anything else where a page should be (a link, FIFO,
  device, directory, another user's file, a file of the wrong size) is a cache miss, never an error: the page is
  fetched again and its entry replaced by the rename (an empty directory is removed first; a directory that is
  not empty stays, and that page is not cached). A page directory that is not a directory of this user's is
  replaced the same way, else the file's pages are simply not cached. ``lock`` and ``usage`` likewise.

Concurrency model (several processes, e.g. one per GPU, and several threads in each):

* A page is written to a temporary name in its directory and renamed onto its final name, so a reader opens
  either nothing or a whole page (rename is atomic within a file system); two processes that fetch the same
  page both rename, and either copy is the page. Every page read back is checked against its CRC32 by the
  caller (:mod:`beton.storage.remote.pages`), so even a page damaged on disk is fetched again, never used.
* Recency: reading a page sets its modification time to now; eviction drops the pages with the oldest times
  first (least recently used across every process of this user).
* Size: ``usage`` holds the bytes the cache holds; it is read and updated under an exclusive ``flock`` of
  ``lock`` whenever a page is added. When a page would take it past ``cache_limit`` the directory is scanned
  (correcting any drift from crashed processes) and the oldest pages are removed until the new one fits.
  A page removed while another process reads it stays readable through that process's open descriptor.

Temporaries left by a crashed process (``.partial-*`` pages in a page directory, ``.usage-*`` and ``.version-*`` in
the root) hold bytes that ``usage`` does not count. Under the lock, a ``.usage-*`` or ``.version-*`` is always a dead process's (they are written
under it), and a ``.partial-*`` older than :data:`STALE_TEMPORARY_SECONDS` is too (a page is renamed into place
seconds after it is written; removing a live one would only cost that page a miss): opening a cache removes those
of the root and of the file's own page directory, and every eviction scan those of every page directory, counting
the younger ones' bytes against the limit.

The limit counts page bytes only (not directories or file system blocks), per user. A page larger than the
limit is not cached. No descriptor is held between calls (the cache survives ``fork``, and thousands of remote
files cost no descriptors).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import stat
import time
from collections.abc import Iterator

from beton.errors import CacheDirError
from beton.private_dirs import (
    DIRECTORY_FLAGS,
    open_private_directory,
    read_regular_file,
    replace_with,
    unlink_quietly,
    write_new_file,
)

__all__ = ["DiskPageCache"]

_ROOT = "beton-pages-v1"
_PARTIAL = ".partial-"
_LOCK_FLAGS = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_USAGE = ".usage-"
_USAGE_BYTES = 32  # a decimal number of bytes; a longer "usage" file is not ours
#: Age at which a page's temporary file is taken for a crashed process's (see the module docstring).
STALE_TEMPORARY_SECONDS = 600
_VERSION = ".version"  # "<url key>.version": the file key cached for that URL
_VERSION_TEMPORARY = ".version-"
_KEY = re.compile(r"[0-9a-f]{32}")


class DiskPageCache:
    """The cached pages of one version of the remote file ``url``; ``version``: what tells its versions apart
    (identity and header bytes)."""

    def __init__(self, cache_dir: str | os.PathLike[str], limit: int | None, url: str,
                 version: tuple[object, ...]) -> None:
        self.cache_dir = os.fspath(cache_dir)
        self.root = os.path.join(self.cache_dir, f"{_ROOT}-{os.geteuid()}")
        self.key = _digest((url, version))
        self._url_key = _digest(url)
        self.directory = os.path.join(self.root, self.key)
        self.limit = limit
        try:
            os.makedirs(self.cache_dir, exist_ok=True)  # the shared root; what is private is this user's directory
        except OSError as error:
            raise CacheDirError(f"cannot create the cache directory {self.cache_dir!r} (RemoteOptions.cache_dir): "
                                f"{error.strerror}. {self._fix()}") from error
        os.close(self._open_root())  # refused here, with an error that says why, rather than missed silently later
        self._remove_stale_version()
        #: Temporaries of crashed processes that opening removed (the root's and this file's page directory's)
        self.stale_temporaries_removed = self._remove_stale_temporaries()

    def _remove_stale_temporaries(self) -> int:
        try:
            with _Directories(self._open_root(), self.key) as (root, directory), _Lock(root):
                return _sweep(root, [directory], "")[0]
        except (_Unusable, CacheDirError, OSError):
            return 0

    def _fix(self) -> str:
        return (f"Remove {self.root!r} if it is not yours, or choose another RemoteOptions(cache_dir=...); "
                f"beton creates {os.path.basename(self.root)} itself (mode 0700) in a directory this user can write "
                f"(one shared by several users should have mode 1777, as /tmp)")

    def _open_root(self) -> int:
        return open_private_directory(self.root, what="remote page cache directory", fix=self._fix())

    def _remove_stale_version(self) -> None:
        """Remove the pages of the version of this URL cached before, if it is another one (module docstring), and
        record this one. A cache that cannot do it safely is left as it is."""
        marker = self._url_key + _VERSION
        try:
            root = self._open_root()
        except (CacheDirError, OSError):
            return
        try:
            with _Lock(root):
                recorded = read_regular_file(marker, root, most=len(self.key))
                if recorded == self.key.encode("ascii"):
                    return
                if recorded is not None and _KEY.fullmatch(recorded.decode("ascii", "replace")):
                    freed = _remove_page_directory(root, recorded.decode("ascii"))
                    if freed:
                        _write_usage(root, max(0, _read_usage(root) - freed))
                replace_with(root, write_new_file(root, self.key.encode("ascii"), _VERSION_TEMPORARY), marker)
        except (_Unusable, OSError):
            pass
        finally:
            os.close(root)

    def contains(self, page: int) -> bool:
        """Whether a page seems cached (a hint for reading ahead: :meth:`get` decides)."""
        try:
            status = os.stat(os.path.join(self.directory, str(page)), follow_symlinks=False)
        except OSError:
            return False
        return stat.S_ISREG(status.st_mode) and status.st_uid == os.geteuid()

    def get(self, page: int, size: int) -> bytes | None:
        """The cached bytes of a page of ``size`` bytes (unchecked: the caller checks its CRC32), or None when it is
        not cached as a regular file of this user's of exactly that size."""
        try:
            with _Directories(self._open_root(), self.key) as (_, directory):
                return read_regular_file(str(page), directory, size=size, touch=True)
        except (_Unusable, CacheDirError, OSError):
            return None

    def discard(self, page: int) -> None:
        """Forget a page whose bytes failed their checksum."""
        try:
            with _Directories(self._open_root(), self.key) as (root, directory):
                size = _size_of_page(directory, str(page))
                unlink_quietly(str(page), directory)
                if size:
                    with _Lock(root):
                        _write_usage(root, max(0, _read_usage(root) - size))
        except (_Unusable, CacheDirError, OSError):
            pass

    def put(self, page: int, data: bytes | memoryview) -> None:
        """Store a page (already checked) unless it cannot fit under the limit, or the cache cannot hold it safely
        (then it is simply not cached)."""
        size = len(data)
        if self.limit is not None and size > self.limit:
            return
        try:
            with _Directories(self._open_root(), self.key) as (root, directory):
                temporary = write_new_file(directory, data, _PARTIAL)
                try:
                    with _Lock(root):
                        usage = _read_usage(root)
                        if self.limit is not None and usage + size > self.limit:
                            usage = _evict(root, self.limit - size, temporary)
                        replaced = _size_of_page(directory, str(page))
                        stored = replace_with(directory, temporary, str(page))  # removes it if not
                        temporary = None
                        if not stored:
                            return
                        now = time.time_ns()
                        os.utime(str(page), ns=(now, now), dir_fd=directory, follow_symlinks=False)
                        _write_usage(root, usage - replaced + size)
                finally:
                    if temporary is not None:
                        unlink_quietly(temporary, directory)
        except (_Unusable, CacheDirError, OSError):
            pass


class _Unusable(Exception):
    """An entry of the cache is not what beton made and could not be replaced: treated as a miss."""


class _Directories:
    """(root, page directory) descriptors for a ``with`` block; the root descriptor is the one given."""

    def __init__(self, root: int, key: str) -> None:
        self._root, self._key, self._directory = root, key, -1

    def __enter__(self) -> tuple[int, int]:
        try:
            self._directory = _page_directory(self._root, self._key)
        except BaseException:
            os.close(self._root)
            raise
        return self._root, self._directory

    def __exit__(self, *exc_info: object) -> None:
        os.close(self._directory)
        os.close(self._root)


def _page_directory(root: int, key: str) -> int:
    """The descriptor of a file's page directory in ``root``, created if missing; an entry there that is not a
    directory of this user's (a link, a file, another user's directory) is removed and made again, once."""
    for attempt in range(2):
        try:
            return open_private_directory(key, dir_fd=root, what="page directory", fix="")
        except CacheDirError:
            if attempt:
                break
            try:
                os.unlink(key, dir_fd=root)  # a link or a file: removing it follows nothing
            except IsADirectoryError:
                try:
                    os.rmdir(key, dir_fd=root)
                except OSError:
                    break
            except OSError:
                break
    raise _Unusable(key)


class _Lock:
    """An exclusive ``flock`` on ``lock`` in the cache's root, held for a ``with`` block (between processes, and
    between threads, since every use opens its own descriptor). A ``lock`` entry that is not a regular file of this
    user's is removed and made again, once."""

    def __init__(self, root: int) -> None:
        self._root = root
        self._descriptor = -1

    def __enter__(self) -> _Lock:
        for _ in range(2):
            try:
                descriptor = os.open("lock", _LOCK_FLAGS, 0o600, dir_fd=self._root)
            except OSError:  # a link (ELOOP), a directory (EISDIR)...
                descriptor = -1
            if descriptor >= 0:
                status = os.fstat(descriptor)
                if stat.S_ISREG(status.st_mode) and status.st_uid == os.geteuid():
                    self._descriptor = descriptor
                    break
                os.close(descriptor)
            _remove_entry(self._root, "lock")
        else:
            raise _Unusable("lock")
        fcntl.flock(self._descriptor, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc_info: object) -> None:
        fcntl.flock(self._descriptor, fcntl.LOCK_UN)
        os.close(self._descriptor)


def _remove_entry(directory: int, name: str) -> None:
    """Remove an entry without following it: a link, file, FIFO or device is unlinked, an empty directory removed."""
    try:
        os.unlink(name, dir_fd=directory)
    except IsADirectoryError:
        try:
            os.rmdir(name, dir_fd=directory)
        except OSError:
            pass
    except OSError:
        pass


# ---- under the lock -------------------------------------------------------------------------------------------

def _evict(root: int, target: int, own: str) -> int:
    """Remove the least recently used pages until the cache holds at most ``target`` bytes, counting the bytes of
    temporaries other processes are writing (after removing those of crashed processes; ``own`` is the caller's,
    for which ``target`` makes room); the bytes of its pages then."""
    opened: dict[str, int] = {}
    try:
        for key in _page_directories(root):
            try:
                opened[key] = os.open(key, DIRECTORY_FLAGS, dir_fd=root)
            except OSError:
                continue
        writing = _sweep(root, list(opened.values()), own)[1]
        entries = sorted(_pages(root), key=lambda entry: entry[2])  # (directory, name, mtime, size), oldest first
        total = sum(size for *_, size in entries)
        for key, name, _, size in entries:
            if total + writing <= target:
                break
            if key not in opened:
                try:
                    opened[key] = os.open(key, DIRECTORY_FLAGS, dir_fd=root)
                except OSError:
                    continue
            unlink_quietly(name, opened[key])
            total -= size
    finally:
        for descriptor in opened.values():
            os.close(descriptor)
    return total


def _remove_page_directory(root: int, key: str) -> int:
    """Remove the page directory ``key`` and what it holds (never following a link); the page bytes it held."""
    try:
        directory = os.open(key, DIRECTORY_FLAGS, dir_fd=root)
    except OSError:
        return 0
    freed = 0
    try:
        if os.fstat(directory).st_uid != os.geteuid():
            return 0
        with os.scandir(directory) as entries:
            names = [entry.name for entry in entries]
        for name in names:
            if not name.startswith("."):
                freed += _size_of_page(directory, name)
            unlink_quietly(name, directory)
    finally:
        os.close(directory)
    try:
        os.rmdir(key, dir_fd=root)
    except OSError:  # a page another process wrote meanwhile: it stays until evicted
        pass
    return freed


def _digest(value: object) -> str:
    return hashlib.sha256(repr(value).encode("utf-8")).hexdigest()[:32]


def _read_usage(root: int) -> int:
    data = read_regular_file("usage", root, most=_USAGE_BYTES)
    try:
        if data is not None:
            return max(0, int(data.strip() or b"0"))
    except ValueError:
        pass
    return sum(size for *_, size in _pages(root))


def _write_usage(root: int, usage: int) -> None:
    temporary = write_new_file(root, str(usage).encode("ascii"), ".usage-")
    replace_with(root, temporary, "usage")


def _sweep(root: int, directories: list[int], own: str) -> tuple[int, int]:
    """Under the lock: remove the temporaries of crashed processes, every ``.usage-*`` and ``.version-*`` of the
    root (both are written under the lock) and the ``.partial-*`` older than :data:`STALE_TEMPORARY_SECONDS` in
    ``directories`` (page directory descriptors); how many were removed, and the bytes of the younger
    ``.partial-*`` but ``own`` (pages being written)."""
    user, oldest = os.geteuid(), time.time_ns() - STALE_TEMPORARY_SECONDS * 10**9
    removed = writing = 0
    root_temporaries = (_USAGE, _VERSION_TEMPORARY)
    for directory, prefix in [(root, root_temporaries)] + [(directory, _PARTIAL) for directory in directories]:
        try:
            with os.scandir(directory) as entries:
                found = [entry for entry in entries if entry.name.startswith(prefix) and entry.name != own]
        except OSError:
            continue
        for entry in found:
            try:
                status = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if status.st_uid != user or (prefix == _PARTIAL and status.st_mtime_ns > oldest):
                writing += status.st_size if stat.S_ISREG(status.st_mode) and status.st_uid == user else 0
                continue
            try:
                os.unlink(entry.name, dir_fd=directory)  # never follows: a link is removed, not its target
                removed += 1
            except OSError:
                pass
    return removed, writing


def _page_directories(root: int) -> list[str]:
    try:
        with os.scandir(root) as entries:
            return [entry.name for entry in entries if entry.is_dir(follow_symlinks=False)]
    except OSError:
        return []


def _pages(root: int) -> Iterator[tuple[str, str, int, int]]:
    """Every cached page under ``root``: (page directory, name, modification time, size). Only regular files of
    this user's in directories of this user's count; temporary files are not pages."""
    user = os.geteuid()
    for key in _page_directories(root):
        try:
            descriptor = os.open(key, DIRECTORY_FLAGS, dir_fd=root)
        except OSError:
            continue
        try:
            if os.fstat(descriptor).st_uid != user:
                continue
            with os.scandir(descriptor) as entries:
                found = [entry for entry in entries if not entry.name.startswith(".")]
            for entry in found:
                try:
                    status = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if stat.S_ISREG(status.st_mode) and status.st_uid == user:
                    yield key, entry.name, status.st_mtime_ns, status.st_size
        finally:
            os.close(descriptor)


def _size_of_page(directory: int, name: str) -> int:
    """The bytes ``name`` counts for in ``usage``: its size if it is a regular file of this user's, else 0."""
    try:
        status = os.stat(name, dir_fd=directory, follow_symlinks=False)
    except OSError:
        return 0
    return status.st_size if stat.S_ISREG(status.st_mode) and status.st_uid == os.geteuid() else 0
