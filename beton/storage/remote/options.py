"""What a user sets for remote files (one :class:`RemoteOptions`, passed as ``remote=`` to everything that can
open a URL), and how a URL is told from a local path."""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from typing import Any

__all__ = ["RemoteOptions", "is_url", "remote_or_default", "REDIRECT_POLICIES"]

#: What ``RemoteOptions.redirects`` may be.
REDIRECT_POLICIES = ("same-origin", "any", "none")

# "scheme://..." or fsspec's chained "cache::scheme://...". A Windows drive ("C:\\") has no "//" after the colon.
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*(://|::)")


def is_url(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` names a file through fsspec (a URL) rather than the local file system. Path objects are
    always local."""
    return isinstance(path, str) and _URL.match(path) is not None


def is_http(url: str) -> bool:
    """Whether ``url`` is an HTTP(S) URL: a store that cannot be listed, and whose URLs may carry a query."""
    return url.lower().startswith(("http://", "https://"))


@dataclasses.dataclass(frozen=True)
class RemoteOptions:
    """How a remote file is read: ``Loader``, ``Reader``, ``verify``, ``index``, ``merge``, ``dataset_manifest``,
    ``read_manifest`` and ``read_head`` take one as ``remote=`` and pass it down unchanged. Local paths ignore it
    (a dataset may mix local and remote files, and one script may read a local copy or a bucket).

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
        redirects: which HTTP(S) redirects are followed (at most 5 for one request): ``"same-origin"`` (the
            default) only to the same scheme, host and port as the URL opened; ``"any"`` to any http(s) URL
            (``Authorization`` and ``Cookie`` headers stay behind); ``"none"``: none. A redirect outside the policy
            is a :class:`~beton.errors.StorageError` naming both URLs. Other stores redirect inside their own
            client (botocore follows S3's region redirects).
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
    redirects: str = "same-origin"

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
        if self.redirects not in REDIRECT_POLICIES:
            raise ValueError(f"redirects must be one of {', '.join(map(repr, REDIRECT_POLICIES))}, got "
                             f"{self.redirects!r}")


def remote_or_default(remote: RemoteOptions | None) -> RemoteOptions:
    """The ``remote=`` an entry point was given, or the defaults for None; anything else is a TypeError naming the
    one spelling (checked where the argument arrives, so a slip is named even for a local path, which ignores
    it)."""
    if remote is None:
        return RemoteOptions()
    if not isinstance(remote, RemoteOptions):
        raise TypeError(f"remote= takes a beton.RemoteOptions (fsspec's settings go in RemoteOptions("
                        f"storage_options={{...}})), got {type(remote).__name__}")
    return remote
