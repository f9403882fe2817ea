"""What a store answered, judged before its body is trusted, and a body read with a bound.

Every fetch asks for a known number of bytes (a byte range, or a manifest no larger than its cap), so every
answer is read into a buffer of that size, in chunks, and refused at the first byte past it: an answer that runs
on (a server that ignores ``Range``, an endless chunked body, a ``Content-Length`` of gigabytes) costs the request's
size plus one chunk, never what the server sends. :class:`AnswerError` says what was wrong with an answer and
whether asking again may mend it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

__all__ = ["AnswerError", "NotThere", "CHUNK", "read_exactly"]

#: Bytes asked of a body stream at a time.
CHUNK = 256 * 1024


class AnswerError(Exception):
    """An answer that is not the one asked for. ``transient``: whether asking again may help (a short or overlong
    body, a 5xx status); ``status``: the HTTP status, where there was one."""

    def __init__(self, message: str, *, transient: bool, status: int | None = None) -> None:
        super().__init__(message)
        self.transient = transient
        self.status = status


class NotThere(AnswerError):
    """The store says there is no such file (HTTP 404 or 410): permanent, never retried."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message, transient=False, status=status)


async def read_exactly(read: Callable[[int], Awaitable[bytes]], wanted: int) -> bytes:
    """``wanted`` bytes from a body stream whose ``read(n)`` returns at most ``n`` bytes (``b""`` at its end).

    A body that ends early is a transient :class:`AnswerError` (a dropped connection), one with a byte more is an
    overlong answer (also transient: a proxy's hiccup, a poisoned connection), found by asking for one byte past
    the range, so at most ``wanted`` bytes plus one chunk are ever held.
    """
    buffer = bytearray(wanted)
    view = memoryview(buffer)
    got = 0
    while got < wanted:
        chunk = await read(min(CHUNK, wanted - got))
        if not chunk:
            raise AnswerError(f"the answer ended after {got} of {wanted} bytes", transient=True)
        if len(chunk) > wanted - got:  # a stream that returns more than asked: refused as any overlong answer
            raise AnswerError(f"the answer held more than the {wanted} bytes asked for", transient=True)
        view[got : got + len(chunk)] = chunk
        got += len(chunk)
    if await read(1):
        raise AnswerError(f"the answer held more than the {wanted} bytes asked for (it went on past them)",
                          transient=True)
    view.release()
    return bytes(buffer)
