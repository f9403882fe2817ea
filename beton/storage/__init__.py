"""Storage: the bytes of a ``.beton`` file and the code that writes, reads and verifies them.

:mod:`~beton.storage.format` is the layout, :mod:`~beton.storage.writer` (with ``encode`` and
``file_builder``) writes a file atomically, :mod:`~beton.storage.reader` opens and validates one (beton's own
format or FFCV's, :mod:`~beton.storage.ffcv_format`), :mod:`~beton.storage.verify` checks every page.
:mod:`~beton.storage.page_source` gives the memory layers a file's pages, local or remote
(:mod:`~beton.storage.remote`: URLs through fsspec, checked pages, a page cache on disk).

One file only: a dataset in several files is :mod:`beton.dataset`, the layer above.
"""

from beton.storage.reader import Reader
from beton.storage.remote import RemoteOptions
from beton.storage.verify import VerifyReport, verify
from beton.storage.writer import DatasetWriter, shard_range

__all__ = ["DatasetWriter", "Reader", "RemoteOptions", "verify", "VerifyReport", "shard_range"]
