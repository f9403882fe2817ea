"""Directories and files only this user can change: where beton keeps its caches on disk.

A cache that another local user can write to is a way into this process. In the remote page cache, planted
symbolic links would make a later write create or overwrite files anywhere this user may write, and a planted
FIFO or device would hang or exhaust a read; the kernel cache imports Python code. So both caches live in a
directory that is, checked on the descriptor that is then used (not on a path that may change meanwhile):

* a directory (``O_DIRECTORY``), its last component not a symbolic link unless the caller allows one
  (``O_NOFOLLOW``: beton's own names inside a directory others may write to never follow a link);
* owned by this process's effective user;
* not writable by group or others. A directory beton creates has mode 0700.

Anything else is refused with :class:`~beton.errors.CacheDirError`, whose message names the directory, what is
wrong and the fix. Files inside are opened relative to the checked descriptor (``dir_fd=``), never by following
a link (:func:`read_regular_file`, :func:`write_new_file`).
"""

from __future__ import annotations

import os
import secrets
import stat
import time

from beton.errors import CacheDirError

__all__ = ["DIRECTORY_FLAGS", "READ_FLAGS", "NEW_FILE_FLAGS", "open_private_directory", "read_regular_file",
           "write_new_file", "replace_with", "unlink_quietly"]

#: a directory, without following a link in its last component
DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: reading a file: no link followed, and a FIFO opened without waiting for a writer
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
#: a file that did not exist: never an existing one, never through a link
NEW_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def open_private_directory(path: str, *, what: str, fix: str, dir_fd: int | None = None,
                           follow: bool = False, shown: str | None = None) -> int:
    """A descriptor of directory ``path`` (relative to ``dir_fd`` when given), created with mode 0700 if missing,
    after checking that it is this user's and no one else's to write (see the module's docstring).

    ``what`` names the directory in errors ("remote page cache directory"), ``fix`` says what the user can do.
    ``follow=True`` accepts a symbolic link as the last component (a directory the user named, which they may
    have linked elsewhere); the directory reached is checked all the same. ``shown``: the path errors name
    (``path`` itself by default). Raises :class:`CacheDirError`.
    """
    shown = path if shown is None else shown
    try:
        os.mkdir(path, 0o700, dir_fd=dir_fd)
    except FileExistsError:
        pass
    except OSError as error:
        raise CacheDirError(f"cannot create the {what} {shown!r}: {error.strerror}. {fix}") from error
    flags = DIRECTORY_FLAGS & ~os.O_NOFOLLOW if follow else DIRECTORY_FLAGS
    try:
        descriptor = os.open(path, flags, dir_fd=dir_fd)
    except OSError as error:
        try:
            status = os.stat(path, dir_fd=dir_fd, follow_symlinks=False)
            kind = "a symbolic link" if stat.S_ISLNK(status.st_mode) else "not a directory"
        except OSError:
            kind = error.strerror
        raise CacheDirError(f"the {what} {shown!r} is {kind}, not a directory of this user's: beton does not "
                            f"follow or use it. {fix}") from error
    try:
        status = os.fstat(descriptor)
        problem = _problem(status)
        if problem:
            raise CacheDirError(f"the {what} {shown!r} {problem}: whoever else can write there could replace the "
                                f"files this process reads and writes. {fix}")
    except BaseException:
        os.close(descriptor)
        raise
    return descriptor


def _problem(status: os.stat_result) -> str | None:
    """Why a directory is not private to this user, or None."""
    user = os.geteuid()
    if status.st_uid != user:
        return f"belongs to user id {status.st_uid}, not to this user (id {user})"
    if status.st_mode & 0o022:
        return f"is writable by group or others (mode {stat.S_IMODE(status.st_mode):04o}, expected 0700)"
    return None


def read_regular_file(name: str, dir_fd: int, size: int | None = None, most: int | None = None,
                      touch: bool = False) -> bytes | None:
    """The bytes of ``name`` in ``dir_fd`` if it is a regular file of this user's (not a link, FIFO, device or
    directory, not another user's) holding exactly ``size`` bytes (when given) or at most ``most``; else None.

    The entry is looked at before it is opened (a device is never opened) and again through the descriptor (the
    file read is the file checked); its size is known before a byte is read. ``touch`` sets its modification
    time to now (through the descriptor). Errors of the file system are None too: whatever the entry is, the
    caller treats it as absent."""
    try:
        before = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        if not _regular_and_mine(before, size, most):
            return None
        descriptor = os.open(name, READ_FLAGS, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        status = os.fstat(descriptor)
        if (status.st_dev, status.st_ino) != (before.st_dev, before.st_ino) or \
                not _regular_and_mine(status, size, most):
            return None
        chunks, left = [], status.st_size
        while left > 0:
            chunk = os.read(descriptor, left)
            if not chunk:
                return None  # shorter than it said: changed under us
            chunks.append(chunk)
            left -= len(chunk)
        if touch:
            now = time.time_ns()  # explicit: file systems stamp times from a coarse clock
            os.utime(descriptor, ns=(now, now))
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(descriptor)


def _regular_and_mine(status: os.stat_result, size: int | None, most: int | None) -> bool:
    return (stat.S_ISREG(status.st_mode) and status.st_uid == os.geteuid()
            and (size is None or status.st_size == size) and (most is None or status.st_size <= most))


def write_new_file(dir_fd: int, data: bytes | memoryview, prefix: str) -> str:
    """Write ``data`` to a new file (mode 0600) in ``dir_fd`` under a fresh name starting with ``prefix``; its
    name. Created with ``O_EXCL | O_NOFOLLOW``: never an existing file, never through a link."""
    name = f"{prefix}{secrets.token_hex(8)}"
    descriptor = os.open(name, NEW_FILE_FLAGS, 0o600, dir_fd=dir_fd)
    try:
        view = memoryview(data).cast("B")
        while view:
            view = view[os.write(descriptor, view):]
    except BaseException:
        os.close(descriptor)
        unlink_quietly(name, dir_fd)
        raise
    os.close(descriptor)
    return name


def replace_with(dir_fd: int, temporary: str, name: str) -> bool:
    """Rename ``temporary`` onto ``name`` in ``dir_fd``, replacing whatever entry is there without following it
    (a link, a FIFO, a file; an empty directory is removed first). False if it could not be done (a directory
    that is not empty): ``temporary`` is then removed."""
    for _ in range(2):
        try:
            os.replace(temporary, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            return True
        except IsADirectoryError:
            try:
                os.rmdir(name, dir_fd=dir_fd)
            except OSError:
                break
        except OSError:
            break
    unlink_quietly(temporary, dir_fd)
    return False


def unlink_quietly(name: str, dir_fd: int) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except OSError:
        pass

