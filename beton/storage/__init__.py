"""Storage: the bytes of a ``.beton`` file and the code that writes, reads and verifies them.

:mod:`~beton.storage.format` is the layout, :mod:`~beton.storage.writer` (with ``encode`` and
``file_builder``) writes a file atomically, :mod:`~beton.storage.reader` opens and validates one (beton's own
format or FFCV's, :mod:`~beton.storage.ffcv_format`), :mod:`~beton.storage.verify` checks every page.
:mod:`~beton.storage.page_source` gives the memory layers a file's pages, local or remote
(:mod:`~beton.storage.remote`: URLs through fsspec, checked pages, a page cache on disk).

A dataset in several files (docs/shards.md): :mod:`~beton.storage.manifest` (the shards in order, their global
sample ranges, the manifest file), :mod:`~beton.storage.shards` (files, globs, lists and manifest files to one
manifest; ``beton index``), :mod:`~beton.storage.merge` (``beton merge``), :mod:`~beton.storage.dataset` (what a
Loader reads: one file, or several as one :class:`~beton.storage.dataset.ShardedDataset`).
"""

from beton.storage.dataset import ShardedDataset, open_dataset
from beton.storage.manifest import Manifest, read_manifest
from beton.storage.merge import MergeReport, merge
from beton.storage.reader import Reader
from beton.storage.remote import RemoteOptions
from beton.storage.shards import dataset_manifest, index
from beton.storage.verify import VerifyReport, verify
from beton.storage.writer import DatasetWriter, shard_range

__all__ = ["DatasetWriter", "Reader", "RemoteOptions", "verify", "VerifyReport", "shard_range", "Manifest",
           "read_manifest",
           "dataset_manifest", "index", "merge", "MergeReport", "ShardedDataset", "open_dataset"]
