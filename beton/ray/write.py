"""Writing a ``ray.data.Dataset`` as shards plus a manifest.

How a write goes (:class:`BetonDatasink`, used by :func:`write_dataset` or ``ds.write_datasink(...)``):

1. On the driver, before any task starts: the fields, page size, seed and metadata are checked by building a
   :class:`~beton.DatasetWriter` (the same checks, the same errors); then, once Ray knows the dataset's columns
   (``on_write_start``), they must be the fields' names exactly, and the output must hold no shards or manifest
   of another write (``overwrite=True`` removes them first).
2. Each Ray write task *k* writes the rows Ray hands it, in order, to ``<prefix>-<k>.beton`` through the ordinary
   :class:`~beton.DatasetWriter`: atomic, so a task that dies (a killed worker, a lost node) leaves at most a
   temporary file, which the retry writing the same shard removes (:mod:`beton.storage.file_builder`), and
   a retried task rewrites the same name: no partial shard, no duplicate. *k* is Ray's task index, so names and
   contents are fixed for a given dataset when blocks reach the write in order (``preserve_order``, which
   :func:`write_dataset` sets on a copy of the dataset).
3. When every task has ended, the driver writes the manifest (``beton index``'s format) last: it lists each
   shard with its sample count and header SHA-256, in task order, with its tables file beside it (each shard's
   header and tables, which each task read back from the shard it wrote:
   :func:`~beton.dataset.tables_file.write_indexed_manifest`, what ``beton index`` writes), so that the dataset
   opens without reading every shard. A write that fails writes no manifest.

Shard *k* is byte for byte ``DatasetWriter(path, fields, seed=seed, page_size=..., metadata=...)
.from_iterable(rows of task k)``: anything random in encoding is keyed by (seed, place in the shard, field), so it
repeats from shard to shard (a Ray task does not know how many rows precede it, which keying by the place in the
whole dataset, as ``shard=(k, n)`` does, would need).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import ray
import ray.data
from ray.data.block import Block, BlockAccessor
from ray.data.datasource import Datasink, WriteResult

from beton.dataset.manifest import FieldSpec, Manifest, field_specs, header_digest
from beton.dataset.shards import is_manifest_name
from beton.dataset.tables_file import TablesRow, tables_file_name, tables_row, write_indexed_manifest
from beton.errors import EncodeError, FieldError, WriterError, locate
from beton.fields import JSONField, TorchTensorField
from beton.fields.base import Field
from beton.storage import format as fmt
from beton.storage.reader import Reader
from beton.storage.remote import RemoteOptions, is_http, is_url, remote_or_default
from beton.storage.remote.fetch import filesystem
from beton.storage.writer import DatasetWriter

__all__ = ["BetonDatasink", "ShardWritten", "write_dataset"]


@dataclasses.dataclass(frozen=True)
class ShardWritten:
    """What one write task returns to the driver: its task index, the shard's location, sample count, the SHA-256
    of its header, its fields and its row of the manifest's tables file."""

    number: int
    location: str
    num_samples: int
    header_sha256: str
    fields: tuple[FieldSpec, ...]
    tables: TablesRow


class BetonDatasink(Datasink):
    """A Ray Data datasink writing shards of a ``.beton`` dataset and its manifest (module docstring).

    Args:
        output: the directory (or URL) that receives the shards and the manifest. A local path is made absolute
            on the driver: every Ray worker must see the same directory (a shared file system), or use a URL.
        fields: field name -> :class:`~beton.fields.Field`; the dataset's columns must be exactly these names.
        manifest: the manifest file's name in ``output`` (ends in ``.json``).
        prefix: shards are named ``<prefix>-<task index, 6 digits>.beton``.
        page_size, seed, metadata: as for :class:`~beton.DatasetWriter` (the same for every shard).
        overwrite: remove a manifest and shards of this naming already in ``output`` (a directory, or a prefix of
            an object store) instead of refusing to write.
        remote: how URLs are reached (:class:`~beton.storage.remote.RemoteOptions`), kept by the manifest.
        json_text: a ``JSONField`` column's strings are each value's JSON text (``json.dumps``; what
            :func:`~beton.ray.read_beton` gives), parsed before they are stored; without it a string is stored as a
            JSON string. (JSON values as Python dicts and lists reach the sink as Arrow holds them, which may have
            merged the rows' types: a column holding a null or a whole-number float is refused, and JSON text with
            ``json_text=True`` stores it exactly.)

    After ``ds.write_datasink(sink)``, ``sink.manifest`` is the :class:`~beton.dataset.manifest.Manifest` written.
    """

    def __init__(self, output: str | os.PathLike[str], fields: Mapping[str, Field], *,
                 manifest: str = "manifest.json", prefix: str = "part", page_size: int = fmt.DEFAULT_PAGE_SIZE,
                 seed: int = 0, metadata: Mapping[str, Any] | None = None, overwrite: bool = False,
                 remote: RemoteOptions | None = None, json_text: bool = False) -> None:
        output = os.fspath(output)
        self.output = output.rstrip("/") if is_url(output) else os.path.abspath(output)
        if not is_manifest_name(manifest) or "/" in manifest or os.sep in manifest:
            raise ValueError(f"manifest must be a file name ending in .json, got {manifest!r}")
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", prefix):
            raise ValueError(f"prefix must be letters, digits, '_', '.' or '-', got {prefix!r}")
        self.manifest_name, self.prefix, self.overwrite, self.remote = manifest, prefix, overwrite, remote
        self.json_text = json_text
        self._options = {"page_size": page_size, "seed": seed,
                         "metadata": copy.deepcopy(dict(metadata)) if metadata else None}
        if remote is not None:  # the shards' writers reach a URL output as the manifest does
            self._options["remote"] = remote
        # The checks every shard's writer makes, made once here on the driver, before any task starts.
        self._fields = _writer(self._location("check.beton"), fields, self._options).fields
        self.manifest: Manifest | None = None

    @property
    def fields(self) -> dict[str, Field]:
        return dict(self._fields)

    # ---- names ----------------------------------------------------------------------------------------------

    def shard_name(self, number: int) -> str:
        return f"{self.prefix}-{number:06d}.beton"

    def _location(self, name: str) -> str:
        return f"{self.output}/{name}" if is_url(self.output) else os.path.join(self.output, name)

    @property
    def manifest_location(self) -> str:
        return self._location(self.manifest_name)

    # ---- Ray's Datasink contract ----------------------------------------------------------------------------

    def on_write_start(self, schema: Any = None) -> None:
        """On the driver, before the first task: the output directory. (Ray's ``schema`` here is the input of
        the operator the write is fused with, before the user's last map steps, so the columns are checked by
        :func:`write_dataset` and by each task before it writes.)"""
        if not is_url(self.output):
            os.makedirs(self.output, exist_ok=True)
        self._clear_output()

    def write(self, blocks: Iterable[Block], ctx: Any) -> ShardWritten | None:
        """In a Ray task: the rows of ``blocks``, in order, to shard ``ctx.task_idx`` (None when there are none)."""
        rows = _rows(blocks, self._fields, self.json_text)
        first = next(rows, None)
        if first is None:
            return None
        location = self._location(self.shard_name(ctx.task_idx))
        _writer(location, self._fields, self._options).from_iterable(_chain(first, rows))
        with Reader(location, remote=self.remote) as reader:  # read back, and checked, as `beton index` reads it
            return ShardWritten(ctx.task_idx, location, reader.num_samples, header_digest(reader.header.tobytes()),
                                field_specs(reader.descriptors), tables_row(reader))

    def on_write_complete(self, write_result: WriteResult) -> None:
        """On the driver, after every task: the manifest, written last."""
        written = sorted((result for result in write_result.write_returns if result is not None),
                         key=lambda result: result.number)
        if not written:
            raise WriterError(f"the dataset has no rows, so no shard and no manifest was written to {self.output}")
        numbers = [result.number for result in written]
        if len(set(numbers)) != len(numbers):  # Ray runs each task index once; a retry returns once
            raise WriterError(f"write tasks returned the same shard twice: task indices {numbers}")
        manifest = Manifest.of([(result.location, result.num_samples, result.header_sha256) for result in written],
                               written[0].fields)
        manifest = dataclasses.replace(manifest, remote=self.remote)
        self.manifest = write_indexed_manifest(manifest, self.manifest_location,
                                               [result.tables for result in written])

    def get_name(self) -> str:
        return "Beton"

    def _clear_output(self) -> None:
        """Refuse an output holding the manifest or shards of another write (a glob of it would mix the two, and
        shards of a larger earlier write would outlive a smaller one), or remove them with ``overwrite``: a local
        directory, or a prefix of an object store (which is listed; an HTTP(S) URL cannot be, nor written)."""
        pattern = re.compile(re.escape(self.prefix) + r"-\d{6,}\.beton")
        tables = tables_file_name(self.manifest_name)
        names, remove = self._listing()
        found = [name for name in sorted(names) if name in (self.manifest_name, tables) or pattern.fullmatch(name)]
        if not found:
            return
        if not self.overwrite:
            raise locate(WriterError(f"already holds {', '.join(found[:3])}{' ...' if len(found) > 3 else ''} of "
                                     "another write; overwrite=True removes them first"), path=self.output)
        for name in sorted(found, key=lambda name: name != self.manifest_name):  # the manifest first: it never
            remove(name)                                                        # names a missing file

    def _listing(self) -> tuple[list[str], Callable[[str], None]]:
        """The names in the output, and how to remove one."""
        if not is_url(self.output):
            def unlink(name: str) -> None:
                try:
                    os.unlink(os.path.join(self.output, name))
                except FileNotFoundError:
                    pass
            return os.listdir(self.output), unlink
        if is_http(self.output):
            return [], lambda name: None  # nothing lists it (and nothing writes to it: each task's write fails)
        fs, path = filesystem(self.output, remote_or_default(self.remote))
        try:
            entries = fs.ls(path, detail=False, refresh=True)
        except FileNotFoundError:  # a prefix nothing was written under yet
            return [], fs.rm
        names = [entry.rstrip("/").rsplit("/", 1)[-1] for entry in entries]
        return names, lambda name: fs.rm(f"{path.rstrip('/')}/{name}")


def write_dataset(dataset: ray.data.Dataset, output: str | os.PathLike[str], fields: Mapping[str, Field], *,
                  concurrency: int | None = None, ray_remote_args: Mapping[str, Any] | None = None,
                  **sink_options: Any) -> Manifest:
    """Write ``dataset`` to ``output`` as shards plus a manifest (:class:`BetonDatasink`; ``sink_options`` are
    its keyword arguments) and return the manifest, which ``Loader`` takes (or its file,
    ``<output>/manifest.json``).

    Blocks reach the write in the dataset's order (``preserve_order`` is set on a copy of the dataset; the
    dataset given is left as it is), so a given dataset writes the same shards, under the same names, each time.
    ``concurrency`` and ``ray_remote_args`` (``max_retries``, ``num_cpus``, ...) are ``write_datasink``'s.
    """
    sink = BetonDatasink(output, fields, **sink_options)
    schema = dataset.schema(fetch_if_missing=False)  # known without running the dataset, or None
    if schema is not None:
        _check_columns(list(schema.names), list(sink.fields))
    ordered = ray.data.Dataset.copy(dataset, _deep_copy=True)  # its own DataContext, so the caller's is unchanged
    ordered.context.execution_options.preserve_order = True
    ordered.write_datasink(sink, ray_remote_args=dict(ray_remote_args or {}), concurrency=concurrency)
    if sink.manifest is None:  # pragma: no cover - write_datasink raises before this
        raise WriterError(f"writing {output} ended without a manifest")
    return sink.manifest


def _writer(location: str, fields: Mapping[str, Field], options: Mapping[str, Any]) -> DatasetWriter:
    # One process per shard: Ray's parallelism is across tasks, each task holding one CPU.
    return DatasetWriter(location, fields, num_workers=0, progress=False, **options)


def _check_columns(columns: list[str], names: list[str]) -> None:
    missing = [name for name in names if name not in columns]
    extra = [column for column in columns if column not in names]
    if missing or extra:
        raise FieldError(f"the dataset's columns {columns} are not the fields {names}"
                         + (f": no column for field(s) {missing}" if missing else "")
                         + (f"; column(s) {extra} have no field (drop them with ds.drop_columns)" if extra else ""))


def _rows(blocks: Iterable[Block], fields: Mapping[str, Field], json_text: bool) -> Iterator[tuple[Any, ...]]:
    """Each row of ``blocks`` as a tuple in the fields' order, each value turned back from how Ray holds it
    (:func:`_from_ray`); a JSONField's column is first checked to hold its values exactly
    (:func:`_check_json_column`)."""
    names = list(fields)
    kinds = [_kind(field, json_text) for field in fields.values()]
    done = 0  # rows of the shard before this block, for errors
    for block in blocks:
        accessor = BlockAccessor.for_block(block)
        if accessor.num_rows() == 0:  # a block a filter emptied: Ray may leave it without columns too
            continue
        batch = accessor.to_batch_format("numpy")
        _check_columns(list(batch), names)
        for name, kind in zip(names, kinds):
            if kind.startswith("json"):
                _check_json_column(block, name, kind == "json text")
        columns = [batch[name] for name in names]
        for row in range(len(columns[0])):
            yield tuple(_from_ray(column[row], kind, name, done + row)
                        for column, kind, name in zip(columns, kinds, names))
        done += len(columns[0])


def _kind(field: Field, json_text: bool) -> str:
    if isinstance(field, TorchTensorField):
        return "tensor"
    if isinstance(field, JSONField):
        return "json text" if json_text else "json"
    return "as is"


def _check_json_column(block: Block, name: str, json_text: bool) -> None:
    """FieldError unless Ray's block holds column ``name`` so that its values come back exactly. Ray stores a
    column of JSON-like values as one Arrow type when it can, merging the rows': a key a row lacks comes back as
    None, and an integer beside a float, or beside a missing number, comes back as a float (1 as 1.0, a missing
    one as NaN). Neither can be told apart from a value given so, so a column holding a null or a whole-number
    float at any depth is refused; in any other, no value was merged, and the values are the ones given. Python
    objects (Ray's fallback for columns Arrow cannot type) and strings without nulls come back as they were."""
    if not isinstance(block, pa.Table):
        return  # a pandas block holds dicts and lists as the Python objects they were
    column = block.column(name)
    if isinstance(column.type, pa.ExtensionType) and column.type.extension_name == "ray.data.arrow_pickled_object":
        return
    found = next(filter(None, (_merged(chunk) for chunk in column.chunks)), None)
    if found is None:
        return
    if json_text and (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)
                      or pa.types.is_null(column.type)):
        raise locate(FieldError("a value of this JSONField's column of JSON text is missing (a null): give the "
                                "text 'null' for a JSON null"), field=name)
    raise locate(FieldError(
        f"Ray holds this JSONField's column as Arrow {column.type}, with {found}: Arrow merged the rows' values "
        "into one type, so a key a row lacks, a missing number or an integer beside a float cannot be told apart "
        "from the null or float it became. Give each value as its JSON text (json.dumps) and json_text=True, "
        "which stores the values exactly"), field=name)


def _merged(array: pa.Array) -> str | None:
    """What in ``array`` (at any depth) may have been another value before Arrow merged the rows' types: a null
    or a whole-number float; None if nothing."""
    if array.null_count:
        return "a null"
    kind = array.type
    if isinstance(kind, pa.ExtensionType):
        return _merged(array.storage)
    if pa.types.is_floating(kind):
        values = array.to_numpy(zero_copy_only=False)
        return "a whole-number float" if np.any(np.isfinite(values) & (values == np.floor(values))) else None
    if pa.types.is_struct(kind):
        return next(filter(None, (_merged(child) for child in array.flatten())), None)
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        return _merged(array.flatten())
    if pa.types.is_map(kind):
        return _merged(array.keys) or _merged(array.items)
    return None


def _from_ray(value: Any, kind: str, name: str, row: int) -> Any:
    """Ray holds tensors as numpy arrays, so a TorchTensorField's value becomes a tensor again (the field still
    checks its dtype and shape); it holds JSON-like values as Arrow structs and lists, which come back as dicts of
    numpy arrays and scalars, so a JSONField's value has them turned back into lists and Python numbers; with
    ``json_text`` its strings are parsed."""
    if kind == "tensor" and isinstance(value, np.ndarray):
        import torch

        return torch.from_numpy(np.array(value))  # a copy: Ray's arrays are read-only views
    if kind == "json text" and isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError as error:
            raise locate(EncodeError(f"json_text=True, and this value is not JSON text: {error}"), field=name,
                         sample=row) from None
    if kind.startswith("json"):
        return _json_value(value)
    return value


def _json_value(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _json_value(item) for key, item in value.items()}
    if isinstance(value, (list, tuple, np.ndarray)):
        return [_json_value(item) for item in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def _chain(first: Any, rest: Iterator[Any]) -> Iterator[Any]:
    yield first
    yield from rest
