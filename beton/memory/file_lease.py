"""A read lease that keeps a memory-mapped file from being truncated while batches read it (Linux).

Reading a memory map past the end of a file that has been truncated kills the process with SIGBUS, and checking
the file's size before each batch leaves a window between the check and the decoders' reads. A read lease
(``fcntl(F_SETLEASE, F_RDLCK)``) closes it: the kernel makes any process that truncates the file or opens it for
writing (``open(path, "wb")``, ``cp``, an editor, this process too) wait until the holder lets go, for at most
``/proc/sys/fs/lease-break-time`` seconds (45 by default). :class:`FileLease` holds one on the OS cache's
descriptor, and its thread (``beton-lease-watch``) asks every :data:`POLL_SECONDS` whether a break is pending
(``F_GETLEASE``). From then on no batch may start reading the map (:meth:`FileLease.enter` raises
:class:`~beton.errors.FormatError` naming the file; the same when ``F_GETLEASE`` fails, since the lease can then
no longer be vouched for), and once the batches reading it are done
(:meth:`FileLease.leave`) the lease is released, so the other process goes on while nothing reads the map.

The kernel notifies a lease holder with a signal too, SIGIO by default, whose default action ends the process:
the lease asks for SIGURG instead, which is ignored unless a program handles it.

Where no lease can be had (a file of another user, without CAP_LEASE; a file open for writing somewhere; file
systems without leases, such as NFS; other systems than Linux), :attr:`FileLease.held` is False and the per-batch
checks of the file's size and modification time are all there is: the window remains (docs/loader.md, "Memory").
A batch that reads the map for longer than the lease-break time could still see the file truncated under it.

Maps read only briefly (the OS cache over several files copies each batch's payloads out of its shards' maps, and
the decoders read the copies) need no watching thread: :class:`CopyLeases` takes a shard's lease when a copy out of
its map starts and lets go of it when the last copy in progress ends, and between taking it and copying, the caller
checks that the file is as it was opened (a truncation that happened before the lease was taken is seen then; one
attempted during the copy waits for its end). Where a lease was had once for a file (on any descriptor: a shard
closed and opened again is the same file) and cannot be had again (a process is truncating or writing it), the
copy raises :class:`~beton.errors.FormatError` instead; where none was ever had, the copy goes on with the
per-batch checks only, as above.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import signal
import threading
from collections.abc import Callable, Iterator

from beton.errors import FormatError, locate
from beton.storage.page_source import file_identity

__all__ = ["FileLease", "CopyLeases", "POLL_SECONDS"]

#: How often the watching thread asks whether a break is pending: what a truncation waits for, at least.
POLL_SECONDS = 0.02
_JOIN_SECONDS = 0.1
_LEASE_SIGNAL = getattr(signal, "SIGURG", 0)  # ignored by default; SIGIO (the kernel's default) ends the process
_CHANGING = ("the file was truncated or opened for writing while it was being read (it may now be truncated or "
             "modified); the batches so far came from the file as it was opened")
_LOST = ("the file's read lease could not be checked any more, so nothing holds off a truncation of its memory map: "
         "the batches so far came from the file as it was opened; read it again with a new Loader, or with "
         "memory=ProcessCache()")


class FileLease:
    """A read lease on ``fd`` (open read-only), watched by a thread until :meth:`close`. ``held``: whether one was
    granted. Batches call :meth:`enter` before reading the map and :meth:`leave` when they are done with it."""

    def __init__(self, fd: int, path: str) -> None:
        self._fd, self._path = fd, path
        self._condition = threading.Condition()
        self._reading: set[int] = set()  # batches reading the map
        self._broken = ""  # why the map is read no more (a break was pending, or the lease was lost); "": it is read
        self._stop = threading.Event()
        self.held = _take_lease(fd)
        self._thread: threading.Thread | None = None
        if self.held:
            self._thread = threading.Thread(target=self._watch, name="beton-lease-watch", daemon=True)
            self._thread.start()

    def enter(self, batch: int) -> None:
        """Batch ``batch`` is about to read the map: FormatError if another process is truncating or writing the
        file (the lease is breaking or broken), or if the watcher could no longer ask about the lease (it may have
        been lost: nothing then holds off a truncation)."""
        with self._condition:
            if self._broken:
                raise locate(FormatError(self._broken), path=self._path)
            self._reading.add(batch)

    def leave(self, batch: int) -> None:
        """Batch ``batch`` reads the map no more."""
        with self._condition:
            self._reading.discard(batch)
            self._condition.notify_all()

    def _watch(self) -> None:
        # Every call on the descriptor is made holding the condition and only before close() (which sets _stop
        # holding it): the descriptor is closed after close(), and its number may then name another file.
        while not self._stop.wait(POLL_SECONDS):
            with self._condition:
                if self._stop.is_set():
                    return
                try:
                    if fcntl.fcntl(self._fd, fcntl.F_GETLEASE) == fcntl.F_RDLCK:
                        continue
                    self._broken = _CHANGING
                except OSError as error:  # the lease can no longer be vouched for: the file may change unseen
                    self._broken = f"{_LOST} ({error})"
                self._condition.wait_for(lambda: not self._reading or self._stop.is_set())
                if self._stop.is_set():
                    return  # closing the descriptor releases the lease
                _release_lease(self._fd)  # the other process goes on
                return

    def close(self) -> None:
        """Let go of the lease and stop watching. Called while the descriptor is still open: the lease is released
        here, not by closing the descriptor, which a view of the map may keep open long after (the lease would
        then outlive its watcher, and whoever writes the file would wait the whole lease-break time). Joins the
        thread only briefly (close also runs in finalisers, as the page reader's stop does): once ``_stop`` is set
        it makes no further call on the descriptor, and it ends by itself."""
        with self._condition:
            if self.held and not self._stop.is_set():
                _release_lease(self._fd)
            self._stop.set()
            self._condition.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(_JOIN_SECONDS)


@dataclasses.dataclass
class _Copying:
    copies: int = 0  # copies out of the descriptor's map in progress
    leased: bool = False  # the lease is held now


class CopyLeases:
    """Read leases held while copies out of memory maps are in progress (module docstring), for any number of
    files, from any thread.

    Whether a file's lease was granted once is kept by the file's identity (device and inode), not by descriptor:
    the OS cache over several files closes shards beyond ``max_open_shards`` and opens them again on a new
    descriptor, and a lease refused on that one means the file is being changed as much as on the first."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._copying: dict[int, _Copying] = {}  # descriptor -> its copies, while any is in progress
        self._ever_leased: set[tuple[int, int]] = set()  # (device, inode) of the files granted a lease once

    @contextlib.contextmanager
    def copying(self, fd: int, path: str, check: Callable[[], None]) -> Iterator[bool]:
        """Hold the read lease on ``fd`` (open read-only, and kept open until the block ends) while the block
        copies out of its map; ``check()`` raises unless the file is still as it was opened, and runs once the
        lease is held. Yields whether it is held (False: the kernel grants none for this file).
        :class:`~beton.errors.FormatError` naming ``path`` when another process is truncating or writing it."""
        with self._lock:
            state = self._copying.get(fd)
            if state is None:
                identity = file_identity(os.fstat(fd))[:2]  # the file, whatever its modification time
                leased = _take_lease(fd)
                if identity in self._ever_leased and not leased:
                    raise locate(FormatError(_CHANGING), path=path)
                if leased:
                    self._ever_leased.add(identity)
                state = self._copying[fd] = _Copying(leased=leased)
            elif state.leased and _lease_of(fd) != fcntl.F_RDLCK:  # a break is pending: join no copy to it
                raise locate(FormatError(_CHANGING), path=path)
            state.copies += 1
        try:
            check()  # with the lease held: a truncation before it shows now, one after it waits for the copies
            yield state.leased
        finally:
            with self._lock:
                state.copies -= 1
                if state.copies == 0:
                    del self._copying[fd]  # the descriptor may be closed now, and its number name another file
                    if state.leased:
                        _release_lease(fd)  # whoever waits to truncate goes on


def _lease_of(fd: int) -> int:
    try:
        return fcntl.fcntl(fd, fcntl.F_GETLEASE)
    except OSError:
        return fcntl.F_UNLCK


def _take_lease(fd: int) -> bool:
    if not hasattr(fcntl, "F_SETLEASE"):
        return False
    try:
        if _LEASE_SIGNAL:
            fcntl.fcntl(fd, fcntl.F_SETSIG, _LEASE_SIGNAL)
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)
    except OSError:
        return False
    return True


def _release_lease(fd: int) -> None:
    try:
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
    except OSError:
        pass  # broken already: by the kernel once the lease-break time passed (or, for a FileLease, its watcher)
