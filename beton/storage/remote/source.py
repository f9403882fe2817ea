"""The process cache's page source for a remote file (the remote counterpart of
:class:`~beton.storage.page_source.LocalFile`)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from beton.errors import LoaderError
from beton.storage.remote.file import RemoteFile
from beton.storage.remote.pages import RemotePages, expected_reads

__all__ = ["RemotePageSource"]


class RemotePageSource:
    """Reads heap bytes of a validated remote file from checked pages.

    ``check()`` (per batch) costs nothing: every page is checked against its CRC32 when it arrives, so bytes of
    a changed file cannot pass unnoticed. ``check_path()`` (per epoch) asks the storage for the object's size
    and version markers (ETag, version id) and raises if they changed since opening. ``will_read`` starts
    fetching the pages an epoch will read, several requests at once.
    """

    def __init__(self, remote: RemoteFile) -> None:
        if remote.pages is None:
            raise ValueError("the remote file's pages are known only once the Reader has validated it")
        self._remote = remote
        self._pages: RemotePages = remote.pages
        self.description = remote.url
        self.size = remote.size
        self._closed = False

    def read_into(self, offset: int, out: np.ndarray, what: str) -> None:
        pages = self._pages
        end = offset + len(out)
        if offset < pages.heap_offset or end > pages.heap_offset + pages.heap_size:
            raise ValueError(f"{what}: bytes {offset}..{end} are not in the heap of {self.description!r}")
        position = offset
        while position < end:
            page = (position - pages.heap_offset) // pages.page_size
            low, high = pages.bounds(page)
            piece = min(high, end) - position
            within = position - low
            out[position - offset : position - offset + piece] = pages.page(page)[within : within + piece]
            position += piece

    def will_read(self, batch_pages: Sequence[np.ndarray], budget_pages: int) -> None:
        """The pages each batch of the epoch needs, and the page budget of the cache that reads them."""
        self.fetch_ahead(expected_reads(batch_pages, budget_pages))

    def fetch_ahead(self, pages: np.ndarray) -> None:
        """Fetch ``pages`` ahead, in this order: for a caller that worked out the reads itself (several files read
        as one, whose cache budget they share: :class:`~beton.dataset.union.ShardedPages`)."""
        self._pages.will_read(pages)

    def check(self) -> None:
        if self._closed:
            raise LoaderError(f"{self.description}: the Loader was closed")

    def will_serve(self, samples: np.ndarray) -> None:
        pass  # one file, checked when it opened

    def sample_file(self, sample: int) -> tuple[str, int]:
        return self.description, sample

    def check_path(self) -> None:
        self.check()
        self._remote.check_identity()

    def close(self) -> None:
        """Stop reading ahead (the Reader, which owns the remote file, can still read pages one by one)."""
        self._closed = True
        self._pages.close()
