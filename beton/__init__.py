"""beton: datasets in one paged .beton file, streamed into PyTorch through JIT-compiled pipelines."""

from beton.errors import (
    BetonError,
    CorruptDataError,
    DatasetError,
    DecodeError,
    EncodeError,
    FieldError,
    FormatError,
    LoaderError,
    PipelineError,
    ResumeError,
    StorageError,
    WriterError,
)
from beton.loader import Loader
from beton.order import OrderOption
from beton.storage.reader import Reader
from beton.storage.remote import RemoteOptions
from beton.storage.verify import VerifyReport, verify
from beton.storage.writer import DatasetWriter

from beton._version import __version__

# The Python faces of ``beton convert`` and ``beton show``: ``beton.convert.imagefolder(...)`` works after
# ``import beton`` (they are modules, so they are not in __all__).
from beton import convert, show  # noqa: E402  (after the names they use)

# FFCV's contracts (fields, operations, orders written to them) adapted where they enter: importing the package
# registers its adapters (see beton.ffcv), so every program that imports beton has them.
from beton import ffcv  # noqa: E402,F401

__all__ = [
    "DatasetWriter",
    "Loader",
    "OrderOption",
    "Reader",
    "RemoteOptions",
    "verify",
    "VerifyReport",
    "BetonError",
    "FormatError",
    "CorruptDataError",
    "FieldError",
    "EncodeError",
    "DecodeError",
    "DatasetError",
    "WriterError",
    "PipelineError",
    "LoaderError",
    "ResumeError",
    "StorageError",
]
