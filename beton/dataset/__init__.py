"""A dataset in several files (docs/shards.md), above :mod:`beton.storage` (one file).

:mod:`~beton.dataset.manifest` (the shards in order, their global sample ranges, the manifest file),
:mod:`~beton.dataset.shards` (files, globs, lists and manifest files to one manifest; ``beton index``),
:mod:`~beton.dataset.union` (what a Loader reads: one file's Reader, or several files as one
:class:`~beton.dataset.union.ShardedDataset`), :mod:`~beton.dataset.merge` (``beton merge``).
"""

from beton.dataset.manifest import Manifest, read_manifest
from beton.dataset.merge import MergeReport, merge
from beton.dataset.shards import dataset_manifest, index
from beton.dataset.union import OpenedDataset, ShardedDataset, open_dataset

__all__ = ["Manifest", "read_manifest", "dataset_manifest", "index", "merge", "MergeReport", "OpenedDataset",
           "ShardedDataset", "open_dataset"]
