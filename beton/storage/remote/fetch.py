"""Byte ranges of one remote file through fsspec, with a timeout per request and retries with backoff.

fsspec gives one interface to HTTP(S), S3, GCS, Azure and the rest; this module adds what training needs on
top: every request bounded in time, transient failures (timeouts, dropped connections, 5xx answers, 408/429,
short bodies) retried with exponential backoff and jitter, and after the retry budget a
:class:`~beton.errors.StorageError` naming the URL, what was read and the last error. Failures that retrying
cannot mend (a missing file, access denied, any other 4xx, a server that ignores ranges) fail at once.

Asynchronous file systems (HTTP, S3, GCS: fsspec's ``async_impl``) run each request on fsspec's event loop with
a timeout that cancels it; synchronous ones are called directly and rely on their own timeouts. Several threads
may call :meth:`RangeFetcher.fetch` at once: that is how several requests are in flight.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import Any

from beton.errors import StorageError, locate
from beton.storage.remote.options import RemoteOptions

__all__ = ["RangeFetcher", "import_fsspec", "is_transient"]

# Identity of a stored object, by the names fsspec's implementations give it: a changed object changes one.
_IDENTITY_KEYS = ("ETag", "etag", "VersionId", "version_id", "generation", "Last-Modified", "LastModified",
                  "mtime", "md5Hash", "crc32c")
_PERMANENT = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError, TypeError, AttributeError,
              NotImplementedError, ImportError, KeyError)


def import_fsspec() -> Any:
    try:
        import fsspec
    except ImportError:
        raise ImportError("reading URLs needs fsspec and the package for the URL's scheme: "
                          "pip install 'beton[remote]' (fsspec, aiohttp for HTTP(S), s3fs for s3://)") from None
    return fsspec


def is_transient(error: BaseException) -> bool:
    """Whether a failed request may succeed if tried again."""
    status = getattr(error, "status", None) or getattr(error, "status_code", None)
    if isinstance(status, int) and 400 <= status < 500:
        return status in (408, 429)  # request timeout, too many requests
    if isinstance(error, _PERMANENT):
        return False
    if isinstance(error, ValueError) and not isinstance(error, OSError):
        return type(error).__module__.split(".")[0] == "aiohttp" and not type(error).__name__ == "InvalidURL"
    return isinstance(error, Exception)


class _WrongLength(Exception):
    """A response of another length than the range asked for."""

    def __init__(self, got: int, wanted: int) -> None:
        super().__init__(f"the answer held {got} bytes, the range {wanted}")
        self.got, self.wanted = got, wanted


class RangeFetcher:
    """One remote file: its size and identity when opened, and byte ranges of it.

    ``sleep`` is the pause between attempts (a parameter so that tests can count the pauses).
    """

    def __init__(self, url: str, options: RemoteOptions, sleep: Callable[[float], None] = time.sleep) -> None:
        fsspec = import_fsspec()
        self.url = url
        self.options = options
        self._sleep = sleep
        self._random = random.Random()  # jitter only; never affects which bytes are read
        self._random_lock = threading.Lock()
        self.fs, self._path = fsspec.core.url_to_fs(url, **dict(options.storage_options))
        info = self.stat()
        self.size = self._size_of(info)
        self.identity = identity_of(info)

    # ---- metadata -------------------------------------------------------------------------------------------

    def stat(self) -> dict[str, Any]:
        """The object's current information (size, ETag...), asked anew (fsspec caches listings)."""
        invalidate = getattr(self.fs, "invalidate_cache", None)
        if invalidate is not None:
            invalidate(self._path)
        return self._with_retries(lambda: self._call("info", self._path), "its size and version")

    def _size_of(self, info: dict[str, Any]) -> int:
        size = info.get("size")
        if not isinstance(size, int) or size < 0:
            raise StorageError(f"the server reports no usable size for {self.url!r} (got {size!r}); beton reads "
                               "remote files by byte range and needs their size")
        return size

    # ---- ranges ---------------------------------------------------------------------------------------------

    def fetch(self, start: int, end: int, what: str) -> bytes:
        """Bytes [start, end) of the file, exactly; ``what`` names them in errors ("page 7", "the header")."""
        if not 0 <= start <= end <= self.size:
            raise ValueError(f"range {start}..{end} is outside the {self.size}-byte file {self.url!r}")
        if start == end:
            return b""

        def attempt() -> bytes:
            data = self._call("cat_file", self._path, start=start, end=end)
            if len(data) != end - start:
                raise _WrongLength(len(data), end - start)
            return bytes(data)

        return self._with_retries(attempt, f"{what} (bytes {start}..{end})")

    def _with_retries(self, attempt: Callable[[], Any], what: str) -> Any:
        tries = self.options.retries + 1
        for number in range(tries):
            try:
                return attempt()
            except _WrongLength as error:
                if error.got > error.wanted:  # whole file instead of the range: retrying changes nothing
                    raise self.error(f"reading {what}: the server answered a range request with {error.got} bytes "
                                     f"instead of {error.wanted} (it does not honour Range requests?)") from None
                last: BaseException = error
            except FileNotFoundError:
                raise FileNotFoundError(f"{self.url}: no such remote file (reading {what})") from None
            except Exception as error:  # noqa: BLE001 - classified: only transient ones are tried again
                if not is_transient(error):
                    raise self.error(f"reading {what} failed: {_describe(error)}") from error
                last = error
            if number + 1 < tries:
                self.pause(number)
        raise self.error(f"reading {what} failed {tries} times; last error: {_describe(last)}") from last

    def pause(self, number: int) -> None:
        """Wait before attempt ``number + 1``: exponential backoff with jitter (which spreads the retries of many
        clients hit by one outage), at most ``max_backoff``."""
        with self._random_lock:
            jitter = 0.5 + self._random.random()
        self._sleep(min(self.options.backoff * 2**number * jitter, self.options.max_backoff))

    def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        fs = self.fs
        if getattr(fs, "async_impl", False) and getattr(fs, "loop", None) is not None:
            from fsspec.asyn import sync

            # On fsspec's loop with a timeout that cancels the request (a stalled body holds no thread).
            return sync(fs.loop, getattr(fs, "_" + name), *args, timeout=self.options.timeout, **kwargs)
        return getattr(fs, name)(*args, **kwargs)

    def error(self, message: str, page: int | None = None) -> StorageError:
        return locate(StorageError(message), path=self.url, page=page)


def identity_of(info: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    """The size and the version markers an object's information holds (ETag, version id, modification time)."""
    return (("size", str(info.get("size"))),) + tuple(
        (key, str(info[key])) for key in _IDENTITY_KEYS if info.get(key) is not None)


def _describe(error: BaseException) -> str:
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__
