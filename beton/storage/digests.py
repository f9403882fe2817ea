"""Content digests: SHA-256 of every heap page and table, and checking pages as they load.

CRC32 finds damage, not forgery: whoever changes a page can keep its CRC32 by also changing 4 bytes of it. A
beton file therefore also stores a SHA-256 digest of every page and every table (the digest table), and
its header holds the digest of that table (``content_digest``), so the header pins every byte (docs/format.md).

:class:`PageDigests` is what the memory layers hold when the user asked for content checks
(``verify_content=True``): each page's expected digest, and which pages have been checked. A page is checked the
first time it is loaded and trusted afterwards, within that Loader (the layers' per-batch checks of the file's
size and modification time raise if the file changes after that).

Who hashes: the worker that first needs a page, before its batch's payloads are read (so no decoder sees bytes
not checked). Workers needing the same pages share them out, one page at a time (:meth:`PageDigests.check_pages`):
a page is hashed by one thread only, the others hash the next pages meanwhile, then wait for the rest. hashlib
lets go of the GIL while it hashes a buffer larger than 2 KiB, so the workers hash in parallel, and the page
reader of the process cache goes on reading (it does no hashing).
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from beton.errors import CorruptDataError, locate

__all__ = ["digest", "PageDigests"]

def digest(data: Any) -> bytes:
    """SHA-256 of a buffer (bytes or a contiguous uint8 array)."""
    return hashlib.sha256(data).digest()


class PageDigests:
    """The expected digests of a dataset's heap pages (several files as one: pages numbered across them, in file
    order), each checked once, the first time :meth:`check_pages` is asked for it.

    Build it with :meth:`of`. :meth:`check_pages` is called from any thread (the workers); each page is hashed
    by one thread at a time (module docstring).
    """

    def __init__(self, paths: Sequence[str], digests: np.ndarray, first_page: np.ndarray, checked: np.ndarray) -> None:
        """``digests``: ``(pages, DIGEST_SIZE)`` uint8, only read; ``first_page``: where file k's pages start (and
        the last ends); ``checked``: the pages not to check (a new array: it records the pages checked since)."""
        self._paths, self._digests, self._first_page, self._checked = list(paths), digests, first_page, checked
        self._lock = threading.Lock()
        self._hashing: dict[int, threading.Event] = {}  # pages a thread is hashing now, set when it is done

    @classmethod
    def of(cls, reader: Any) -> PageDigests | None:
        """The page digests of an opened Reader that checks content (``reader.verify_content``), none checked yet;
        None when it does not check content. (Several files as one: :func:`beton.dataset.union.page_digests`.)"""
        if not reader.verify_content:
            return None
        return cls([reader.path], reader.page_digests.copy(),  # a copy: the Reader's map is not read after this
                   np.array([0, reader.num_pages], np.int64), np.zeros(reader.num_pages, bool))

    def check_pages(self, pages: Iterable[int], page_bytes: Callable[[int], Any]) -> None:
        """Return once every one of ``pages`` has its stored digest, or raise
        :class:`~beton.errors.CorruptDataError` naming the file and page of the first that does not.
        ``page_bytes(page)``: the whole page's bytes, asked for only of the pages this thread hashes.

        Pages checked before cost nothing. Of the rest, this thread hashes each page that no other thread is
        hashing, one at a time, and waits for those another thread is (a page found not to match is hashed again
        by whoever waited for it, who then raises too).
        """
        pending = [page for page in pages if not self._checked[page]]
        while pending:
            with self._lock:
                pending = [page for page in pending if not self._checked[page]]
                if not pending:
                    return
                page = next((page for page in pending if page not in self._hashing), None)
                if page is None:
                    event = self._hashing[pending[0]]
                else:
                    event = self._hashing[page] = threading.Event()
            if page is None:
                event.wait()
                continue
            try:
                self._check(page, page_bytes(page))
            finally:
                with self._lock:
                    del self._hashing[page]
                event.set()

    def _check(self, page: int, data: Any) -> None:
        if digest(data) != self._digests[page].tobytes():
            file = int(np.searchsorted(self._first_page[1:], page, side="right"))
            local = page - int(self._first_page[file])
            raise locate(CorruptDataError(
                f"content digest of heap page {local} does not match: its bytes are not those the file was written "
                "with (CRC32 checksums can be kept by whoever changes a page; the SHA-256 digest cannot)"),
                path=self._paths[file], page=local)
        self._checked[page] = True
