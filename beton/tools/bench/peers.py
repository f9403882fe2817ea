"""The streaming-dataset libraries teams pick today, as benchmark contenders: Mosaic Streaming and LitData.

Each is used the way its documentation shows, on local files: Mosaic Streaming's ``MDSWriter``, then its
``StreamingDataset`` (subclassed to transform each sample, as its vision datasets do) in a torch ``DataLoader``;
LitData's ``optimize``, then its ``StreamingDataset`` (with ``transform=``) in its ``StreamingDataLoader``.
Both with 2 workers. Both store each JPEG's bytes as they are (a ``bytes`` column / value) and crop them exactly
like the torch DataLoader contender (:class:`~beton.tools.bench.contenders.TorchImages`: simplejpeg, the crop
beton's decoder picks, cv2 resize, flip): torchvision, which their docs use for the transforms, cannot be
installed next to the CPU build of torch, and the same decode and crop keeps the comparison about the loaders.

A builder returns the loader with its conversion time (:class:`~beton.tools.bench.contenders.Converted`:
writing the files, timed apart from importing the package and from the epochs), or a string: the reason it is
skipped (its package is not installed).
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Iterable
from typing import Any

import torch

from beton.tools.bench.contenders import WORKERS, Converted, ImageTask, TorchImages, converted

__all__ = ["mosaic_images", "litdata_images"]


def mosaic_images(jpegs: list[bytes], task: ImageTask, directory: str) -> Converted | str:
    """Mosaic Streaming: an MDS dataset written to ``directory``, read by a StreamingDataset in a DataLoader."""
    try:
        from streaming import MDSWriter, StreamingDataset
    except ImportError as error:
        return f"Mosaic Streaming is not importable ({error}; pip install mosaicml-streaming)"
    crop = TorchImages(jpegs, task, "simplejpeg")

    class CroppedImages(StreamingDataset):  # how streaming.vision's datasets apply their transforms
        def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
            sample = super().__getitem__(index)
            return crop.from_bytes(sample["image"]), sample["label"]

    def write() -> None:
        with MDSWriter(out=directory, columns={"image": "bytes", "label": "int"}) as out:
            for index, data in enumerate(jpegs):
                out.write({"image": data, "label": index % 1000})

    def load() -> Iterable:
        dataset = CroppedImages(local=directory, shuffle=task.train, batch_size=task.batch_size)
        return torch.utils.data.DataLoader(dataset, batch_size=task.batch_size, num_workers=WORKERS,
                                           persistent_workers=True)

    return converted(write, load)


class _LitDataSample:
    """optimize's ``fn``: one input index to one sample."""

    def __init__(self, jpegs: list[bytes]) -> None:
        self.jpegs = jpegs

    def __call__(self, index: int) -> dict[str, Any]:
        return {"image": self.jpegs[index], "label": index % 1000}


def litdata_images(jpegs: list[bytes], task: ImageTask, directory: str) -> Converted | str:
    """LitData: chunks written to ``directory`` by ``optimize``, read by a StreamingDataset in a
    StreamingDataLoader."""
    # optimize asks PyPI for a newer litdata first (up to 30 s): not part of converting the images.
    os.environ.setdefault("LITDATA_DISABLE_VERSION_CHECK", "1")
    try:
        import litdata
    except ImportError as error:
        return f"LitData is not importable ({error}; pip install litdata)"
    # optimize sets the process-wide multiprocessing start method: put it back after, so that the contenders
    # measured next start their workers as they would without LitData. Its default, spawn, re-imports the
    # caller's main module in each worker, which fails unless that module guards its code with
    # `if __name__ == "__main__"`; fork, the torch DataLoader's own default here, works from anywhere.
    def write() -> None:
        start_method = multiprocessing.get_start_method(allow_none=True)
        try:
            litdata.optimize(fn=_LitDataSample(jpegs), inputs=list(range(len(jpegs))), output_dir=directory,
                             num_workers=WORKERS, chunk_bytes="64MB", start_method="fork", verbose=False)
        finally:
            multiprocessing.set_start_method(start_method, force=True)

    crop = TorchImages(jpegs, task, "simplejpeg")

    def load() -> Iterable:
        dataset = litdata.StreamingDataset(
            directory, shuffle=task.train, transform=lambda sample: (crop.from_bytes(sample["image"]), sample["label"]))
        return litdata.StreamingDataLoader(dataset, batch_size=task.batch_size, num_workers=WORKERS,
                                           persistent_workers=True)

    return converted(write, load)
