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
and other 4xx, missing or unusable credentials, a server that ignores ranges, a redirect outside the policy.

One retry budget (``RemoteOptions.retries``): the clients under fsspec retry inside each of beton's attempts
unless told not to, which multiplies the budget (botocore's 5 attempts, each repeated by s3fs, made a dead S3
endpoint take 40-54 s to fail with the default ``retries=5``). :func:`filesystem` turns them off where it can:
for S3, botocore's retries (``config_kwargs={"retries": {"total_max_attempts": 1}}``, unless the user's
``storage_options`` set ``config_kwargs["retries"]`` themselves) and s3fs's own loop (``retries = 1`` on the
file system beton builds, which fsspec caches apart from the user's own since its options differ). HTTP(S) is
read by beton's own requests, which never retry. Other stores' clients (gcsfs, adlfs) keep their own retries.

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

__all__ = ["RangeFetcher", "filesystem", "import_fsspec", "is_transient", "with_retries", "backoff", "read_s3_range",
           "identity_of", "describe_error"]

# Identity of a stored object without an ETag, by the names fsspec's implementations give it: a changed object
# changes one.
_IDENTITY_KEYS = ("ETag", "etag", "VersionId", "version_id", "generation", "Last-Modified", "LastModified",
                  "mtime", "md5Hash", "crc32c")
_PERMANENT = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError, TypeError, AttributeError,
              NotImplementedError, ImportError, KeyError)
# botocore's errors that retrying cannot mend: no credentials, or unusable ones (a profile, a token, a region).
_PERMANENT_BOTOCORE = ("NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError",
                       "NoAuthTokenError", "UnauthorizedSSOTokenError", "SSOTokenLoadError", "TokenRetrievalError",
                       "ProfileNotFound", "InvalidConfigError", "NoRegionError", "ParamValidationError",
                       "UnknownCredentialError", "InvalidRegionError")
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


def filesystem(url: str, options: RemoteOptions) -> tuple[Any, str]:
    """The fsspec file system and path of ``url`` with the user's ``storage_options``, the retries of the client
    underneath turned off where beton knows how (module docstring), so that ``options.retries`` is the budget."""
    storage_options = dict(options.storage_options)
    s3 = url.lower().startswith(("s3://", "s3a://"))
    if s3:
        config = dict(storage_options.get("config_kwargs") or {})
        config.setdefault("retries", {"total_max_attempts": 1})
        storage_options["config_kwargs"] = config
    fs, path = import_fsspec().core.url_to_fs(url, **storage_options)
    if s3 and isinstance(getattr(fs, "retries", None), int):
        fs.retries = 1  # s3fs's own loop around each call (timeouts, dropped connections): one try
    return fs, path


def with_retries(attempt: Callable[[bool], Any], options: RemoteOptions, url: str, what: str,
                 pause: Callable[[int], None], missing: str = "no such remote file") -> Any:
    """``attempt(fresh)`` until it succeeds, within the retry budget; ``fresh`` (on every retry): asks for a new
    connection where the store lets beton choose (HTTP). ``pause(n)`` waits before attempt n + 1. A missing file is
    a :class:`~beton.errors.ShardNotFoundError` saying ``missing``, anything else that fails a
    :class:`~beton.errors.StorageError`, both naming ``url`` and ``what`` was read or written."""
    tries = options.retries + 1
    for number in range(tries):
        try:
            return attempt(number > 0)
        except (FileNotFoundError, NotThere) as error:
            detail = f": {error}" if str(error) else ""
            raise locate(ShardNotFoundError(f"{missing} ({what}{detail})"), path=url) from None
        except Exception as error:  # noqa: BLE001 - classified: only transient ones are tried again
            if not is_transient(error):
                raise locate(StorageError(f"{what} failed: {describe_error(error)}"), path=url) from error
            last: BaseException = error
        if number + 1 < tries:
            pause(number)
    times = "once" if tries == 1 else f"{tries} times"
    raise locate(StorageError(f"{what} failed {times}; last error: {describe_error(last)}"), path=url) from last


def is_transient(error: BaseException) -> bool:
    """Whether a failed request may succeed if tried again."""
    if isinstance(error, AnswerError):
        return error.transient
    if type(error).__module__.split(".")[0] == "botocore" and type(error).__name__ in _PERMANENT_BOTOCORE:
        return False
    if isinstance(error.__cause__, Exception) and _client_error_status(error.__cause__) is not None:
        error = error.__cause__  # s3fs's translation of an answer it did not map to a builtin: judge the answer
    if type(error).__module__.split(".")[0] == "aiohttp":
        # beton's HTTP requests never call raise_for_status, so an aiohttp error is a connection's failure or a
        # malformed answer (oversized headers, a garbled status line: a poisoned keep-alive connection), tried
        # again on a new connection
        return type(error).__name__ not in _PERMANENT_AIOHTTP
    status = getattr(error, "status", None) or getattr(error, "status_code", None) or _client_error_status(error)
    if isinstance(status, int) and 400 <= status < 500:
        return status in (408, 429)  # request timeout, too many requests
    if isinstance(error, _PERMANENT):
        return False
    if isinstance(error, ValueError) and not isinstance(error, OSError):
        return False
    return isinstance(error, Exception)


def backoff(options: RemoteOptions, number: int, jitter: float) -> float:
    """Seconds to wait before attempt ``number + 1``: ``options.backoff`` doubled per attempt, times 0.5 to 1.5
    (``jitter`` in [0, 1) says where), at most ``max_backoff``."""
    return min(options.backoff * 2**number * (0.5 + jitter), options.max_backoff)


def _client_error_status(error: BaseException) -> int | None:
    """The HTTP status of a botocore ``ClientError`` (an answer from the store), else None."""
    response = getattr(error, "response", None)
    if not isinstance(response, dict):
        return None
    status = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
    return status if isinstance(status, int) else None


class RangeFetcher:
    """One remote file: its size and identity when opened, and byte ranges of it.

    ``sleep`` is the pause between attempts (a parameter so that tests can count the pauses).
    """

    def __init__(self, url: str, options: RemoteOptions, sleep: Callable[[float], None] = time.sleep) -> None:
        self.url = url
        self.options = options
        self._sleep = sleep
        self._random = random.Random()  # jitter only; never affects which bytes are read
        self._random_lock = threading.Lock()
        self.fs, self._path = filesystem(url, options)
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
                                      "reading its size and version")
        invalidate = getattr(self.fs, "invalidate_cache", None)
        if invalidate is not None:
            invalidate(self._path)
        return self._with_retries(lambda fresh: self._call("info", self._path), "reading its size and version")

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
        return self._with_retries(attempt, f"reading {what} (bytes {start}..{end})")

    def _with_retries(self, attempt: Callable[[bool], Any], what: str) -> Any:
        return with_retries(attempt, self.options, self.url, what, self.pause)

    def pause(self, number: int) -> None:
        """Wait before attempt ``number + 1``: exponential backoff with jitter (which spreads the retries of many
        clients hit by one outage), at most ``max_backoff``."""
        with self._random_lock:
            jitter = self._random.random()
        self._sleep(backoff(self.options, number, jitter))

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
    """The size and version markers of an object's information, which change when its bytes change.

    Where the store gives a strong ETag, the size and the ETag: an ETag names the bytes (S3's is a digest of them),
    so uploading the same bytes again (a new modification time and version id, the same ETag) keeps the object's
    identity: a running Loader goes on, the page cache stays valid. Otherwise (no ETag, or a weak ``W/`` one, which
    promises equivalence, not the same bytes) the size and every version marker it holds (version id,
    modification time...)."""
    size = ("size", str(info.get("size")))
    etag = next((info[key] for key in ("ETag", "etag") if info.get(key) is not None), None)
    if etag is not None and not str(etag).startswith("W/"):
        return size, ("ETag", str(etag))
    return (size,) + tuple((key, str(info[key])) for key in _IDENTITY_KEYS if info.get(key) is not None)


def describe_error(error: BaseException) -> str:
    """An exception in one line: its type and message."""
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__
