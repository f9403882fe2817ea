"""Worker processes that end when the process that started them ends, however it ends.

The writer's encoding workers (``DatasetWriter`` with ``num_workers > 1``) are children of the writing process.
When that process ends normally, by an error, Ctrl-C, SIGTERM or SIGHUP, it stops them itself. When it is killed
outright (SIGKILL, the OOM killer) it cannot, and the workers would live on, reparented to init, holding their
memory and the temporary file's lock (:mod:`beton.storage.file_builder`). Two mechanisms make them end; the
worker's initializer sets both up (:func:`die_with_parent`):

* **The kernel's parent-death signal** (Linux only: ``prctl(PR_SET_PDEATHSIG, SIGKILL)``). The kernel kills the
  worker as soon as its parent ends, even while the worker runs native code that holds the GIL. It is set after
  the worker started, so the parent may already have ended by then: the worker checks ``os.getppid()`` against
  the parent it expects right after, and ends at once if they differ. Only for the start methods where the
  writer is the worker's parent, "fork" and "spawn"; with "forkserver" the parent is the fork server, which
  outlives the writer as long as the workers hold its pipe.
* **A pipe whose write end only the writer holds** (every POSIX system, every start method). A daemon thread in
  each worker blocks reading the read end. Nothing is ever written, so the read returns only at end of file,
  when every write end is closed: when the writer has ended, or closed its end after stopping its workers. The
  thread then ends the worker with ``os._exit``. A forked worker inherits a copy of the write end and closes it
  first. Limits, which the parent-death signal does not have: the thread needs the GIL, so a worker inside a long
  native call that holds it ends when the call returns; and a process forked (without exec) by the writing
  process during the write, such as a worker of another write running in another thread, also inherits the
  write end, so the pipe signals only once that process has ended too.

Both, because neither alone covers everything: the signal is immediate but Linux-only and tied to the direct
parent; the pipe is portable and works through a fork server, but waits for the GIL.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import os
import signal
import sys
import threading
from collections.abc import Iterator
from multiprocessing.connection import Connection
from multiprocessing.context import BaseContext

__all__ = ["ParentLink", "parent_link", "die_with_parent"]

_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
_ORPHANED_EXIT_CODE = 1


@dataclasses.dataclass(frozen=True)
class ParentLink:
    """What a worker needs to end with its parent; made by :func:`parent_link`, given to :func:`die_with_parent`.

    Pickled into "spawn" and "forkserver" workers (the read end travels as a duplicated descriptor); a forked
    worker inherits it as it is."""

    parent: int | None  # the pid os.getppid() gives in the worker while the writer lives; None: not the writer's
    read_end: Connection
    inherited_write_end: Connection | None  # "fork": the worker's copy of the writer's write end, closed there


@contextlib.contextmanager
def parent_link(context: BaseContext) -> Iterator[ParentLink]:
    """The link for workers started by ``context`` while the block runs. Leaving the block closes the write end,
    which ends any worker still running: stop (join) the workers before, inside the block."""
    read_end, write_end = context.Pipe(duplex=False)
    method = context.get_start_method()
    try:
        yield ParentLink(os.getpid() if method in ("fork", "spawn") else None, read_end,
                         write_end if method == "fork" else None)
    finally:
        write_end.close()
        read_end.close()


def die_with_parent(link: ParentLink) -> None:
    """In a worker, first thing: arrange for this process to end when the writer does (module docstring)."""
    if link.inherited_write_end is not None:
        link.inherited_write_end.close()
    if link.parent is not None:
        _set_parent_death_signal(signal.SIGKILL)
        if os.getppid() != link.parent:  # the writer ended before the signal was set: nobody would send it
            os._exit(_ORPHANED_EXIT_CODE)
    threading.Thread(target=_exit_at_end_of_file, args=(link.read_end,), name="beton-parent-watch",
                     daemon=True).start()


def _exit_at_end_of_file(read_end: Connection) -> None:
    try:
        read_end.recv_bytes()  # nothing is ever sent: this returns (or raises) only when the writer's end closed
    except (EOFError, OSError):
        pass
    os._exit(_ORPHANED_EXIT_CODE)


def _set_parent_death_signal(signum: int) -> None:
    """prctl(PR_SET_PDEATHSIG) on Linux; elsewhere, or if it fails, nothing (the pipe still ends the worker)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, ctypes.c_ulong(int(signum)), ctypes.c_ulong(0), ctypes.c_ulong(0),
                   ctypes.c_ulong(0))
    except (OSError, AttributeError):
        pass
