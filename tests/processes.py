"""Helpers for tests that watch other processes and servers: whether a process lives, waiting for a condition,
and an S3 store (moto's server on loopback)."""

from __future__ import annotations

import contextlib
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
