"""Storage: the bytes of a ``.beton`` file and the code that writes, reads and verifies them.

:mod:`~beton.storage.format` is the layout, :mod:`~beton.storage.writer` (with ``encode`` and
``file_builder``) writes a file atomically, :mod:`~beton.storage.reader` opens and validates one (beton's own
format or FFCV's, :mod:`~beton.storage.ffcv_format`), :mod:`~beton.storage.verify` checks every page.
"""

from beton.storage.reader import Reader
from beton.storage.verify import VerifyReport, verify
from beton.storage.writer import DatasetWriter

__all__ = ["DatasetWriter", "Reader", "verify", "VerifyReport"]
