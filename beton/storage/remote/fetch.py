"""Byte ranges of one remote file, its size and identity, with a timeout per request and retries with backoff.

fsspec gives one interface to HTTP(S), S3, GCS, Azure and the rest; this module adds what training needs on
top: every request bounded in time and in memory, transient failures retried with exponential backoff and
jitter, and after the retry budget a :class:`~beton.errors.StorageError` naming the URL, what was read and the
last error. Every request is retried the same way: page reads, the header and tables, manifests, and the
size/identity request (at opening and at each epoch's start).

How each store is read, every answer held to the size asked for (:mod:`~beton.storage.remote.answers`):

* HTTP(S): beton's own requests on fsspec's session (:mod:`~beton.storage.remote.http`): the status and headers
  are judged before the body is read, the body is streamed and cut at the range's end, redirects follow
  ``RemoteOptions.redirects``;
* S3 (s3fs): ``GetObject`` with a ``Range``, its body streamed in chunks and refused past the range (s3fs's own
  ``cat_file`` reads the whole body);
* other stores (``file://``, ``memory://``, gcs, azure, chained URLs): fsspec's ``cat_file`` of the range, whose
  length is checked afterwards. These stores honour ranges; beton does not bound what a misbehaving one sends.

Transient (retried): timeouts, refused or dropped connections, 5xx, 408 and 429 answers, short or overlong bodies,
a wrong ``Content-Range``, malformed answers (oversized headers, a garbled status line). Permanent (raised at
once): a missing file (404, 410, ``FileNotFoundError``: :class:`~beton.errors.ShardNotFoundError`), access denied
and other 4xx, a server that ignores ranges, a redirect outside the policy.

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

from beton.errors import ShardNotFoundError, StorageError, locate
from beton.storage.remote import http
from beton.storage.remote.answers import AnswerError, NotThere, read_exactly
from beton.storage.remote.options import RemoteOptions

__all__ = ["RangeFetcher", "import_fsspec", "is_transient", "read_s3_range"]

# Identity of a stored object, by the names fsspec's implementations give it: a changed object changes one.
_IDENTITY_KEYS = ("ETag", "etag", "VersionId", "version_id", "generation", "Last-Modified", "LastModified",
                  "mtime", "md5Hash", "crc32c")
_PERMANENT = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError, TypeError, AttributeError,
              NotImplementedError, ImportError, KeyError)
# aiohttp's errors that retrying cannot mend: a malformed URL, a certificate that does not verify.
_PERMANENT_AIOHTTP = ("InvalidURL", "InvalidUrlClientError", "NonHttpUrlClientError", "ClientConnectorCertificateError",
                      "ServerFingerprintMismatch")


def import_fsspec() -> Any:
    try:
        import fsspec
    except ImportError:
        raise ImportError("reading URLs needs fsspec and the package for the URL's scheme: "
                          "pip install 'beton[remote]' (fsspec, aiohttp for HTTP(S), s3fs for s3://)") from None
    return fsspec


def is_transient(error: BaseException) -> bool:
    """Whether a failed request may succeed if tried again."""
    if isinstance(error, AnswerError):
        return error.transient
    if type(error).__module__.split(".")[0] == "aiohttp":
        # beton's HTTP requests never call raise_for_status, so an aiohttp error is a connection's failure or a
        # malformed answer (oversized headers, a garbled status line: a poisoned keep-alive connection), tried
        # again on a new connection
        return type(error).__name__ not in _PERMANENT_AIOHTTP
    status = getattr(error, "status", None) or getattr(error, "status_code", None)
    if isinstance(status, int) and 400 <= status < 500:
        return status in (408, 429)  # request timeout, too many requests
    if isinstance(error, _PERMANENT):
        return False
    if isinstance(error, ValueError) and not isinstance(error, OSError):
        return False
    return isinstance(error, Exception)


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
        self.store = _store_of(self.fs)  # "http", "s3" or "other": how ranges are read (module docstring)
        info = self.stat()
        self.size = self._size_of(info)
        self.identity = identity_of(info)

    # ---- metadata -------------------------------------------------------------------------------------------

    def stat(self) -> dict[str, Any]:
        """The object's current information (size, ETag...), asked anew (fsspec caches listings)."""
        if self.store == "http":
            return self._with_retries(lambda fresh: self._on_loop(http.info, self.fs, self._path,
                                                                  self.options.redirects, fresh),
                                      "its size and version")
        invalidate = getattr(self.fs, "invalidate_cache", None)
        if invalidate is not None:
            invalidate(self._path)
        return self._with_retries(lambda fresh: self._call("info", self._path), "its size and version")

    def _size_of(self, info: dict[str, Any]) -> int:
        size = info.get("size")
        if not isinstance(size, int) or size < 0:
            raise StorageError(f"the server reports no usable size for {self.url!r} (got {size!r}); beton reads "
                               "remote files by byte range and needs their size")
        return size

    # ---- ranges ---------------------------------------------------------------------------------------------

    def fetch(self, start: int, end: int, what: str) -> bytes:
        """Bytes [start, end) of the file, exactly; ``what`` names them in errors ("page 7", "the header"). Memory
        is bounded by the range's size whatever the store sends (see the module docstring for other stores)."""
        if not 0 <= start <= end <= self.size:
            raise ValueError(f"range {start}..{end} is outside the {self.size}-byte file {self.url!r}")
        if start == end:
            return b""
        if self.store == "http":
            attempt = lambda fresh: self._on_loop(http.read_range, self.fs, self._path, start, end,  # noqa: E731
                                                  self.options.redirects, fresh)
        elif self.store == "s3":
            attempt = lambda fresh: self._on_loop(read_s3_range, self.fs, self._path, start, end)  # noqa: E731
        else:
            def attempt(fresh: bool) -> bytes:
                data = self._call("cat_file", self._path, start=start, end=end)
                if len(data) != end - start:
                    raise AnswerError(f"the answer held {len(data)} bytes, the range {end - start}", transient=True)
                return bytes(data)
        return self._with_retries(attempt, f"{what} (bytes {start}..{end})")

    def _with_retries(self, attempt: Callable[[bool], Any], what: str) -> Any:
        """``attempt(fresh)`` until it succeeds, within the retry budget; ``fresh`` (on every retry): asks for a new
        connection where the store lets beton choose (HTTP)."""
        tries = self.options.retries + 1
        for number in range(tries):
            try:
                return attempt(number > 0)
            except (FileNotFoundError, NotThere) as error:
                detail = f": {error}" if isinstance(error, NotThere) else ""
                raise locate(ShardNotFoundError(f"no such remote file (reading {what}{detail})"),
                             path=self.url) from None
            except Exception as error:  # noqa: BLE001 - classified: only transient ones are tried again
                if not is_transient(error):
                    raise self.error(f"reading {what} failed: {_describe(error)}") from error
                last: BaseException = error
            if number + 1 < tries:
                self.pause(number)
        raise self.error(f"reading {what} failed {tries} times; last error: {_describe(last)}") from last

    def pause(self, number: int) -> None:
        """Wait before attempt ``number + 1``: exponential backoff with jitter (which spreads the retries of many
        clients hit by one outage), at most ``max_backoff``."""
        with self._random_lock:
            jitter = 0.5 + self._random.random()
        self._sleep(min(self.options.backoff * 2**number * jitter, self.options.max_backoff))

    def _on_loop(self, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``await function(*args, **kwargs)`` on fsspec's event loop, cancelled after the timeout (a stalled body
        holds no thread)."""
        from fsspec.asyn import sync

        return sync(self.fs.loop, function, *args, timeout=self.options.timeout, **kwargs)

    def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        fs = self.fs
        if getattr(fs, "async_impl", False) and getattr(fs, "loop", None) is not None:
            return self._on_loop(getattr(fs, "_" + name), *args, **kwargs)
        return getattr(fs, name)(*args, **kwargs)

    def error(self, message: str, page: int | None = None) -> StorageError:
        return locate(StorageError(message), path=self.url, page=page)


def _store_of(fs: Any) -> str:
    """"http", "s3" (s3fs, read by streamed GetObject) or "other" (read through fsspec's cat_file)."""
    protocols = fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)
    usable_loop = getattr(fs, "async_impl", False) and getattr(fs, "loop", None) is not None
    if not usable_loop:
        return "other"
    if {"http", "https"} & set(protocols) and all(hasattr(fs, name) for name in ("set_session", "encode_url",
                                                                                   "kwargs")):
        return "http"
    if "s3" in protocols and all(hasattr(fs, name) for name in ("_call_s3", "split_path")):
        return "s3"
    return "other"


async def read_s3_range(fs: Any, path: str, start: int, end: int) -> bytes:
    """Bytes [start, end) of an S3 object by GetObject with a Range, the body read in chunks and cut at its end."""
    bucket, key, version = fs.split_path(path)
    extra = {"VersionId": version} if version else {}
    response = await fs._call_s3("get_object", Bucket=bucket, Key=key, Range=f"bytes={start}-{end - 1}", **extra)
    body = response["Body"]
    try:
        length = response.get("ContentLength")
        if isinstance(length, int) and length != end - start:
            raise AnswerError(f"the store announced {length} bytes for a range of {end - start}",
                              transient=True)
        return await read_exactly(body.read, end - start)
    finally:
        body.close()


def identity_of(info: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    """The size and the version markers an object's information holds (ETag, version id, modification time)."""
    return (("size", str(info.get("size"))),) + tuple(
        (key, str(info[key])) for key in _IDENTITY_KEYS if info.get(key) is not None)


def _describe(error: BaseException) -> str:
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__
