"""``beton show``: a PNG grid of a file's images, captioned with their labels, to look at before training.

Two ways to look:

* **As stored** (no pipelines): samples decoded at full size by a :class:`~beton.Reader`, each fitted into a
  square cell; ``indices`` chooses them, else the first ``count`` (or ``count`` drawn with ``seed`` when
  ``random``).
* **As the loader gives them** (``pipelines=``, the ones training uses): the first batch of epoch ``epoch`` of a
  :class:`~beton.Loader` with that ``seed`` and ``order``, shown at the size the pipeline makes. The same seed,
  epoch and pipelines give the same picture, and the same batch training would see. Float images are mapped
  back to pixels: through the pipeline's ``NormalizeImage`` when it has one, else 0..1 is taken as the range
  (values outside it are scaled by the batch's minimum and maximum).

Captions name the sample and its label: the class name when the file's metadata has them
(``metadata["classes"][label field]``, as ``beton convert`` stores), else the value. OpenCV draws them with its
built-in font, which has ASCII only: other characters are shown without accents where possible, else as ``?``.
"""

from __future__ import annotations

import os
import unicodedata
from collections.abc import Mapping, Sequence
from typing import Any

import cv2
import numpy as np

from beton.decoders import IntDecoder
from beton.errors import BetonError, PipelineError
from beton.fields import IntField, RGBImageField
from beton.loader import Loader
from beton.order import OrderOption
from beton.storage.reader import Reader
from beton.transforms import NormalizeImage

__all__ = ["grid", "ORDERS", "fitted", "caption"]

ORDERS = {"sequential": OrderOption.SEQUENTIAL, "random": OrderOption.RANDOM,
          "quasi_random": OrderOption.QUASI_RANDOM}
_CAPTION_HEIGHT = 14
_GAP = 2
_BACKGROUND = 32


def grid(path: str | os.PathLike[str], output: str | os.PathLike[str] | None = None, *, count: int = 32,
         columns: int = 8, cell: int = 160, image_field: str | None = None, label_field: str | None = None,
         indices: Sequence[int] | None = None, random: bool = False, pipelines: Mapping[str, Any] | None = None,
         seed: int = 0, epoch: int = 0, order: str = "random", num_workers: int = 1) -> np.ndarray:
    """The grid (HxWx3 uint8 RGB) of ``count`` samples of ``path``, also written as a PNG to ``output`` if given.

    Args:
        count, columns: how many images, how many per row.
        cell: side of each cell, stored images only (loader batches are shown at their size).
        image_field, label_field: the fields to show (default: the only image field; the integer field that
            has class names in the metadata, else the first integer field; none if there is none).
        indices, random: stored images only: which samples (default: the first ``count``; ``random``: drawn
            with ``seed``).
        pipelines: the Loader's pipelines, to show its first batch of ``epoch`` (see the module docstring);
            ``seed``, ``order`` ("sequential", "random", "quasi_random") and ``indices`` go to the Loader.
        num_workers: the Loader's threads (the picture does not depend on them).
    """
    if count < 1 or columns < 1 or cell < 8:
        raise ValueError(f"count and columns must be positive and cell at least 8, got {count}, {columns}, {cell}")
    with Reader(path) as reader:
        image_name = _image_field(reader, image_field)
        label_name = _label_field(reader, label_field)
        classes = reader.metadata.get("classes", {}).get(label_name) if label_name else None
        field_names = list(reader.fields)
        if pipelines is None:
            chosen = _chosen(reader.num_samples, count, indices, random, seed)
            images = [fitted(_displayable(_stored_image(reader, image_name, i)), cell) for i in chosen]
            labels = [_stored_label(reader, label_name, i) for i in chosen] if label_name else [None] * len(chosen)
    if pipelines is not None:
        chosen, images, labels = _loader_batch(path, field_names, pipelines, image_name, label_name, count,
                                               indices, seed, epoch, order, num_workers)
    captions = [caption(index, label, classes) for index, label in zip(chosen, labels)]
    picture = _tile(images, captions, columns)
    if output is not None:
        if not cv2.imwrite(os.fspath(output), cv2.cvtColor(picture, cv2.COLOR_RGB2BGR)):
            raise OSError(f"could not write {os.fspath(output)!r} (a .png name in an existing folder?)")
    return picture


def _image_field(reader: Reader, name: str | None) -> str:
    images = [field for field, kind in reader.fields.items() if isinstance(kind, RGBImageField)]
    if name is not None:
        if name not in reader.fields:
            raise BetonError(f"{reader.path}: no field {name!r}; fields are {list(reader.fields)}")
        return name
    if len(images) != 1:
        raise BetonError(f"{reader.path}: name the image field to show (image_field=..., --field); "
                         f"image fields: {images or 'none'}")
    return images[0]


def _label_field(reader: Reader, name: str | None) -> str | None:
    if name is not None:
        if name not in reader.fields:
            raise BetonError(f"{reader.path}: no field {name!r}; fields are {list(reader.fields)}")
        return name
    integers = [field for field, kind in reader.fields.items() if isinstance(kind, IntField)]
    named = [field for field in integers if field in reader.metadata.get("classes", {})]
    return (named or integers or [None])[0]


def _chosen(num_samples: int, count: int, indices: Sequence[int] | None, random: bool, seed: int) -> list[int]:
    if indices is not None:
        chosen = [int(index) for index in indices]
        bad = [index for index in chosen if not 0 <= index < num_samples]
        if bad:
            raise IndexError(f"sample index {bad[0]} out of range for {num_samples} samples")
        return chosen[:count]
    if random:
        picked = np.random.default_rng(seed).choice(num_samples, min(count, num_samples), replace=False)
        return sorted(int(index) for index in picked)
    return list(range(min(count, num_samples)))


def _stored_image(reader: Reader, name: str, index: int) -> np.ndarray:
    field = reader.fields[name]
    return np.asarray(field.to_python(reader.data_table[name][index], reader.payload(index, name)))


def _stored_label(reader: Reader, name: str, index: int) -> Any:
    return reader.fields[name].to_python(reader.data_table[name][index], reader.payload(index, name))


def _loader_batch(path: Any, field_names: list[str], pipelines: Mapping[str, Any], image_name: str,
                  label_name: str | None, count: int, indices: Sequence[int] | None, seed: int, epoch: int,
                  order: str, num_workers: int) -> tuple[list[int], list[np.ndarray], list[Any]]:
    if order not in ORDERS:
        raise ValueError(f"order must be one of {tuple(ORDERS)}, got {order!r}")
    pipelines = {**{name: None for name in field_names if name not in (image_name, label_name)},
                 **({label_name: [IntDecoder()]} if label_name else {}), **pipelines}  # decode only what is shown
    with Loader(path, batch_size=count, num_workers=num_workers, order=ORDERS[order], seed=seed, indices=indices,
                pipelines=pipelines) as loader:
        names = list(loader.plan.output_names)
        if image_name not in names:
            raise PipelineError(f"the pipelines drop the image field {image_name!r}; outputs: {names}")
        loader.set_epoch(epoch)
        samples = [int(i) for i in loader.epoch_batches(epoch)[0]]
        batch = next(iter(loader))
        images = _batch_images(batch[names.index(image_name)], _normalization(pipelines.get(image_name)))
        labels = _as_list(batch[names.index(label_name)]) if label_name in names else [None] * len(samples)
    return samples, list(images), labels


def _as_list(values: Any) -> list[Any]:
    values = values.numpy() if hasattr(values, "numpy") else np.asarray(values)
    return [value.item() if np.ndim(value) == 0 else value for value in values.reshape(len(values), -1)[:, 0]]


def _normalization(operations: Sequence[Any] | None) -> tuple[np.ndarray, np.ndarray] | None:
    """(mean, std) in pixel units of the pipeline's NormalizeImage, to map its floats back to pixels."""
    for operation in operations or ():
        if isinstance(operation, NormalizeImage):
            return np.asarray(operation.mean, np.float64), np.asarray(operation.std, np.float64)
    return None


def _batch_images(batch: Any, normalization: tuple[np.ndarray, np.ndarray] | None) -> np.ndarray:
    """A batch of images (numpy or torch, NHWC or NCHW, any dtype) as NHWC uint8 RGB."""
    array = batch.detach().cpu().numpy() if hasattr(batch, "detach") else np.asarray(batch)
    if array.ndim == 3:
        array = array[..., None]
    if array.ndim != 4:
        raise PipelineError(f"the image output has shape {array.shape}; a batch of images has 3 or 4 dimensions")
    if array.shape[-1] not in (1, 3, 4) and array.shape[1] in (1, 3, 4):
        array = array.transpose(0, 2, 3, 1)  # NCHW
    if array.dtype.kind == "f" and normalization is not None:
        mean, std = normalization
        array = array * std + mean
    elif array.dtype.kind == "f" and array.size and (array.min() < 0 or array.max() > 1):
        low, high = float(array.min()), float(array.max())
        array = (array - low) / (high - low if high > low else 1.0) * 255
    elif array.dtype.kind == "f":
        array = array * 255
    return np.stack([_displayable(image) for image in array])


def _displayable(image: np.ndarray) -> np.ndarray:
    """HxWxC of any depth as HxWx3 uint8 (16 bits scaled down, alpha dropped, grey repeated)."""
    if image.ndim == 2:
        image = image[:, :, None]
    if image.dtype == np.uint16:
        image = (image.astype(np.uint32) + 128) // 257
    elif image.dtype == np.bool_:
        image = image.astype(np.uint8) * 255
    image = np.clip(np.rint(image), 0, 255).astype(np.uint8) if image.dtype != np.uint8 else image
    if image.shape[2] == 1:
        image = np.repeat(image, 3, axis=2)
    return np.ascontiguousarray(image[:, :, :3])


def fitted(image: np.ndarray, cell: int) -> np.ndarray:
    """The image scaled (keeping its aspect) to fit a cell x cell square, centred on the background."""
    height, width = image.shape[:2]
    scale = min(cell / height, cell / width)
    size = (max(1, round(width * scale)), max(1, round(height * scale)))
    resized = cv2.resize(image, size, interpolation=cv2.INTER_AREA if scale < 1 else cv2.INTER_LINEAR)
    canvas = np.full((cell, cell, 3), _BACKGROUND, np.uint8)
    top, left = (cell - size[1]) // 2, (cell - size[0]) // 2
    canvas[top : top + size[1], left : left + size[0]] = resized.reshape(size[1], size[0], 3)
    return canvas


def caption(index: int, label: Any, classes: list[str] | None) -> str:
    """The text under a sample: its index, and its class name when ``classes`` names its integer label."""
    if label is None:
        return f"#{index}"
    if classes is not None and isinstance(label, int) and 0 <= label < len(classes):
        return f"#{index} {classes[label]}"
    return f"#{index} label {label}"


def _ascii(text: str) -> str:
    plain = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    return "".join(character if character.isprintable() else "?" for character in plain) if plain.strip() else \
        "?" * min(len(text), 8)


def _tile(images: Sequence[np.ndarray], captions: Sequence[str], columns: int) -> np.ndarray:
    height = max(image.shape[0] for image in images)
    width = max(image.shape[1] for image in images)
    columns = min(columns, len(images))
    rows = -(-len(images) // columns)
    step_y, step_x = height + _CAPTION_HEIGHT + _GAP, width + _GAP
    picture = np.full((rows * step_y + _GAP, columns * step_x + _GAP, 3), _BACKGROUND, np.uint8)
    for number, (image, caption) in enumerate(zip(images, captions)):
        row, column = divmod(number, columns)
        top, left = _GAP + row * step_y, _GAP + column * step_x
        picture[top : top + image.shape[0], left : left + image.shape[1]] = image
        text = _ascii(caption)
        scale = 0.35
        while text and cv2.getTextSize(text, cv2.FONT_HERSHEY_SIMPLEX, scale, 1)[0][0] > width:
            text = text[:-1]
        cv2.putText(picture, text, (left + 1, top + height + _CAPTION_HEIGHT - 4), cv2.FONT_HERSHEY_SIMPLEX, scale,
                    (235, 235, 235), 1, cv2.LINE_AA)
    return picture
