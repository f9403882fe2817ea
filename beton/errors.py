"""Every error beton raises on purpose.

::

    BetonError                                  catch-all for beton's own errors
    ├── FormatError (ValueError)                not a beton file, unsupported version, bad offset/size
    │   ├── CorruptDataError                    a checksum does not match: the bytes changed after writing
    │   ├── ShardError                          shards do not fit together, or not their manifest
    │   └── NotAFileError                       a dataset's name is a FIFO, device or socket, not a file
    ├── FieldError (ValueError)                 a field definition is wrong or its type cannot be found
    ├── EncodeError (ValueError)                a sample's value does not fit its field (wrong dtype, shape, type)
    ├── DecodeError (ValueError)                a stored payload cannot be decoded (e.g. invalid JSON, bad JPEG)
    ├── DatasetError (RuntimeError)             the user's dataset raised while being read by the writer
    ├── WriterError (RuntimeError)              writing failed for another reason (a worker process died)
    ├── PipelineError (TypeError)               a loader pipeline is built wrongly
    ├── LoaderError (RuntimeError)              a loader is used in a way it cannot serve (a superseded iterator)
    ├── ResumeError (ValueError)                a state_dict that is not this loader's (another file, order, seed)
    ├── StorageError (OSError)                  remote storage kept failing to deliver a file's bytes
    ├── ShardNotFoundError (FileNotFoundError)  a dataset names a file that is not there (a shard, a glob)
    └── CacheDirError (PermissionError)         a cache directory others could write to (or not a directory)

Each subclass also inherits the builtin it resembles, so ``except ValueError`` keeps working for code that
does not know beton. Messages name the file, then the table, field, sample or page, then "expected X, got Y".

Where an error happened reaches it one way, :func:`locate` (and :func:`error_context`, the same for every error
leaving a block): it sets the location attributes that are still unset, so the innermost code, which knows the
most precise place, wins; and it can add a note, the only context a foreign exception can carry. ``args`` are
never rewritten, so messages stay as raised.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import TypeVar

import numpy as np

__all__ = [
    "BetonError",
    "FormatError",
    "CorruptDataError",
    "ShardError",
    "NotAFileError",
    "FieldError",
    "EncodeError",
    "DecodeError",
    "DatasetError",
    "WriterError",
    "PipelineError",
    "LoaderError",
    "ResumeError",
    "StorageError",
    "ShardNotFoundError",
    "CacheDirError",
]

_LOCATION = ("path", "field", "sample", "page")
_Error = TypeVar("_Error", bound=BaseException)


class BetonError(Exception):
    """Base class of every error beton raises on purpose.

    Optional attributes give the location: ``path``, ``field``, ``sample`` and ``page``. They are filled in by
    whoever knows them (see :func:`locate`) and appear in ``str(error)``.
    """

    path: str | None = None
    field: str | None = None
    sample: int | None = None
    page: int | None = None

    def __str__(self) -> str:
        message = super().__str__()
        if sys.version_info < (3, 11) and getattr(self, "__notes__", None):  # 3.10 prints no notes itself
            message = "\n".join([message, *self.__notes__])
        where = []
        if self.path is not None:
            where.append(f"file {self.path!r}")
        if self.field is not None:
            where.append(f"field {self.field!r}")
        if self.sample is not None:
            where.append(f"sample {self.sample}")
        if self.page is not None:
            where.append(f"page {self.page}")
        return f"{', '.join(where)}: {message}" if where else message


class FormatError(BetonError, ValueError):
    """The file is not a valid beton file: wrong magic, unsupported version, an offset or size out of range."""


class CorruptDataError(FormatError):
    """A checksum does not match: the bytes on disk are not the bytes that were written."""


class NotAFileError(FormatError):
    """A name a dataset reads (a file, a shard, a manifest, a tables file) is a FIFO, a device or a socket, found
    before anything was read from it: opening a FIFO would wait for a writer forever, a device may never end."""


class ShardError(FormatError):
    """The files of one dataset do not fit together: a shard's fields differ from the others' (the first difference
    is named), a shard is not the file its manifest lists (its header changed, its sample count differs), or their
    file-level metadata disagree where they are merged. ``path`` is the shard's path or URL."""


class FieldError(BetonError, ValueError):
    """A field is defined wrongly, or a stored field type cannot be resolved to a class."""


class EncodeError(BetonError, ValueError):
    """A sample's value does not fit its field: wrong type, dtype or shape, or not serialisable."""


class DecodeError(BetonError, ValueError):
    """A stored payload cannot be decoded into a value of its field."""


class DatasetError(BetonError, RuntimeError):
    """The user's dataset raised while the writer read a sample; the original exception is ``__cause__``."""


class WriterError(BetonError, RuntimeError):
    """Writing failed for a reason outside the data, such as a worker process that died."""


class PipelineError(BetonError, TypeError):
    """A loader pipeline cannot be built: an operation does not accept its input, or a field is unknown."""


class LoaderError(BetonError, RuntimeError):
    """A loader is used in a way it cannot serve, such as an epoch iterator superseded by a newer one."""


class ResumeError(BetonError, ValueError):
    """A ``state_dict`` cannot resume this Loader: it is malformed, or was saved over another dataset, selection
    of samples, order or seed (the message names which differs)."""


class StorageError(BetonError, OSError):
    """Remote storage did not deliver a file's bytes: a read kept failing (timeouts, dropped connections, server
    errors, short reads) until its retries ran out, or failed in a way retrying cannot mend (access denied). The
    last underlying error is ``__cause__``; ``path`` is the URL, ``page`` the page when known."""


class ShardNotFoundError(BetonError, FileNotFoundError):
    """A dataset of several files names one that is not there: a glob that matches nothing (or a glob over HTTP,
    which cannot list files), or a shard (listed in a manifest or named in a list) that is missing. ``path`` is the
    shard's path or URL (or the glob)."""


class CacheDirError(BetonError, PermissionError):
    """A cache directory (the remote page cache's, the kernel cache's) is not one that only this user can write:
    it belongs to another user, is writable by group or others, is a symbolic link where beton does not follow
    one, or cannot be created. Whoever else could write there could make this process overwrite files elsewhere
    or, for the kernel cache, run their code. The message names the directory and the fix."""


def locate(error: _Error, *, note: str | None = None, **where: object) -> _Error:
    """Attach where ``error`` happened, and return it (``raise locate(FormatError(...), sample=3)``).

    ``where`` names location attributes (path, field, sample, page): each one the error, a BetonError, does not
    have yet is set (None values are skipped). ``note``, when given, is added to any exception, foreign ones
    included, with ``add_note`` (also on Python 3.10, whose exceptions have no ``add_note``: the note goes to
    ``__notes__``, and a BetonError shows it in its message).
    """
    unknown = set(where) - set(_LOCATION)
    if unknown:
        raise TypeError(f"locate() names only {', '.join(_LOCATION)}, got {', '.join(sorted(unknown))}")
    if isinstance(error, BetonError):
        for name, value in where.items():
            if value is not None and getattr(error, name, None) is None:
                setattr(error, name, value)
    if note is not None:
        add_note(error, note)
    return error


@contextlib.contextmanager
def error_context(*, note: str | None = None, **where: object) -> Iterator[None]:
    """:func:`locate` every exception leaving the block (the location only on BetonErrors; the note on all)."""
    try:
        yield
    except Exception as error:
        locate(error, note=note, **where)
        raise



def add_note(error: BaseException, note: str) -> None:
    """``error.add_note(note)``, also on Python 3.10. Prefer :func:`locate`, which also sets the location."""
    if sys.version_info >= (3, 11):
        error.add_note(note)
    else:
        notes = getattr(error, "__notes__", None)
        if not isinstance(notes, list):
            notes = []
            error.__notes__ = notes
        notes.append(note)


def first_bad_record(bad: np.ndarray, message: Callable[[int], str]) -> None:
    """Raise FormatError(message(sample)) naming the first sample whose entry of the mask ``bad`` is True."""
    if bad.any():
        sample = int(np.flatnonzero(bad)[0])
        raise locate(FormatError(message(sample)), sample=sample)
