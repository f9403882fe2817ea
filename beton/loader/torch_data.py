"""A Loader as a torch ``IterableDataset``, for code that needs a ``torch.utils.data.DataLoader`` around it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch.utils.data

from beton.errors import LoaderError
from beton.loader.loader import Loader

__all__ = ["BatchDataset"]


class BatchDataset(torch.utils.data.IterableDataset):
    """Each item is one whole batch of ``loader``; wrap it as ``DataLoader(BatchDataset(loader), batch_size=None)``.

    beton batches, shuffles, shards and runs its worker threads itself, so the DataLoader must neither batch
    (``batch_size=None``) nor start worker processes (``num_workers=0``): each worker process would run the
    whole epoch again, so it raises :class:`~beton.errors.LoaderError` there instead of repeating data.
    """

    def __init__(self, loader: Loader) -> None:
        self.loader = loader

    def __iter__(self) -> Iterator[Any]:
        if torch.utils.data.get_worker_info() is not None:
            raise LoaderError("BatchDataset runs in a DataLoader worker process, where every worker would load "
                              "the whole epoch: use DataLoader(dataset, batch_size=None, num_workers=0)")
        return iter(self.loader)

    def __len__(self) -> int:
        return len(self.loader)
