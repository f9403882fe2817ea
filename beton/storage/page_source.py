"""Page sources: where the memory layers read a file's bytes from, behind one small interface.

The process cache reads pages through a :class:`PageSource`; a local file is a :class:`LocalFile` (``preadv``
on a descriptor opened once); a remote file is a :class:`~beton.storage.remote.RemotePageSource` (checked pages
fetched by byte range). :func:`open_page_source` picks the one for a Reader.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np

from beton.errors import BetonError, FormatError, LoaderError, locate
from beton.storage import format as fmt
from beton.storage.local_file import open_regular
from beton.storage.reader import Reader
from beton.storage.remote import RemotePageSource

__all__ = ["PageSource", "LocalFile", "open_page_source", "file_identity"]


class PageSource(Protocol):
    """The bytes of one opened file, which the Reader has validated.

    ``description``: the path or URL, for error messages. ``read_into(offset, out, what)`` fills the uint8 array
    ``out`` with the file's bytes from ``offset`` or raises a :class:`~beton.errors.BetonError` naming the
    source and ``what`` (e.g. "page 7"): never fewer bytes, never other bytes. ``check()`` raises if the file
    changed since it was opened (called per batch, so cheap); ``check_path()`` also checks that the name still
    names the opened file (per epoch). ``close()`` releases it. ``will_read(batch_pages, budget_pages)``: the
    heap pages each batch of the coming epoch needs and the reader's page budget, so that a source with latency
    can fetch ahead (a local file ignores it). ``will_serve(samples)``: the samples of a batch, before any of its
    values are read, so that a source over several files can check the files they lie in that it has not
    checked yet (one file was checked when it opened). ``sample_file(sample)``: the file that holds ``sample``
    and its index there, for errors (a union's shard; else this file and ``sample``).
    """

    description: str
    size: int

    def read_into(self, offset: int, out: np.ndarray, what: str) -> None: ...

    def check(self) -> None: ...

    def will_read(self, batch_pages: Sequence[np.ndarray], budget_pages: int) -> None: ...

    def check_path(self) -> None: ...

    def will_serve(self, samples: np.ndarray) -> None: ...

    def sample_file(self, sample: int) -> tuple[str, int]: ...

    def close(self) -> None: ...


def file_identity(status: os.stat_result) -> tuple[int, int, int]:
    """What tells a file, and a modification of it, apart: its device, inode and modification time."""
    return (status.st_dev, status.st_ino, status.st_mtime_ns)


class LocalFile:
    """The Loader's file, opened once, with checks that it is still the file that was opened and validated.

    ``check()`` (an ``fstat`` of the open descriptor: per batch) raises when the file's size or modification
    time changed; ``check_path()`` (a ``stat`` of the path: per epoch) also raises when the path names another
    file (replaced by a rename, or removed). Modification time counts because rewriting a file in place
    (``cp``, ``open(path, "wb")``) can leave its size as it was; touching the file therefore raises too.
    """

    def __init__(self, reader: Reader) -> None:
        opened = reader.file_map
        header = bytes(opened[: fmt.HEADER_SIZE])
        self._open(reader.path, len(opened), lambda found: found == header)

    @classmethod
    def reopened(cls, path: str, size: int, header_matches: Callable[[bytes], bool],
                 identity: tuple[int, int, int] | None = None) -> LocalFile:
        """A file validated earlier and closed since (a shard of a union, opened when an epoch reaches it): it must
        still be ``size`` bytes, with a header that ``header_matches``, and the same file, unmodified, as when it
        was validated (``identity``: :func:`file_identity` then) - its pages may have been rewritten in place
        while it was closed, which neither its size nor its header shows."""
        source = cls.__new__(cls)
        source._open(path, size, header_matches)
        if identity is not None and source.identity != identity:
            source.close()
            raise source._error("the file was replaced or modified since its tables were read")
        return source

    def _open(self, path: str, size: int, header_matches: Callable[[bytes], bool]) -> None:
        self.description = str(path)
        self.path = path
        self.fd = open_regular(path)
        status = os.fstat(self.fd)
        #: the opened file's :func:`file_identity`: what ``check`` and ``check_path`` compare with
        self.identity = file_identity(status)
        self.size = status.st_size
        # The path is opened again, so it may name another file than the one that was validated: the size
        # and the header (which holds every table's CRC32) must be those checked.
        if self.size != size or not header_matches(os.pread(self.fd, fmt.HEADER_SIZE, 0)):
            self.close()
            raise self._error("the file changed between opening it and starting to read it")

    def check(self) -> None:
        if self.fd < 0:
            raise self._error("the Loader was closed", LoaderError)
        status = os.fstat(self.fd)
        if status.st_size != self.size:
            raise self._error(f"the file changed while it was being read: it is now {status.st_size} bytes, it "
                              f"had {self.size} when the Loader opened it (truncated or rewritten)")
        if file_identity(status)[2] != self.identity[2]:
            raise self._error("the file was modified (its modification time changed) while it was being read")

    def will_serve(self, samples: np.ndarray) -> None:
        pass  # one file, checked when it opened

    def sample_file(self, sample: int) -> tuple[str, int]:
        return self.path, sample

    def check_path(self) -> None:
        try:
            status = os.stat(self.path)
        except FileNotFoundError:
            raise self._error("the file was removed while it was being read") from None
        if file_identity(status)[:2] != self.identity[:2]:
            raise self._error("the path names another file than the one the Loader opened (replaced while it "
                              "was being read): every batch so far came from the opened file; make a new Loader "
                              "to read the new one")
        self.check()

    def will_read(self, batch_pages: Sequence[np.ndarray], budget_pages: int) -> None:
        pass  # the kernel reads ahead on its own; pages are read when asked for

    def read_into(self, offset: int, out: np.ndarray, what: str) -> None:
        read = os.preadv(self.fd, [out], offset)
        if read != len(out):  # the file shrank since it was opened: the rest of the buffer is not the data
            raise self.short_read(what, read, len(out))

    def short_read(self, what: str, read: int, wanted: int) -> BetonError:
        """The error for a read that returned fewer bytes than the file had when opened."""
        return self._error(f"short read of {what}: {read} of {wanted} bytes (the file was truncated?)")

    def _error(self, message: str, kind: type[BetonError] = FormatError) -> BetonError:
        return locate(kind(message), path=self.path)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def open_page_source(reader: Reader) -> PageSource:
    """The page source for a validated Reader's file: local, or remote when the Reader opened a URL."""
    return LocalFile(reader) if reader.remote is None else RemotePageSource(reader.remote)

