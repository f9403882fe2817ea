"""A loopback HTTP server that honours Range requests, with fault injection and a throttled link.

For the remote-reading tests (``test_remote.py``) and ``benchmarks/remote.py``. It binds to 127.0.0.1 only and
serves the files of one directory and its subdirectories by name (``GET /name``, ``GET /sub/name``, ``HEAD``; no
segment may be empty or start with a dot), with ``ETag`` and ``Last-Modified`` from each file's status, so a
rewritten file is seen as changed.

Faults (:class:`Fault`) apply to the next matching GET requests: ``drop`` closes the connection without an
answer, ``503`` answers Service Unavailable, ``truncate`` announces the whole body and closes after half of it,
``short`` answers a well-formed response with half the body, ``slow`` waits ``delay`` seconds before answering,
``corrupt`` flips one byte in the middle of the body, ``404`` answers Not Found, ``full`` ignores the range and
answers the whole file. ``rate`` (bytes per second,
shared by every connection, like one link) and ``latency`` (seconds added before each answer) make it behave
like a remote store.

``python tests/range_server.py DIRECTORY [--rate BYTES/S] [--latency SECONDS]`` runs one in its own process
(for benchmarks: its work then does not compete for the client's interpreter) and prints its port; ``GET
/.stats`` answers ``{"requests": ..., "bytes_sent": ..., "cpu_seconds": ...}`` as JSON (the CPU time of the
process serving).
"""

from __future__ import annotations

import argparse
import dataclasses
import email.utils
import http.server
import json
import os
import re
import socket
import threading
import time

__all__ = ["Fault", "RangeServer"]

_RANGE = re.compile(r"bytes=(\d+)-(\d*)$")
_CHUNK = 64 * 1024


@dataclasses.dataclass
class Fault:
    """``kind`` for the next ``times`` GET requests of ``name`` (any file when None) whose range starts at or
    after ``from_byte``."""

    kind: str
    times: int = 1
    name: str | None = None
    from_byte: int = 0
    delay: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in ("drop", "503", "truncate", "short", "slow", "corrupt", "404", "full"):
            raise ValueError(f"unknown fault {self.kind!r}")


class _Link:
    """One shared link of ``rate`` bytes per second: each chunk waits for its turn on the wire."""

    def __init__(self, rate: float | None) -> None:
        self.rate = rate
        self._lock = threading.Lock()
        self._free_at = 0.0

    def send(self, write, data: bytes) -> None:
        for start in range(0, len(data), _CHUNK):
            chunk = data[start : start + _CHUNK]
            if self.rate:
                with self._lock:
                    now = time.perf_counter()
                    begin = max(now, self._free_at)
                    self._free_at = begin + len(chunk) / self.rate
                    done = self._free_at
                time.sleep(max(0.0, done - time.perf_counter()))
            write(chunk)


class QuietHandler(http.server.BaseHTTPRequestHandler):
    """Keep-alive as real stores, no delayed-ACK stalls, no log lines, no traceback for a client that hangs up."""

    protocol_version = "HTTP/1.1"  # keep-alive, as real stores
    disable_nagle_algorithm = True  # headers and body go out as written (no 40 ms delayed-ACK stalls)

    def log_message(self, *args: object) -> None:
        pass

    def handle(self) -> None:
        try:
            super().handle()
        except (ConnectionResetError, BrokenPipeError):
            pass  # the client closed a connection whose answer it refused, or stopped waiting for


class LoopbackServer:
    """A threaded HTTP server on 127.0.0.1 answering with ``handler``, run in a thread of its own from ``start()``
    (or ``with``) to ``stop()``."""

    def __init__(self, handler: type[http.server.BaseHTTPRequestHandler], name: str) -> None:
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name=name, daemon=True)

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.port}/{name}"

    def start(self):  # the server itself, for ``server = Server(...).start()``
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


class RangeServer(LoopbackServer):
    """Serves ``directory`` on 127.0.0.1; ``url(name)`` is a file's URL. Use as a context manager.

    ``faults`` (a list, consumed in order) and ``latency`` may be changed while it runs; ``requests`` counts the
    GET requests answered with file bytes (counted as the bytes start to go: counted after, a client that had
    read them could look before the count moved, and see its last request counted in its next reads),
    ``bytes_sent`` the body bytes sent, ``most_at_once`` the most GET
    requests it was answering at the same time, ``paths`` the path of every request (GET or HEAD) in order.
    """

    def __init__(self, directory: str | os.PathLike[str], rate: float | None = None, latency: float = 0.0) -> None:
        self.directory = os.fspath(directory)
        self.faults: list[Fault] = []
        self.latency = latency
        self.requests = 0
        self.paths: list[str] = []  # every request's path, in order (what a client asked for, answered or not)
        self.bytes_sent = 0
        self.most_at_once = 0
        self._answering = 0
        self._lock = threading.Lock()
        self._link = _Link(rate)
        server = self

        class Handler(QuietHandler):
            def do_HEAD(self) -> None:
                server._answer(self, head=True)

            def do_GET(self) -> None:
                with server._lock:
                    server._answering += 1
                    server.most_at_once = max(server.most_at_once, server._answering)
                try:
                    server._answer(self, head=False)
                finally:
                    with server._lock:
                        server._answering -= 1

        super().__init__(Handler, "range-server")

    # ---- answering ------------------------------------------------------------------------------------------

    def _take_fault(self, name: str, start: int) -> Fault | None:
        with self._lock:
            for fault in self.faults:
                if fault.times > 0 and fault.name in (None, name) and start >= fault.from_byte:
                    fault.times -= 1
                    return fault
        return None

    def _answer(self, handler: http.server.BaseHTTPRequestHandler, head: bool) -> None:
        with self._lock:
            self.paths.append(handler.path)
        name = handler.path.lstrip("/")
        if name == ".stats":
            with self._lock:
                stats = json.dumps({"requests": self.requests, "bytes_sent": self.bytes_sent,
                                    "cpu_seconds": sum(os.times()[:2])}).encode()
            handler.send_response(200)
            handler.send_header("Content-Length", str(len(stats)))
            handler.end_headers()
            handler.wfile.write(stats)
            return None
        path = os.path.join(self.directory, name)
        if any(not part or part.startswith(".") for part in name.split("/")) or not os.path.isfile(path):
            return self._error(handler, 404)
        status = os.stat(path)
        size = status.st_size
        start, end = 0, size
        match = _RANGE.match(handler.headers.get("Range", "") or "")
        if match:
            start = int(match[1])
            end = min(size, int(match[2]) + 1) if match[2] else size
            if start >= size or end <= start:
                return self._error(handler, 416)
        fault = None if head else self._take_fault(name, start)
        if fault is not None and fault.kind == "full":
            match, start, end = None, 0, size
        if self.latency:
            time.sleep(self.latency)
        if fault is not None and fault.kind == "slow":
            time.sleep(fault.delay)
        if fault is not None and fault.kind == "drop":
            handler.close_connection = True
            handler.connection.shutdown(socket.SHUT_RDWR)
            return None
        if fault is not None and fault.kind in ("503", "404"):
            return self._error(handler, int(fault.kind))
        body = b""
        if not head:
            with open(path, "rb") as file:
                file.seek(start)
                body = file.read(end - start)
        announced = end - start
        if fault is not None and fault.kind == "short":
            body = body[: len(body) // 2]
            announced = len(body)
        if fault is not None and fault.kind == "corrupt" and body:
            middle = len(body) // 2
            body = body[:middle] + bytes([body[middle] ^ 0x40]) + body[middle + 1 :]
        handler.send_response(206 if match else 200)
        if match:
            handler.send_header("Content-Range", f"bytes {start}-{start + announced - 1}/{size}")
        handler.send_header("Content-Length", str(announced))
        handler.send_header("Content-Type", "application/octet-stream")
        handler.send_header("Accept-Ranges", "bytes")
        handler.send_header("ETag", f'"{status.st_ino:x}-{status.st_mtime_ns:x}-{size:x}"')
        handler.send_header("Last-Modified", email.utils.formatdate(status.st_mtime, usegmt=True))
        handler.end_headers()
        if head:
            return None
        if fault is not None and fault.kind == "truncate":
            body = body[: len(body) // 2]
            handler.close_connection = True
        with self._lock:  # before the body leaves: a client holding it must find it counted
            self.requests += 1
        try:
            self._link.send(handler.wfile.write, body)
            handler.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            handler.close_connection = True
            return None
        with self._lock:
            self.bytes_sent += len(body)
        return None

    @staticmethod
    def _error(handler: http.server.BaseHTTPRequestHandler, code: int) -> None:
        handler.send_response(code)
        handler.send_header("Content-Length", "0")
        handler.end_headers()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Serve a directory on 127.0.0.1 with Range requests.")
    parser.add_argument("directory")
    parser.add_argument("--rate", type=float, default=None, help="link rate in bytes per second")
    parser.add_argument("--latency", type=float, default=0.0, help="seconds added before each answer")
    arguments = parser.parse_args()
    with RangeServer(arguments.directory, rate=arguments.rate, latency=arguments.latency) as running:
        print(running.port, flush=True)
        threading.Event().wait()
