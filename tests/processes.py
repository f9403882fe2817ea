"""Helpers for tests that watch other processes, threads and servers: whether a process lives, waiting for a
condition, the error a call raises within a time limit, and an S3 store (moto's server on loopback)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest


def alive(pid: int) -> bool:
    """Whether the process exists and is not a zombie (an orphan that init has not reaped yet is one)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def wait_for(condition: Callable[[], bool], timeout: float) -> bool:
    """Poll ``condition`` until it holds (True) or ``timeout`` seconds pass (False)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def refusal(call: Callable[[], object], timeout: float = 30.0) -> BaseException:
    """The error ``call()`` raises, run in a daemon thread (one that hangs does not keep the test process alive);
    fails the test where it is still running after ``timeout`` seconds (it opened a FIFO, say) or raised nothing."""
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            call()
            outcome.append(None)
        except BaseException as error:  # noqa: BLE001 - handed to the test
            outcome.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    assert outcome, f"still running after {timeout} s: it waits on something (a FIFO opened as a file?)"
    assert outcome[0] is not None, "nothing was raised"
    return outcome[0]


@contextlib.contextmanager
def moto_s3() -> Iterator[dict]:
    """An S3 store on 127.0.0.1 for the block; yields the fsspec/s3fs storage options that reach it. Skips the
    test without s3fs (the 'remote' extra) or moto (the 'test' extra)."""
    pytest.importorskip("s3fs", reason="s3:// needs s3fs (the 'remote' extra)")
    moto_server = pytest.importorskip("moto.server", reason="the S3 tests run moto's server (the 'test' extra)")
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        yield {"key": "testing", "secret": "testing", "endpoint_url": f"http://{host}:{port}"}
    finally:
        server.stop()
