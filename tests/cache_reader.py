"""The child process of the remote page cache's tests (tests/storage/test_remote_cache.py): reads every sample of a
served file through a disk cache, compares each with a local copy, and prints the pages it fetched.

A fresh interpreter, not a fork of the test process: a fork inherits, still held, every lock another thread of that
process held at the moment (an import lock taken by the server's thread, say), and the child then waited on it for
ever. Arguments: URL, local path, cache directory, user id to read as ("-": this user's).

As another user it drops to that user only after reading the file once as this one, into a cache directory of its
own: that imports every module the reads need while this user may still open them (the checkout and its interpreter
may be closed to others), so that the reads as the other user execute nothing new.
"""

from __future__ import annotations

import dataclasses
import os
import resource
import sys
import tempfile

import numpy as np

import beton
from beton.storage.remote import RemoteOptions

FAST = RemoteOptions(retries=4, backoff=0.001, max_backoff=0.01, timeout=5.0)


def same(a, b) -> bool:
    return np.array_equal(a, b) if isinstance(a, np.ndarray) else (type(a) is type(b) and a == b)


def read_everything(url: str, local_path: str, cache_dir: str, **options) -> beton.Reader:
    """Every sample read through the disk cache equals the local file's; the reader's page counters stay."""
    options = dataclasses.replace(FAST, cache_dir=cache_dir, **options)
    with beton.Reader(url, remote=options) as remote, beton.Reader(local_path) as local:
        for i in range(len(local)):
            assert all(same(x, y) for x, y in zip(remote[i], local[i])), f"sample {i}"
        return remote


def main(url: str, local_path: str, cache_dir: str, user: str) -> None:
    if user != "-":
        with tempfile.TemporaryDirectory() as own_cache:
            read_everything(url, local_path, own_cache)
        os.setgroups([])
        os.setgid(int(user))
        os.setuid(int(user))
    # 2 GiB more address space than the interpreter holds now: a page read whole from /dev/zero or a huge sparse
    # file is then a MemoryError, not an exhausted machine
    size = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmSize"))
    limit = size * 1024 + (2 << 30)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    print(f"fetched {read_everything(url, local_path, cache_dir).remote.pages.pages_fetched}")


if __name__ == "__main__":
    main(*sys.argv[1:])
