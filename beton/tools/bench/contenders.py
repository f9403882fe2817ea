"""The loaders compared by the benchmark suite. Each builder returns an iterable of batches (one pass = one
epoch, the second element of a batch being its labels), or that iterable :class:`Converted` (with the seconds
its files took to write, timed apart from the epochs), or a string: the reason it is skipped."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

import cv2
import numpy as np
import simplejpeg
import torch

from beton.codecs.jpeg_restarts import with_restart_markers
from beton.loader import Loader
from beton.order import OrderOption
from beton.storage import DatasetWriter
from beton.tools.bench.data import ArrayDataset, DecodedJpegDataset, JpegDataset
from beton.fields import IntField, NDArrayField, RGBImageField
from beton.decoders import CenterCropRGBImageDecoder, IntDecoder, RandomResizedCropRGBImageDecoder
from beton.decoders.rgb_image import resize_into, single_threaded_opencv
from beton.pipeline.operation import Scratch
from beton.random import operation_key
from beton.transforms import RandomHorizontalFlip, ToTensor, ToTorchImage

__all__ = ["Converted", "converted", "ImageTask", "TorchImages", "beton_images", "torch_images", "ffcv_images",
           "dali_images", "webdataset_images",
           "DecodeLimit", "beton_raw", "torch_raw", "ffcv_raw"]

WORKERS = 2


class Converted(NamedTuple):
    """A contender's loader, and the seconds its conversion took: writing its files from the images."""

    loader: Iterable
    seconds: float


def converted(write: Callable[[], object], load: Callable[[], Iterable]) -> Converted:
    """Time ``write()``, the conversion, then build the loader with ``load()`` (not timed)."""
    start = time.perf_counter()
    write()
    seconds = time.perf_counter() - start
    return Converted(load(), seconds)


class ImageTask:
    """What to do with each image: RandomResizedCrop (train) or CenterCrop (validation) to ``size``.

    ``decoder`` is beton's crop decoder for the task; every contender crops where it does (:meth:`crop`).
    """

    def __init__(self, kind: str, size: int, batch_size: int) -> None:
        if kind not in ("rrc", "center"):
            raise ValueError(f"kind must be 'rrc' or 'center', got {kind!r}")
        self.kind, self.size, self.batch_size = kind, size, batch_size
        self.decoder = RandomResizedCropRGBImageDecoder((size, size)) if self.train \
            else CenterCropRGBImageDecoder((size, size), ratio=224 / 256)

    @property
    def train(self) -> bool:
        return self.kind == "rrc"

    def crop(self, key: np.uint64, sample: int, height: int, width: int) -> tuple[int, int, int, int]:
        return self.decoder.crop(key, sample, height, width)


def beton_images(path: str, task: ImageTask, os_cache: bool = True,
                 order: OrderOption = OrderOption.RANDOM, **options: Any) -> Loader:
    image = [task.decoder, RandomHorizontalFlip(), ToTensor(), ToTorchImage()] if task.train \
        else [task.decoder, ToTensor(), ToTorchImage()]
    return Loader(path, batch_size=task.batch_size, num_workers=WORKERS, order=order, seed=0, os_cache=os_cache,
                  pipelines={"image": image, "label": [IntDecoder(), ToTensor()]}, **options)


def write_beton_images(jpegs: list[bytes], path: str, **options: Any) -> str:
    DatasetWriter(path, {"image": RGBImageField(write_mode="jpg"), "label": IntField()}, num_workers=WORKERS,
                  progress=False, **options).from_indexed_dataset(JpegDataset(jpegs))
    return path


class TorchImages(torch.utils.data.Dataset):
    """What a careful torch user writes: decode (simplejpeg, PIL, or cv2 for PNG), crop, resize, flip."""

    def __init__(self, jpegs: list[bytes], task: ImageTask, decoder: str) -> None:
        self.jpegs, self.task, self.decoder = jpegs, task, decoder

    def __len__(self) -> int:
        return len(self.jpegs)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        if self.decoder == "pil":
            return self._pil(index, np.uint64(np.random.randint(0, 2**62))), index % 1000
        return self.from_bytes(self.jpegs[index]), index % 1000

    def from_bytes(self, data: bytes) -> torch.Tensor:
        cv2.setNumThreads(1)
        key = np.uint64(np.random.randint(0, 2**62))
        if self.decoder == "png":
            image = cv2.cvtColor(cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)
        else:
            image = simplejpeg.decode_jpeg(data)
        top, left, height, width = self.task.crop(key, 0, image.shape[0], image.shape[1])
        crop = cv2.resize(image[top : top + height, left : left + width], (self.task.size, self.task.size),
                          interpolation=cv2.INTER_LINEAR)
        if self.task.train and np.random.rand() < 0.5:
            crop = crop[:, ::-1]
        return torch.from_numpy(np.ascontiguousarray(crop)).permute(2, 0, 1)

    def _pil(self, index: int, key: np.uint64) -> torch.Tensor:
        import io

        from PIL import Image

        image = Image.open(io.BytesIO(self.jpegs[index])).convert("RGB")
        top, left, height, width = self.task.crop(key, index, image.height, image.width)
        crop = image.resize((self.task.size, self.task.size), Image.BILINEAR,
                            box=(left, top, left + width, top + height))
        if self.task.train and np.random.rand() < 0.5:
            crop = crop.transpose(Image.FLIP_LEFT_RIGHT)
        return torch.from_numpy(np.asarray(crop).copy()).permute(2, 0, 1)


def torch_images(jpegs: list[bytes], task: ImageTask, decoder: str = "simplejpeg") -> Iterable | str:
    """A torch DataLoader over encoded images; ``decoder``: "simplejpeg", "pil" (JPEG) or "png" (cv2)."""
    if decoder == "pil" and importlib.util.find_spec("PIL") is None:
        return "Pillow is not installed"
    return torch.utils.data.DataLoader(TorchImages(jpegs, task, decoder), batch_size=task.batch_size,
                                       shuffle=task.train, num_workers=WORKERS, persistent_workers=True)


def ffcv_images(jpegs: list[bytes], directory: str, task: ImageTask, name: str) -> Converted | str:
    try:
        from ffcv.fields import IntField as FFCVInt, RGBImageField as FFCVImage
        from ffcv.fields.decoders import IntDecoder as FFCVIntDecoder
        from ffcv.fields.rgb_image import CenterCropRGBImageDecoder as FFCVCenter
        from ffcv.fields.rgb_image import RandomResizedCropRGBImageDecoder as FFCVRRC
        from ffcv.loader import Loader as FFCVLoader, OrderOption as FFCVOrder
        from ffcv.transforms import RandomHorizontalFlip as FFCVFlip, ToTensor as FFCVToTensor
        from ffcv.transforms import ToTorchImage as FFCVToTorchImage
        from ffcv.writer import DatasetWriter as FFCVWriter
    except ImportError as error:
        return f"FFCV is not importable ({error})"
    path = os.path.join(directory, f"ffcv_{name}_{task.kind}.beton")
    size = (task.size, task.size)
    image = [FFCVRRC(size), FFCVFlip()] if task.train else [FFCVCenter(size, ratio=224 / 256)]
    return converted(
        lambda: FFCVWriter(path, {"image": FFCVImage(write_mode="jpg", jpeg_quality=90), "label": FFCVInt()},
                           num_workers=WORKERS).from_indexed_dataset(DecodedJpegDataset(jpegs)),
        lambda: FFCVLoader(path, batch_size=task.batch_size, num_workers=WORKERS,
                           order=FFCVOrder.RANDOM if task.train else FFCVOrder.SEQUENTIAL, os_cache=True,
                           pipelines={"image": [*image, FFCVToTensor(), FFCVToTorchImage()],
                                      "label": [FFCVIntDecoder(), FFCVToTensor()]}))


def dali_images(jpegs: list[bytes], task: ImageTask) -> Iterable | str:
    """DALI's CPU pipeline (no GPU): decode with a random or center crop, resize, flip; 2 threads."""
    try:
        from nvidia.dali import fn, pipeline_def, types
        from nvidia.dali.plugin.pytorch import DALIGenericIterator
    except ImportError:
        return "DALI is not installed (pip install nvidia-dali-cuda120)"
    encoded = [np.frombuffer(data, np.uint8) for data in jpegs]
    labels = [np.array([index % 1000], np.int64) for index in range(len(jpegs))]
    size = task.batch_size

    class Batches:  # one epoch of (images, labels) batches; external_source's cycle="raise" ends the epoch
        def __iter__(self):
            order = np.random.permutation(len(encoded)) if task.train else np.arange(len(encoded))
            for start in range(0, len(order), size):
                chosen = order[start : start + size]
                yield [encoded[i] for i in chosen], [labels[i] for i in chosen]

    @pipeline_def(batch_size=task.batch_size, num_threads=WORKERS, device_id=None, seed=0)
    def pipeline():
        images, label = fn.external_source(source=Batches(), num_outputs=2, batch=True, cycle="raise")
        if task.train:
            images = fn.decoders.image_random_crop(images, device="cpu", output_type=types.RGB)
            images = fn.resize(images, resize_x=task.size, resize_y=task.size)
            images = fn.flip(images, horizontal=fn.random.coin_flip())
        else:
            images = fn.decoders.image(images, device="cpu", output_type=types.RGB)
            images = fn.resize(images, resize_shorter=task.size * 256 // 224)
            images = fn.crop(images, crop=(task.size, task.size))
        return fn.transpose(images, perm=[2, 0, 1]), label

    return _DALIEpochs(pipeline, DALIGenericIterator)


class _DALIEpochs:
    """Feeds the whole list once per epoch in batches (external_source), as a list of (images, labels)."""

    def __init__(self, make_pipeline, iterator_class) -> None:
        self.make_pipeline, self.iterator_class = make_pipeline, iterator_class

    def __iter__(self):
        pipeline = self.make_pipeline()
        pipeline.build()
        for output in self.iterator_class(pipeline, ["image", "label"], auto_reset=False):
            yield output[0]["image"], output[0]["label"]


def webdataset_images(jpegs: list[bytes], task: ImageTask, directory: str,
                      shard_url: Callable[[str], str] | None = None) -> Iterable | str:
    """WebDataset: tar shards of .jpg + .cls, decoded and cropped like the torch contender, 2 workers.
    ``shard_url`` maps each shard's path to the URL it is streamed from (by default the path is read)."""
    try:
        import webdataset as wds
    except ImportError:
        return "WebDataset is not installed (pip install webdataset)"
    os.makedirs(directory, exist_ok=True)
    shards = []
    for shard in range(WORKERS * 2):
        path = os.path.join(directory, f"shard-{shard:03d}.tar")
        with wds.TarWriter(path) as sink:
            for index in range(shard, len(jpegs), WORKERS * 2):
                sink.write({"__key__": f"{index:08d}", "jpg": jpegs[index], "cls": str(index % 1000).encode()})
        shards.append(path)
    crop = TorchImages(jpegs, task, "simplejpeg")

    def decode(sample):
        return crop.from_bytes(sample["jpg"]), int(sample["cls"])

    if shard_url is not None:
        shards = [shard_url(path) for path in shards]
    dataset = wds.WebDataset(shards, shardshuffle=len(shards) if task.train else False, empty_check=False)
    dataset = dataset.map(decode)
    if task.train:
        dataset = dataset.shuffle(256)
    # No persistent workers: an iterable dataset's workers would not see the next epoch start (it hangs).
    return wds.WebLoader(dataset.batched(task.batch_size), batch_size=None, num_workers=WORKERS)


class DecodeLimit:
    """An upper bound for a loader of these JPEGs: the decode step of beton's crop decoder alone, in 2 threads.

    The JPEGs are decoded as beton's field stores them by default (with restart markers added,
    :func:`~beton.codecs.jpeg_restarts.with_restart_markers`), or as given (``restart_markers=False``). Each
    image is cropped where the decoder crops it (its own :meth:`crop`) and decoded by the decoder's own
    :meth:`~beton.decoders.rgb_image.RandomResizedCropRGBImageDecoder.decoded_crop`: the DCT scale it picks,
    its upsampling setting, into per-thread scratch buffers; no flip, no batches, no file. ``rows``:

    * ``"whole"``: every row of the image at that scale (``decode_whole=True``), what any loader decoding
      whole JPEGs must do;
    * ``"crop"``: only the part of the JPEG the crop needs, as the decoder does by default: its restart segments,
      or without restart markers the MCU rows down to the crop's bottom. With restart markers, the ceiling of
      beton's own approach to decoding (beton can pass the whole-image limit, never this one).

    With ``resize``, each decoded crop is also resized into one output image as the decoder resizes it
    (:func:`~beton.decoders.rgb_image.resize_into`): the least work the task itself takes, so that beton's share
    of it is what its loading costs beyond that work.

    Image sizes are read once, up front, as the loader reads them from its data table.
    """

    def __init__(self, jpegs: list[bytes], task: ImageTask, rows: str, seed: int = 0, resize: bool = False,
                 restart_markers: bool = True) -> None:
        if rows not in ("whole", "crop"):
            raise ValueError(f"rows must be 'whole' or 'crop', got {rows!r}")
        self.decoder = dataclasses.replace(task.decoder, decode_whole=rows == "whole")
        self.resize = resize
        self.payloads = [np.frombuffer(with_restart_markers(data) if restart_markers else data, np.uint8)
                         for data in jpegs]
        self.shapes = [tuple(simplejpeg.decode_jpeg_header(data)[:2]) for data in jpegs]
        self.out_shape = (task.size, task.size, 3)
        self.seed, self.epoch = seed, 0

    def __iter__(self):
        key = operation_key(self.seed, self.epoch, 0, 0)  # the key beton's loader gives its image decoder
        self.epoch += 1

        failures: list[BaseException] = []

        def decode(indices: range) -> None:
            scratch, out = Scratch(), np.empty(self.out_shape, np.uint8)
            single_threaded_opencv()  # as in the loader's workers
            try:
                for index in indices:
                    height, width = self.shapes[index]
                    crop = self.decoder.crop(key, index, height, width)
                    image, scaled = self.decoder.decoded_crop(self.payloads[index], (height, width, 3), crop,
                                                              self.out_shape, scratch)
                    if self.resize:
                        resize_into(image, out, scaled, scratch=scratch)
            except BaseException as error:  # a limit that skipped images would report a rate it never reached
                failures.append(error)

        count = len(self.payloads)
        threads = [threading.Thread(target=decode, args=(range(k, count, WORKERS),)) for k in range(WORKERS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if failures:
            raise failures[0]
        return iter([(None, range(count))])


# ---- raw arrays -----------------------------------------------------------------------------------------

def write_beton_raw(images: np.ndarray, labels: np.ndarray, path: str) -> str:
    DatasetWriter(path, {"image": NDArrayField(images.dtype, images.shape[1:]), "label": IntField()},
                  num_workers=WORKERS, progress=False).from_indexed_dataset(ArrayDataset(images, labels))
    return path


def beton_raw(path: str, batch_size: int, **options: Any) -> Loader:
    return Loader(path, batch_size=batch_size, num_workers=WORKERS, order=OrderOption.RANDOM, seed=0, **options)


class _MemmapImages(torch.utils.data.Dataset):
    def __init__(self, image_path: str, labels: np.ndarray) -> None:
        self.image_path, self.labels, self.images = image_path, labels, None

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        if self.images is None:  # opened in each worker process
            self.images = np.load(self.image_path, mmap_mode="r")
        return torch.from_numpy(np.array(self.images[index])), int(self.labels[index])


def torch_raw(images: np.ndarray, labels: np.ndarray, directory: str, batch_size: int) -> Iterable:
    path = os.path.join(directory, "raw_images.npy")
    np.save(path, images)
    return torch.utils.data.DataLoader(_MemmapImages(path, labels), batch_size=batch_size, shuffle=True,
                                       num_workers=WORKERS, persistent_workers=True)


def ffcv_raw(images: np.ndarray, labels: np.ndarray, directory: str, batch_size: int) -> Iterable | str:
    try:
        from ffcv.fields import IntField as FFCVInt, NDArrayField as FFCVArray
        from ffcv.fields.decoders import IntDecoder as FFCVIntDecoder, NDArrayDecoder as FFCVArrayDecoder
        from ffcv.loader import Loader as FFCVLoader, OrderOption as FFCVOrder
        from ffcv.transforms import ToTensor as FFCVToTensor
        from ffcv.writer import DatasetWriter as FFCVWriter
    except ImportError as error:
        return f"FFCV is not importable ({error})"
    path = os.path.join(directory, "ffcv_raw.beton")
    FFCVWriter(path, {"image": FFCVArray(images.dtype, images.shape[1:]), "label": FFCVInt()},
               num_workers=WORKERS).from_indexed_dataset(ArrayDataset(images, labels))
    return FFCVLoader(path, batch_size=batch_size, num_workers=WORKERS, order=FFCVOrder.RANDOM, os_cache=True,
                      pipelines={"image": [FFCVArrayDecoder(), FFCVToTensor()],
                                 "label": [FFCVIntDecoder(), FFCVToTensor()]})
