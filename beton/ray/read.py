"""Reading a ``.beton`` file, a glob or a manifest into a ``ray.data.Dataset``, for offline inference and Ray Train.

:class:`BetonDatasource` names its shards on the driver (:func:`~beton.dataset.shards.dataset_manifest`: headers
and field tables only) and cuts each shard into contiguous sample ranges, about ``parallelism`` of them in all,
never across two shards; each read task opens its shard (checked against the manifest: header SHA-256, count,
fields) and reads its range, whose payloads lie in consecutive pages. :func:`read_beton` gives the rows in the
dataset's order (``preserve_order=False`` lets Ray hand blocks on as they are read, which keeps every core busy
when ranges take unequal times), one dict per sample of ``{field name: value}``:

* integers and floats as numpy scalars, arrays (``NDArrayField``, ``RaggedArrayField``, ``TorchTensorField`` as
  numpy; bfloat16 widened to float32, exactly) as numpy arrays, bytes as bytes;
* a ``JSONField`` as its JSON text (``json.loads`` it; ``write_dataset(..., json_text=True)`` writes it back):
  Arrow would merge dicts of different keys into one struct, adding keys that were never stored;
* an ``RGBImageField``, with ``images="decoded"`` (default), as an HxWxC array; with ``images="jpeg"`` as the
  stored JPEG file's bytes, for a decoder of the user's (a GPU's); an image stored raw or lossless then fails
  with a DecodeError naming the sample, since it has no JPEG bytes.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import ray.data
from ray.data.block import Block, BlockAccessor, BlockMetadata
from ray.data.datasource import Datasource, ReadTask

from beton.codecs.image_record import JPEG_MODES, MODE_NAMES
from beton.codecs.jpeg_scans import whole_jpeg
from beton.dataset.manifest import Manifest
from beton.dataset.shards import Source, dataset_manifest
from beton.errors import DecodeError, error_context
from beton.fields import JSONField, RGBImageField
from beton.fields.base import Field
from beton.storage.reader import Reader
from beton.storage.remote import RemoteOptions
from beton.storage.writer import shard_range

__all__ = ["BetonDatasource", "read_beton", "IMAGE_OUTPUTS"]

#: What an RGBImageField becomes: the decoded pixels, or the stored JPEG's bytes.
IMAGE_OUTPUTS = ("decoded", "jpeg")
DEFAULT_ROWS_PER_BLOCK = 256


class BetonDatasource(Datasource):
    """A Ray Data datasource over a beton dataset (module docstring).

    Args:
        source: a ``.beton`` file, a glob, a manifest file, a list of these, or a Manifest (as ``Loader`` takes).
        columns: the fields to read (default: all), in this order.
        images: "decoded" or "jpeg" (:data:`IMAGE_OUTPUTS`).
        rows_per_block: rows in each block a read task yields.
        custom_fields, remote, allow_outside: as for ``Loader`` / :func:`~beton.dataset.shards.dataset_manifest`.
    """

    def __init__(self, source: Source, *, columns: Sequence[str] | None = None, images: str = "decoded",
                 rows_per_block: int = DEFAULT_ROWS_PER_BLOCK,
                 custom_fields: Mapping[str, type[Field]] | None = None, remote: RemoteOptions | None = None,
                 allow_outside: bool = False) -> None:
        super().__init__()
        if images not in IMAGE_OUTPUTS:
            raise ValueError(f"images must be one of {IMAGE_OUTPUTS}, got {images!r}")
        if isinstance(rows_per_block, bool) or not isinstance(rows_per_block, int) or rows_per_block < 1:
            raise ValueError(f"rows_per_block must be a positive integer, got {rows_per_block!r}")
        self.manifest = dataset_manifest(source, remote=remote, allow_outside=allow_outside)
        names = [spec.name for spec in self.manifest.fields]
        self.columns = tuple(names if columns is None else columns)
        unknown = [name for name in self.columns if name not in names]
        if unknown or len(set(self.columns)) != len(self.columns):
            raise ValueError(f"columns must be distinct fields of the dataset {names}, got {list(self.columns)}")
        self.images, self.rows_per_block = images, rows_per_block
        self.custom_fields = dict(custom_fields or {})

    def get_name(self) -> str:
        return "Beton"

    def estimate_inmemory_data_size(self) -> int | None:
        return None  # decoded sizes are not known before decoding

    def get_read_tasks(self, parallelism: int, per_task_row_limit: int | None = None,
                       data_context: Any = None) -> list[ReadTask]:
        tasks = []
        for number, start, end in sample_ranges([shard.num_samples for shard in self.manifest.shards], parallelism):
            shard = self.manifest.shards[number]
            alone = dataclasses.replace(  # a task carries its own shard, not the whole list
                Manifest.of([(shard.location, shard.num_samples, shard.header_sha256)], self.manifest.fields),
                remote=self.manifest.remote)
            read = functools.partial(_read_range, alone, start, end, self.columns, self.images, self.rows_per_block,
                                     self.custom_fields)
            metadata = BlockMetadata(num_rows=end - start, size_bytes=None, exec_stats=None,
                                     input_files=(shard.location,))
            tasks.append(ReadTask(read, metadata, per_task_row_limit=per_task_row_limit))
        return tasks


def read_beton(source: Source, *, override_num_blocks: int | None = None, preserve_order: bool = True,
               **options: Any) -> ray.data.Dataset:
    """``ray.data.read_datasource(BetonDatasource(source, **options))``: a beton dataset as a ``ray.data.Dataset``,
    whose rows come in the dataset's order unless ``preserve_order=False`` (module docstring)."""
    dataset = ray.data.read_datasource(BetonDatasource(source, **options), override_num_blocks=override_num_blocks)
    # A new dataset has its own copy of the DataContext (the caller's current one is left as it is).
    dataset.context.execution_options.preserve_order = preserve_order
    return dataset


def sample_ranges(counts: Sequence[int], parallelism: int) -> list[tuple[int, int, int]]:
    """(shard, start, end) ranges covering every sample of shards holding ``counts`` samples, in order: about
    ``parallelism`` ranges in all, none across two shards, those of one shard differing in size by at most one."""
    total = sum(counts)
    target = max(1, math.ceil(total / max(1, parallelism)))
    ranges = []
    for number, count in enumerate(counts):
        pieces = math.ceil(count / target)
        ranges += [(number, *shard_range(count, piece, pieces)) for piece in range(pieces)]
    return ranges


def _read_range(manifest: Manifest, start: int, end: int, columns: tuple[str, ...], images: str,
                rows_per_block: int, custom_fields: Mapping[str, type[Field]]) -> Iterator[Block]:
    with manifest.open_shard(0, custom_fields=custom_fields) as reader:
        for first in range(start, end, rows_per_block):
            rows = range(first, min(end, first + rows_per_block))
            yield BlockAccessor.batch_to_block(
                {name: [_value(reader, index, name, images) for index in rows] for name in columns})


def _value(reader: Reader, index: int, name: str, images: str) -> Any:
    field = reader.fields[name]
    record = reader.data_table[index][name]
    payload = reader.payload(index, name)
    with error_context(path=reader.path, field=name, sample=index):
        if isinstance(field, JSONField):
            return payload.tobytes().decode("utf-8")
        if isinstance(field, RGBImageField) and images == "jpeg":
            if record["mode"] not in JPEG_MODES:
                raise DecodeError(f"stored as {MODE_NAMES.get(int(record['mode']), record['mode'])}, not as a JPEG: "
                                  "it has no JPEG bytes (images='decoded' decodes it)")
            return whole_jpeg(payload, record).tobytes()
        value = field.to_python(record, payload)
    if type(value).__module__ == "torch":  # a TorchTensorField: Ray holds numpy
        import torch

        return (value.float() if value.dtype == torch.bfloat16 else value).numpy()
    return value
