"""Opening a local file that a dataset names: a regular file, or an error before anything is read.

A dataset's names come from the user or from a manifest, which may come from anyone (a downloaded archive can hold
a FIFO). ``open()`` of a FIFO waits for a writer that never comes, and a character device (``/dev/zero``) never
ends: every local read of a dataset's file, its shards, its tables file and its manifest opens it here, without
waiting (``O_NONBLOCK``), and refuses what is not a regular file by what ``fstat`` says of the opened descriptor.
"""

from __future__ import annotations

import errno
import os
import stat

import numpy as np

from beton.errors import NotAFileError

__all__ = ["open_regular", "map_regular"]

_KINDS = {stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
          stat.S_IFSOCK: "a socket"}


def open_regular(path: str) -> int:
    """A read-only descriptor of the regular file ``path`` (the caller closes it). A directory raises
    IsADirectoryError and a missing file FileNotFoundError, as ``os.open`` raises them; a FIFO, device or socket a
    NotAFileError saying which."""
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(descriptor).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
        if not stat.S_ISREG(mode):
            raise NotAFileError(f"is {_KINDS.get(stat.S_IFMT(mode), 'not a regular file')}, not a file a dataset "
                              "can be read from")
        os.set_blocking(descriptor, True)
    except BaseException:
        os.close(descriptor)
        raise
    return descriptor


def map_regular(path: str) -> np.ndarray:
    """The regular file ``path`` mapped read-only (as :func:`open_regular` opens it). An empty file raises
    ValueError, as ``np.memmap`` does."""
    descriptor = open_regular(path)
    with os.fdopen(descriptor, "rb") as file:  # the mapping keeps its own reference to the file
        return np.memmap(file, dtype=np.uint8, mode="r")
