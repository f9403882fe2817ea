"""What a user sets for remote files, and how a URL is told from a local path."""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from typing import Any

__all__ = ["RemoteOptions", "is_url", "resolve_remote_options"]

# "scheme://..." or fsspec's chained "cache::scheme://...". A Windows drive ("C:\\") has no "//" after the colon.
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*(://|::)")


def is_url(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` names a file through fsspec (a URL) rather than the local file system. Path objects are
    always local."""
    return isinstance(path, str) and _URL.match(path) is not None


@dataclasses.dataclass(frozen=True)
class RemoteOptions:
    """How a remote file is read. Local paths ignore all of it.

    Args:
        storage_options: keyword arguments for the fsspec file system (``fsspec.core.url_to_fs``), e.g.
            ``{"anon": True}`` or ``{"client_kwargs": {"endpoint_url": ...}}`` for S3. Credentials belong in
            fsspec's and the storage's usual configuration (environment, config files), not here.
        cache_dir: a local directory for the page cache (shared safely by the processes of a node); None: no
            disk cache, every epoch fetches its pages again.
        cache_limit: bytes the cache directory may hold (least recently used pages go first); None: no limit
            other than the cached files' sizes.
        max_in_flight: range requests running at once.
        retries: further attempts after a transient failure (timeout, reset, 5xx, short read, wrong checksum).
        backoff: seconds before the first retry; doubled for each further one (with jitter), at most
            ``max_backoff``.
        timeout: seconds one request may take before it counts as failed (None: the file system's own).
        request_bytes: consecutive pages are fetched in one request up to about this many bytes.
        prefetch_bytes: bytes of pages fetched ahead of the reader and held in memory.
    """

    storage_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    cache_dir: str | os.PathLike[str] | None = None
    cache_limit: int | None = None
    max_in_flight: int = 8
    retries: int = 5
    backoff: float = 0.2
    max_backoff: float = 10.0
    timeout: float | None = 60.0
    request_bytes: int = 8 * 1024 * 1024
    prefetch_bytes: int = 128 * 1024 * 1024

    def __post_init__(self) -> None:
        for name in ("max_in_flight", "request_bytes", "prefetch_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.retries < 0 or self.backoff < 0 or self.max_backoff < 0:
            raise ValueError(f"retries, backoff and max_backoff must not be negative, got {self.retries}, "
                             f"{self.backoff}, {self.max_backoff}")
        if self.timeout is not None and self.timeout <= 0:
            raise ValueError(f"timeout must be positive or None, got {self.timeout}")
        if self.cache_limit is not None and self.cache_limit < 0:
            raise ValueError(f"cache_limit must be a number of bytes >= 0 or None, got {self.cache_limit}")


def resolve_remote_options(options: RemoteOptions | None = None, *, storage_options: Mapping[str, Any] | None = None,
                   cache_dir: str | os.PathLike[str] | None = None, cache_limit: int | None = None) -> RemoteOptions:
    """``options`` (or the defaults) with the settings given by name in their place (the Reader's and Loader's
    ``storage_options=``, ``cache_dir=``, ``cache_limit=``)."""
    given = {name: value for name, value in (("storage_options", storage_options), ("cache_dir", cache_dir),
                                             ("cache_limit", cache_limit)) if value is not None}
    return dataclasses.replace(options or RemoteOptions(), **given)
