"""A finished local file put at a URL: how a writer (``DatasetWriter``, ``merge``, ``beton convert``) writes to
object storage.

The writer builds the whole file locally (a temporary file, :mod:`beton.storage.file_builder`) and calls
:func:`upload_file` once it is complete, so nothing is at the URL while samples are encoded, and a write that fails
before the upload leaves the URL as it was.

What becomes visible, and when:

* object stores (S3, GCS, Azure, ...: :data:`WHOLE_OBJECT_STORES`) publish an object whole when its upload
  completes (one PUT, or a multipart upload completed; s3fs aborts a multipart upload that fails), so the file goes
  straight to its name: readers see the former object, or none, until then, and after a failed upload still do;
* other stores (``file://``, ``memory://``, ``sftp://`` ...) may show a file while it is written, so the upload
  goes to a temporary name beside the target (``<name>.tmp-<pid>-<random>``), moved onto the name when complete
  and removed when the upload fails.

Retries: the upload is retried whole on a transient failure (a timeout, a dropped connection, a 5xx answer) within
``RemoteOptions.retries``, with the same backoff as reads and the clients' own retries turned off
(:func:`~beton.storage.remote.fetch.filesystem`); credentials and access errors fail at once. After the budget a
:class:`~beton.errors.StorageError` names the URL and the last error.

Every failure is a :class:`~beton.errors.BetonError` naming the URL, whatever the client raised (botocore, aiohttp,
OSError...: reaching the store, uploading, or moving the temporary file onto its name; the move is retried as the
upload is). After a failure nothing of the upload stays visible: the temporary file is removed, and so is a target
that a failed move left behind where there was none before (a store whose move is a copy and a delete can fail
between the two). Where even the removal fails, the error says which name to remove.
"""

from __future__ import annotations

import os
import random
import secrets
import time
from collections.abc import Callable

from beton.errors import BetonError, StorageError, locate
from beton.storage.remote.fetch import backoff, describe_error, filesystem, with_retries
from beton.storage.remote.options import RemoteOptions

__all__ = ["upload_file", "check_destination", "WHOLE_OBJECT_STORES"]

#: fsspec protocols whose objects become visible whole, once their upload completes.
WHOLE_OBJECT_STORES = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl", "oss"})


def check_destination(url: str, options: RemoteOptions, sleep: Callable[[float], None] = time.sleep) -> None:
    """Fail before a writer encodes anything where its upload to ``url`` could not succeed: the store unreachable,
    no credentials, or (object stores) the bucket missing. Retried as an upload is. Access denied to the question
    is not a failure: credentials that may only put objects (an upload role without s3:ListBucket, GCS's
    objectCreator) cannot ask about the bucket, and the upload says whether they may write. Other stores' folders
    are not asked about: what a folder is differs between them (``memory://`` has none until a file is in it)."""
    fs, path, whole = _store(url, options)
    bucket = path.split("/", 1)[0]
    if not whole or not bucket:
        return
    jitter = random.Random()
    # info, not exists: s3fs's exists answers False for refused credentials too, which would read "no such bucket"
    try:
        with_retries(lambda fresh: fs.info(bucket), options, url, f"asking about the bucket {bucket!r}",
                     lambda number: sleep(backoff(options, number, jitter.random())),
                     missing=f"no such bucket {bucket!r} to write the file in (create it first)")
    except StorageError as error:
        if not isinstance(error.__cause__, PermissionError):
            raise


def upload_file(local_path: str, url: str, options: RemoteOptions,
                sleep: Callable[[float], None] = time.sleep) -> None:
    """Put the complete local file ``local_path`` at ``url`` (module docstring), reached as ``options`` says."""
    fs, path, whole = _store(url, options)
    target = path if whole else f"{path}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    jitter = random.Random()  # spreads the retries of many writers; never affects what is written

    def pause(number: int) -> None:
        sleep(backoff(options, number, jitter.random()))

    def put(fresh: bool) -> None:
        fs.put_file(local_path, target)

    def move(fresh: bool) -> None:
        if fresh and not fs.exists(target) and fs.exists(path) and fs.size(path) == os.path.getsize(local_path):
            return  # an earlier attempt moved it and its answer was lost
        fs.mv(target, path)

    existed = True  # until known otherwise: a target that may be the former file is never removed
    try:
        if not whole:
            existed = with_retries(lambda fresh: fs.exists(path), options, url, "asking whether the file exists",
                                   pause)
        with_retries(put, options, url, "uploading the file", pause, missing="no such bucket or folder")
        if not whole:
            with_retries(move, options, url, "moving the uploaded file onto its name", pause,
                         missing="the uploaded temporary file is gone")
    except BaseException as error:
        if not whole:
            _remove(fs, target, error, f"the temporary file {url}{target[len(path):]}")
            if not existed:
                _remove(fs, path, error, f"the file {url}")
        raise


def _store(url: str, options: RemoteOptions) -> tuple[object, str, bool]:
    """The file system and path of ``url``, and whether it is an object store (:data:`WHOLE_OBJECT_STORES`)."""
    try:
        fs, path = filesystem(url, options)
    except BetonError:
        raise
    except Exception as error:  # noqa: BLE001 - the client's own exception: a BetonError naming the URL instead
        raise locate(StorageError(f"reaching the storage to write the file failed: {describe_error(error)}"),
                     path=url) from error
    protocols = fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)
    return fs, path, bool(WHOLE_OBJECT_STORES & set(protocols))


def _remove(fs: object, name: str, error: BaseException, what: str) -> None:
    """Remove ``name`` (``what``, for the user) after a failed upload, if it is there; where that fails, say so on
    ``error``."""
    try:
        if fs.exists(name):  # type: ignore[attr-defined]
            fs.rm_file(name)  # type: ignore[attr-defined]
    except Exception as failure:  # noqa: BLE001 - the upload's error is the one to report
        locate(error, note=f"({what} may be left behind, and could not be removed: {describe_error(failure)}; "
                           "remove it by hand)")

