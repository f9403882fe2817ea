"""A loopback HTTP server that serves files by range, and misbehaves on request: the attacks remote reads must
survive with bounded memory.

For ``tests/storage/test_remote_bounds.py`` and ``benchmarks/hostile_servers.py``. It binds to 127.0.0.1 only and
serves the files of one directory (``GET``/``HEAD /name``, ranges honoured, ``ETag`` from each file's status).
:class:`Attack` entries (a list, consumed in order) replace the next matching answers:

``ignore-range``     ``200`` and the whole file, read from disk as it is sent
``huge-length``      ``206`` with the right ``Content-Range`` and a ``Content-Length`` of 3 GiB
``endless-chunked``  ``206`` with the right ``Content-Range`` and a chunked body that never ends
``long-header``      a header line that never ends
``many-headers``     header lines that never end
``503`` / ``404``    that status
``redirect``         ``302`` to ``location`` (``{name}`` is replaced by the file's name)
``junk-after``       the right answer, then (20 ms later, as the connection idles) bytes that are no HTTP answer

Endless bodies and headers are generated lazily from one 64 KiB block, never built in memory, and cut after
``cap`` bytes (64 MiB by default): a client that read them whole would hold that much (which the tests measure),
and no test can send gigabytes. ``log`` records every request as ``(method, name, what was answered)``;
``bytes_sent`` counts the bytes of every answer.

``python tests/hostile_server.py DIRECTORY`` runs one in its own process and prints its port.
"""

from __future__ import annotations

import argparse
import dataclasses
import http.server
import os
import re
import threading
import time

from range_server import LoopbackServer, QuietHandler

__all__ = ["Attack", "HostileServer", "ATTACKS"]

ATTACKS = ("ignore-range", "huge-length", "endless-chunked", "long-header", "many-headers", "503", "404", "redirect",
           "junk-after")
_RANGE = re.compile(r"bytes=(\d+)-(\d*)$")
_BLOCK = 64 * 1024
_ZEROS = b"\0" * _BLOCK
_HUGE = 3 * 2**30


@dataclasses.dataclass
class Attack:
    """``kind`` for the next ``times`` requests of ``method`` (any when None) for ``name`` (any when None) whose
    range starts in [``from_byte``, ``to_byte``) (a request without a range starts at 0), after ``skip`` such
    requests answered rightly."""

    kind: str
    times: int = 1
    method: str | None = None
    name: str | None = None
    location: str = ""
    from_byte: int = 0
    to_byte: int | None = None
    skip: int = 0

    def __post_init__(self) -> None:
        if self.kind not in ATTACKS:
            raise ValueError(f"unknown attack {self.kind!r}")


class HostileServer(LoopbackServer):
    """Serves ``directory`` on 127.0.0.1; ``url(name)`` is a file's URL. Use as a context manager."""

    def __init__(self, directory: str | os.PathLike[str], cap: int = 64 * 2**20) -> None:
        self.directory = os.fspath(directory)
        self.cap = cap
        self.attacks: list[Attack] = []
        self.log: list[tuple[str, str, str]] = []
        self.bytes_sent = 0
        self._lock = threading.Lock()
        server = self

        class Handler(QuietHandler):
            def do_HEAD(self) -> None:
                server._answer(self, "HEAD")

            def do_GET(self) -> None:
                server._answer(self, "GET")

        super().__init__(Handler, "hostile-server")

    def requests(self, method: str | None = None) -> int:
        with self._lock:
            return sum(1 for logged in self.log if method in (None, logged[0]))

    # ---- answering ------------------------------------------------------------------------------------------

    def _take(self, method: str, name: str, start: int) -> Attack | None:
        with self._lock:
            for attack in self.attacks:
                if attack.times > 0 and attack.method in (None, method) and attack.name in (None, name) and \
                        attack.from_byte <= start < (attack.to_byte if attack.to_byte is not None else start + 1):
                    if attack.skip:
                        attack.skip -= 1
                        return None
                    attack.times -= 1
                    return attack
        return None

    def _answer(self, handler: http.server.BaseHTTPRequestHandler, method: str) -> None:
        name = handler.path.lstrip("/")
        match = _RANGE.match(handler.headers.get("Range", "") or "")
        attack = self._take(method, name, int(match[1]) if match else 0)
        with self._lock:
            self.log.append((method, name, attack.kind if attack is not None else "served"))
        write = _Writer(handler, self)
        try:
            self._respond(handler, method, name, attack, write)
        except (BrokenPipeError, ConnectionResetError, _Capped):
            handler.close_connection = True

    def _respond(self, handler, method: str, name: str, attack: Attack | None, write: _Writer) -> None:
        kind = attack.kind if attack is not None else None
        if kind in ("503", "404"):
            return write.status(int(kind), [("Content-Length", "0")])
        if kind == "redirect":
            return write.status(302, [("Location", attack.location.format(name=name)), ("Content-Length", "0")])
        if kind in ("long-header", "many-headers"):
            write.raw(b"HTTP/1.1 200 OK\r\n")
            if kind == "long-header":
                write.raw(b"X-Filler: ")
                write.endless(b"a" * _BLOCK)
            write.endless(b"X-Filler: a\r\n" * (_BLOCK // 13))
        path = os.path.join(self.directory, name)
        if "/" in name or name.startswith(".") or not os.path.isfile(path):
            return write.status(404, [("Content-Length", "0")])
        status = os.stat(path)
        size = status.st_size
        start, end = 0, size
        match = _RANGE.match(handler.headers.get("Range", "") or "")
        if match and kind != "ignore-range":
            start = int(match[1])
            end = min(size, int(match[2]) + 1) if match[2] else size
            if start >= size or end <= start:
                return write.status(416, [("Content-Range", f"bytes */{size}"), ("Content-Length", "0")])
        headers = [("ETag", f'"{status.st_ino:x}-{status.st_mtime_ns:x}-{size:x}"'), ("Accept-Ranges", "bytes")]
        if match and kind != "ignore-range":
            headers.append(("Content-Range", f"bytes {start}-{end - 1}/{size}"))
        if kind == "endless-chunked":
            write.status(206, headers + [("Transfer-Encoding", "chunked")])
            chunk = b"%x\r\n" % _BLOCK + _ZEROS + b"\r\n"
            write.endless(chunk)
        length = _HUGE if kind == "huge-length" else end - start
        write.status(206 if match and kind != "ignore-range" else 200, headers + [("Content-Length", str(length))])
        if method == "HEAD":
            return None
        if kind == "huge-length":
            write.endless(_ZEROS)
        with open(path, "rb") as file:
            file.seek(start)
            left = end - start
            while left:
                block = file.read(min(_BLOCK, left))
                if not block:
                    break
                write.raw(block)
                left -= len(block)
        if kind == "junk-after":  # once the answer has arrived: the connection idles with the junk in it
            handler.wfile.flush()
            time.sleep(0.02)
            write.raw(b"this is no HTTP answer\r\n\r\n")
        return None


class _Capped(Exception):
    """An endless answer reached the server's cap."""


class _Writer:
    def __init__(self, handler: http.server.BaseHTTPRequestHandler, server: HostileServer) -> None:
        self._handler, self._server, self._sent = handler, server, 0

    def raw(self, data: bytes) -> None:
        self._handler.wfile.write(data)
        self._sent += len(data)
        with self._server._lock:
            self._server.bytes_sent += len(data)

    def status(self, code: int, headers: list[tuple[str, str]]) -> None:
        lines = [f"HTTP/1.1 {code} {http.HTTPStatus(code).phrase}"] + [f"{key}: {value}" for key, value in headers]
        self.raw(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))

    def endless(self, block: bytes) -> None:
        """``block`` again and again until the client goes or the cap is reached (then the connection closes)."""
        while self._sent < self._server.cap:
            self.raw(block)
        raise _Capped


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Serve a directory on 127.0.0.1, misbehaving when told.")
    parser.add_argument("directory")
    arguments = parser.parse_args()
    with HostileServer(arguments.directory) as running:
        print(running.port, flush=True)
        threading.Event().wait()
