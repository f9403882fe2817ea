"""Sizes and byte ranges over HTTP(S): beton's own requests, streamed and bounded, on fsspec's aiohttp session.

fsspec's HTTPFileSystem reads whole bodies (``cat_file`` returns whatever the server sent: a server that ignores
``Range`` sends the whole file, and a body can be endless), turns every failed HEAD into ``FileNotFoundError`` (a
503 looked like a missing file, so it was never retried) and follows every redirect. Here each request:

* uses the session fsspec builds from the user's ``storage_options`` (``client_kwargs``, ``headers``, auth: the
  same settings as any fsspec HTTP read), asks for ``Accept-Encoding: identity``, and follows redirects itself,
  within :attr:`RemoteOptions.redirects <beton.storage.remote.options.RemoteOptions.redirects>` and at most
  :data:`MAX_REDIRECTS` hops (``Authorization`` and ``Cookie`` headers are not sent to another origin);
* is judged on its status and headers before its body is read. A range request must be answered ``206`` with a
  ``Content-Range`` of exactly that range, a ``Content-Length`` (if any) of exactly its size and no
  ``Content-Encoding``; a ``200`` (the server ignores ranges) or any other answer is refused and its connection
  closed with its body unread;
* reads the body in chunks into a buffer of the range's size and stops at the first byte past it
  (:func:`~beton.storage.remote.answers.read_exactly`), so memory per request is the range's size (twice, for a
  moment, as the bytes are handed over) plus aiohttp's read buffer (2 × 64 KiB), whatever the server sends.
  aiohttp bounds the headers: lines of at most 8190 bytes, at most 128 of them.

A body not read to its end never goes back to the connection pool (its connection is closed), so no later request
reads the rest of it as its own answer. A retry (``fresh``) never takes a pooled connection: it goes through a
session of its own, made with the same settings and closed after it, because an idle connection may hold bytes a
server sent after its last answer (a poisoned keep-alive connection), which the pool cannot see. The caller
(:class:`~beton.storage.remote.fetch.RangeFetcher`) runs each call on fsspec's event loop with a timeout that
cancels it, and retries what :class:`AnswerError` calls transient.
"""

from __future__ import annotations

import contextlib
import re
import urllib.parse
from collections.abc import AsyncIterator
from typing import Any

from beton.storage.remote.answers import AnswerError, NotThere, read_exactly

__all__ = ["MAX_REDIRECTS", "info", "read_range", "origin", "redirect_allowed"]

#: Redirects followed for one request, at most.
MAX_REDIRECTS = 5
_REDIRECT_STATUSES = (301, 302, 303, 307, 308)
_GONE = (404, 410)
_CONTENT_RANGE = re.compile(r"bytes\s+(\d+)-(\d+)/(\d+|\*)$")
_UNSATISFIED = re.compile(r"bytes\s+\*/(\d+)$")
_PRIVATE_HEADERS = ("authorization", "cookie")


def origin(url: str) -> tuple[str, str, int | None]:
    """(scheme, host, port) of a URL, the port filled in for http (80) and https (443)."""
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    try:
        port = parts.port
    except ValueError:
        port = None
    if port is None:
        port = {"http": 80, "https": 443}.get(scheme)
    return scheme, (parts.hostname or "").lower(), port


def redirect_allowed(policy: str, opened: str, target: str) -> bool:
    """Whether ``policy`` ("same-origin", "any", "none") lets a request for ``opened`` follow a redirect to
    ``target``. Only http(s) targets are ever followed."""
    if origin(target)[0] not in ("http", "https"):
        return False
    if policy == "any":
        return True
    return policy == "same-origin" and origin(target) == origin(opened)


@contextlib.asynccontextmanager
async def _session(fs: Any, fresh: bool) -> AsyncIterator[Any]:
    """fsspec's shared session, or for ``fresh`` a new one with the same settings (closed on leaving)."""
    if not fresh:
        yield await fs.set_session()
        return
    session = await fs.get_client(loop=fs.loop, **fs.client_kwargs)
    try:
        yield session
    finally:
        await session.close()


async def _open(session: Any, fs: Any, method: str, url: str, headers: dict[str, str],
                policy: str) -> tuple[Any, str]:
    """The response to ``method url`` (its body unread) after the redirects ``policy`` allows, and the URL that
    answered."""
    keywords = dict(fs.kwargs)
    keywords.pop("allow_redirects", None)
    base = {**dict(keywords.pop("headers", None) or {}), **headers, "Accept-Encoding": "identity"}
    current = url
    for _ in range(MAX_REDIRECTS + 1):
        if origin(current) != origin(url) and _has_credentials(fs):
            raise AnswerError(
                f"{url} redirects to {current}, another origin, and credentials are configured for the file system "
                "(auth, cookies or an Authorization header): beton does not send them elsewhere; read "
                f"{current} directly", transient=False)
        sent = base if origin(current) == origin(url) else {
            name: value for name, value in base.items() if name.lower() not in _PRIVATE_HEADERS}
        response = await session.request(method, fs.encode_url(current), headers=sent, allow_redirects=False,
                                         **keywords)
        if response.status not in _REDIRECT_STATUSES:
            return response, current
        location = response.headers.get("Location")
        response.close()
        if not location:
            raise AnswerError(f"{current} answered {response.status} (a redirect) without a Location",
                              transient=False, status=response.status)
        target = urllib.parse.urljoin(current, location)
        if not redirect_allowed(policy, url, target):
            raise AnswerError(
                f"{current} redirects to {target}, which RemoteOptions(redirects={policy!r}) does not follow "
                f"({_POLICIES[policy]}); pass RemoteOptions(redirects='any') to follow it", transient=False,
                status=response.status)
        current = target
    raise AnswerError(f"more than {MAX_REDIRECTS} redirects from {url} (the last to {current})", transient=False)


def _has_credentials(fs: Any) -> bool:
    """Whether fsspec's HTTP file system would send credentials with every request: ``auth``/``cookies`` among
    its request arguments, or in its session's (``client_kwargs``), or a private header in either."""
    requests, session = dict(fs.kwargs), dict(fs.client_kwargs)
    headers = {**dict(session.get("headers") or {}), **dict(requests.get("headers") or {})}
    return any(value for settings in (requests, session) for name, value in settings.items()
               if name in ("auth", "cookies", "cookie_jar")) or any(
        name.lower() in _PRIVATE_HEADERS for name in headers)


_POLICIES = {"same-origin": "only redirects to the same scheme, host and port", "none": "no redirects",
             "any": "redirects to any http(s) URL"}


def _refuse_status(response: Any, url: str) -> AnswerError:
    status = response.status
    if status in _GONE:
        return NotThere(f"{url} answered {status} {response.reason or ''}".rstrip(), status=status)
    transient = status >= 500 or status in (408, 429)
    return AnswerError(f"{url} answered {status} {response.reason or ''}".rstrip(), transient=transient,
                       status=status)


async def read_range(fs: Any, url: str, start: int, end: int, policy: str, fresh: bool = False) -> bytes:
    """Bytes [start, end) of ``url`` (``end > start``), exactly, or an :class:`AnswerError`; ``fresh``: on a new
    connection."""
    async with _session(fs, fresh) as session:
        return await _read_range(session, fs, url, start, end, policy)


async def _read_range(session: Any, fs: Any, url: str, start: int, end: int, policy: str) -> bytes:
    wanted = end - start
    response, where = await _open(session, fs, "GET", url, {"Range": f"bytes={start}-{end - 1}"}, policy)
    try:
        if response.status == 200:
            length = response.headers.get("Content-Length")
            raise AnswerError(
                f"{where} answered a request for {wanted} bytes (Range: bytes={start}-{end - 1}) with the whole "
                f"file ({length or 'unknown'} bytes, status 200): the server does not honour Range requests; "
                "beton reads remote files by range", transient=False, status=200)
        if response.status != 206:
            raise _refuse_status(response, where)
        _check_range(response.headers, start, end, where)
        data = await read_exactly(response.content.read, wanted)
    except BaseException:
        response.close()  # a body not read to its end: the connection is not used again
        raise
    response.release()
    return data


def _check_range(headers: Any, start: int, end: int, url: str) -> None:
    wanted = end - start
    encoding = headers.get("Content-Encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):
        raise AnswerError(f"{url} answered a range with Content-Encoding {encoding!r} (asked for identity)",
                          transient=False)
    content_range = headers.get("Content-Range", "")
    match = _CONTENT_RANGE.match(content_range.strip())
    if match is None or (int(match[1]), int(match[2]) + 1) != (start, end):
        raise AnswerError(f"{url} answered the range bytes={start}-{end - 1} with Content-Range "
                          f"{content_range[:100]!r}", transient=True)
    length = headers.get("Content-Length")
    if length is not None and (not length.strip().isdigit() or int(length) != wanted):
        raise AnswerError(f"{url} announced {length[:30]} bytes (Content-Length) for a range of {wanted}",
                          transient=True)


async def info(fs: Any, url: str, policy: str, fresh: bool = False) -> dict[str, Any]:
    """``{"size": ..., "ETag": ..., "Last-Modified": ...}`` of ``url`` from a HEAD request (a GET of its first byte
    when HEAD is refused or gives no length), or an :class:`AnswerError` (:class:`NotThere` for 404/410);
    ``fresh``: on a new connection."""
    async with _session(fs, fresh) as session:
        return await _info(session, fs, url, policy)


async def _info(session: Any, fs: Any, url: str, policy: str) -> dict[str, Any]:
    response, where = await _open(session, fs, "HEAD", url, {}, policy)
    try:
        status, headers = response.status, response.headers
        if status in _GONE or (status >= 400 and status not in (403, 405, 501)):
            raise _refuse_status(response, where)
        result = _markers(headers)
        length = headers.get("Content-Length", "")
        encoding = headers.get("Content-Encoding", "identity").strip().lower()
        if status == 200 and length.strip().isdigit() and encoding in ("", "identity"):
            return {"size": int(length), **result}
    finally:
        response.close()
    return await _info_by_range(session, fs, url, policy)


async def _info_by_range(session: Any, fs: Any, url: str, policy: str) -> dict[str, Any]:
    """Size and markers from ``GET`` of the first byte (its ``Content-Range`` holds the size); for servers that
    refuse HEAD (a URL signed for GET only) or answer it without a length."""
    response, where = await _open(session, fs, "GET", url, {"Range": "bytes=0-0"}, policy)
    try:
        headers = response.headers
        if response.status == 416:  # an empty file has no byte 0
            match = _UNSATISFIED.match(headers.get("Content-Range", "").strip())
            if match is not None:
                return {"size": int(match[1]), **_markers(headers)}
        if response.status != 206:
            if response.status == 200:
                raise AnswerError(f"{where} answered a request for its first byte with the whole file (status "
                                  "200): the server does not honour Range requests; beton reads remote files by "
                                  "range", transient=False, status=200)
            raise _refuse_status(response, where)
        match = _CONTENT_RANGE.match(headers.get("Content-Range", "").strip())
        if match is None or match[3] == "*":
            raise AnswerError(f"{where} gives no size (no Content-Length on HEAD, no total in Content-Range); "
                              "beton reads remote files by range and needs their size", transient=False)
        _check_range(headers, 0, 1, where)
        await read_exactly(response.content.read, 1)
    except BaseException:
        response.close()
        raise
    response.release()
    return {"size": int(match[3]), **_markers(headers)}


def _markers(headers: Any) -> dict[str, str]:
    return {name: headers[name] for name in ("ETag", "Last-Modified") if headers.get(name)}
