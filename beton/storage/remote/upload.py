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
"""

from __future__ import annotations

import os
import random
import secrets
import time
from collections.abc import Callable

from beton.storage.remote.fetch import backoff, filesystem, with_retries
from beton.storage.remote.options import RemoteOptions

__all__ = ["upload_file", "WHOLE_OBJECT_STORES"]

#: fsspec protocols whose objects become visible whole, once their upload completes.
WHOLE_OBJECT_STORES = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl", "oss"})


def upload_file(local_path: str, url: str, options: RemoteOptions,
                sleep: Callable[[float], None] = time.sleep) -> None:
    """Put the complete local file ``local_path`` at ``url`` (module docstring), reached as ``options`` says."""
    fs, path = filesystem(url, options)
    protocols = fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)
    whole = bool(WHOLE_OBJECT_STORES & set(protocols))
    target = path if whole else f"{path}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    jitter = random.Random()  # spreads the retries of many writers; never affects what is written

    def attempt(fresh: bool) -> None:
        fs.put_file(local_path, target)

    try:
        with_retries(attempt, options, url, "uploading the file", lambda number: sleep(backoff(options, number,
                                                                                                jitter.random())),
                     missing="no such bucket or folder")
        if not whole:
            fs.mv(target, path)
    except BaseException:
        if not whole:
            try:
                fs.rm_file(target)
            except Exception:  # noqa: BLE001 - it may never have been made; the upload's error is the one to report
                pass
        raise
