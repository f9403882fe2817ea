"""Parquet files (the Hugging Face Hub's format, and ``datasets.Dataset.to_parquet``): one field per column.

Needs pyarrow (``pip install 'beton[parquet]'``). Sources are Parquet files or folders (every ``*.parquet``
under them, sorted); all must have the chosen columns with the same types. Rows are read a batch at a time,
so memory holds one batch of rows (plus the writer's samples in flight), whatever the files' size.

How a column becomes a field (``types={"column": kind}`` overrides the choice; the report lists every
field):

==============================================  ==========  ==========================================
column                                          kind        field
==============================================  ==========  ==========================================
image struct ``{bytes, path}`` (HF ``Image``),  image       RGBImageField via ImageFileField (JPEGs
or binary whose first value is an image file                stored as they are, every file checked)
integers, booleans                              int         IntField (HF ``ClassLabel`` names go to the
                                                            metadata: ``metadata["classes"][column]``)
floats                                          float       FloatField
fixed-size lists of numbers, HF ``Array2D..5D``  ndarray     NDArrayField of that dtype and shape
variable-length lists of numbers, or of         ragged      RaggedArrayField of that dtype, shape
fixed-size lists of them; HF ``Sequence`` /                 ``(None, *inner sizes)``: ``list<int32>`` is
``List`` of numbers, ArrayND with a ``None``                ``(None,)``, ``list<fixed_size_list<float,
first dimension                                             4>>`` (boxes) ``(None, 4)`` (HF ``ClassLabel``
                                                            names go to the metadata, as for ints)
other binary                                    bytes       BytesField
strings, structs, dates, lists of strings or    json        JSONField (dates and times as ISO 8601 text,
of lists whose lengths vary, anything else                  decimals as text)
==============================================  ==========  ==========================================

A null in a column whose field cannot hold one (all but json) is a bad row: the conversion fails naming the
file and row, or with ``on_error="skip"`` the row is left out and listed in the report, as are rows whose image
cannot be decoded. For array columns that includes a null list (an empty list is an array of length 0), a null
item inside a list, and an inner list whose length is not the column's (HF ArrayND columns store every
dimension as a variable-length list).

A Hugging Face feature that declares another dtype than the column's Arrow type (an ``Array2D`` of ``uint8`` or
a ``Value("uint8")`` over int32 data) is believed only as far as the values fit it: an integer or bool dtype
takes only values it holds exactly (no wrap: 258 is not stored as 2; no truncation; bool only from 0 and 1), a
float dtype any value within its range. A value that does not fit is a bad row, named by file, row, column and
item.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from beton import bounded_json
from beton.fields import BytesField, FloatField, IntField, JSONField, NDArrayField, RaggedArrayField
from beton.fields.base import Field
from beton.storage import format as fmt
from beton.tools.convert.arrow_arrays import (BadValue, fitted, fixed_arrays, fixed_layout, ragged_arrays,
                                             ragged_layout)
from beton.tools.convert.images import ImageOptions, sniff_image_format
from beton.tools.convert.report import ConversionError, ConversionReport, SkippedSource, base_metadata, write
from beton.storage.remote.options import RemoteOptions

__all__ = ["parquet", "COLUMN_KINDS", "parquet_files"]

#: The kinds a column may be stored as (``types=`` overrides).
COLUMN_KINDS = ("image", "int", "float", "ndarray", "ragged", "bytes", "json")
_BATCH_ROWS = 256
_HF_LISTS = ("List", "LargeList", "Sequence")  # Sequence: datasets < 4


def _pyarrow() -> Any:
    try:
        import pyarrow
        import pyarrow.compute
        import pyarrow.parquet
    except ImportError:
        raise ConversionError("converting Parquet needs pyarrow: pip install 'beton[parquet]'") from None
    return pyarrow


def parquet_files(sources: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> list[str]:
    """The Parquet files ``sources`` name: files as given, folders searched for ``*.parquet`` (sorted)."""
    if isinstance(sources, (str, os.PathLike)):
        sources = [sources]
    files = []
    for source in map(os.fspath, sources):
        if os.path.isdir(source):
            found = sorted(os.path.join(directory, name) for directory, _, names in os.walk(source)
                           for name in names if name.endswith(".parquet") and not name.startswith("."))
            if not found:
                arrow = any(name.endswith(".arrow") for _, _, names in os.walk(source) for name in names)
                raise ConversionError(f"folder {source!r} holds no .parquet files" + (_SAVE_TO_DISK if arrow else ""))
            files += found
        elif os.path.isfile(source):
            files.append(source)
        else:
            raise ConversionError(f"{source!r} does not exist")
    if not files:
        raise ConversionError("no Parquet files given")
    return files


def parquet(sources: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], output: str | os.PathLike[str], *,
            columns: Sequence[str] | None = None, types: Mapping[str, str] | None = None, on_error: str = "fail",
            metadata: Mapping[str, Any] | None = None, num_workers: int = -1,
            page_size: int = fmt.DEFAULT_PAGE_SIZE, progress: bool = True, remote: RemoteOptions | None = None,
            **image_options: Any) -> ConversionReport:
    """Write Parquet rows as samples, one field per column (see the module docstring).

    Args:
        sources: a Parquet file, a folder of them, or a list of both.
        output: the .beton file to write.
        columns: the columns to store, in this order (default: all, in the files' order).
        types: column -> kind ("image", "int", "float", "ndarray", "ragged", "bytes", "json"), overriding the
            choice.
        on_error: "fail" or "skip" (rows with a null where the field cannot hold one, or a bad image).
        metadata: extra file-level metadata (class names of HF ClassLabel columns and the sources are stored).
        num_workers, page_size, progress, remote: as for :class:`~beton.DatasetWriter` (``output`` may be a URL).
        image_options: :class:`~beton.tools.convert.images.ImageOptions` for image columns.
    """
    pa = _pyarrow()
    files = parquet_files(sources)
    schema = _schema(files[0], pa)
    names = list(columns) if columns is not None else list(schema.names)
    _check_columns(files, schema, names, pa)
    hf = _hf_features(schema)
    unknown = set(types or {}) - set(names)
    if unknown:
        raise ConversionError(f"types= names columns that are not converted: {sorted(unknown)}")
    plans = {name: _plan(name, schema.field(name).type, hf.get(name), (types or {}).get(name), files[0], pa,
                         image_options) for name in names}
    fields = {name: plan.field for name, plan in plans.items()}
    classes = {}
    for name in names:
        labels = _class_names(hf.get(name), fields[name])
        if labels is not None:
            classes[name] = labels
    stored = base_metadata("parquet", {"files": [os.path.abspath(path) for path in files]}, classes, metadata)
    rows = _Rows(files, names, plans, on_error, pa)
    return write(output, fields, rows, indexed=False, source_name=rows.source_name, metadata=stored,
                 on_error=on_error, length=rows.total, skipped_before=rows.skipped, num_workers=num_workers,
                 page_size=page_size, progress=progress, remote=remote)


def _check_columns(files: list[str], schema: Any, names: list[str], pa: Any) -> None:
    missing = [name for name in names if name not in schema.names]
    if missing:
        raise ConversionError(f"{files[0]}: no column {missing[0]!r}; columns are {schema.names}")
    if len(set(names)) != len(names) or not names:
        raise ConversionError(f"columns must be distinct and at least one, got {names}")
    for path in files[1:]:
        other = _schema(path, pa)
        for name in names:
            if name not in other.names:
                raise ConversionError(f"{path}: no column {name!r}, which {files[0]} has")
            if not other.field(name).type.equals(schema.field(name).type):
                raise ConversionError(f"{path}: column {name!r} is {other.field(name).type}, in {files[0]} it is "
                                      f"{schema.field(name).type}")


_SAVE_TO_DISK = ("; datasets.Dataset.save_to_disk writes Arrow files, not Parquet: convert "
                 "datasets.load_from_disk(folder).to_parquet('data.parquet')")


def _schema(path: str, pa: Any) -> Any:
    """The schema of the Parquet file ``path``; a file pyarrow cannot read as Parquet is named (pyarrow's error
    does not name it)."""
    try:
        return pa.parquet.read_schema(path)
    except (pa.ArrowException, OSError) as error:
        hint = _SAVE_TO_DISK if path.endswith(".arrow") else ""
        raise ConversionError(f"{path}: not a Parquet file pyarrow can read ({error}){hint}") from None


def _hf_features(schema: Any) -> dict[str, dict]:
    """The Hugging Face ``datasets`` feature of each column, from the schema's metadata (or nothing)."""
    try:  # the file's text: parsed with beton's depth limit
        info = bounded_json.loads((schema.metadata or {}).get(b"huggingface", b"{}"))
        features = info.get("info", {}).get("features", {})
    except (ValueError, AttributeError):
        return {}
    return {name: feature for name, feature in features.items() if isinstance(feature, dict)} \
        if isinstance(features, dict) else {}


def _class_names(feature: dict | None, field: Field) -> list | None:
    """The names of a HF ``ClassLabel`` column stored as ints, or of a list of them stored as ragged ints."""
    if isinstance(field, RaggedArrayField) and isinstance(feature, dict) and feature.get("_type") in _HF_LISTS:
        feature = feature.get("feature")
    elif not isinstance(field, IntField):
        return None
    if isinstance(feature, dict) and feature.get("_type") == "ClassLabel" and isinstance(feature.get("names"), list):
        return feature["names"]
    return None


class _Plan:
    """How one column's values become a field's values."""

    # dtype and shape: an ndarray column's values; a ragged column's rows (the shape after the varying dimension)
    def __init__(self, kind: str, field: Field, dtype: np.dtype | None = None, shape: tuple[int, ...] = ()) -> None:
        self.kind, self.field, self.dtype, self.shape = kind, field, dtype, shape


def _plan(name: str, arrow_type: Any, feature: dict | None, override: str | None, first_file: str, pa: Any,
          image_options: Mapping[str, Any]) -> _Plan:
    kind = override or _auto_kind(name, arrow_type, feature, first_file, pa)
    if kind not in COLUMN_KINDS:
        raise ConversionError(f"column {name!r}: kind must be one of {COLUMN_KINDS}, got {kind!r}")
    types = pa.types
    if kind == "image":
        if not (_is_binary(arrow_type, pa) or _is_image_struct(arrow_type, pa)):
            raise ConversionError(f"column {name!r} is {arrow_type}; images come from binary columns or "
                                  "{bytes, path} structs")
        return _Plan(kind, ImageOptions(**image_options).field())
    if kind in ("int", "float"):
        numeric = types.is_integer(arrow_type) or types.is_boolean(arrow_type) or \
            (kind == "float" and types.is_floating(arrow_type))
        if not numeric:
            raise ConversionError(f"column {name!r} is {arrow_type}, which cannot be stored as {kind}")
        return _Plan(kind, IntField() if kind == "int" else FloatField(), _declared_dtype(feature, arrow_type))
    if kind == "ndarray":
        layout = fixed_layout(arrow_type, feature, pa)
        if layout is None:
            raise ConversionError(f"column {name!r} is {arrow_type}: an ndarray column needs fixed-size lists of "
                                  "numbers (or a Hugging Face Array2D..5D feature); lists of any length: ragged")
        dtype, shape = layout
        return _Plan(kind, NDArrayField(dtype, shape), dtype, shape)  # type: ignore[arg-type]
    if kind == "ragged":
        layout = ragged_layout(arrow_type, feature, pa)
        if layout is None:
            raise ConversionError(f"column {name!r} is {arrow_type}: a ragged column needs lists of numbers, or "
                                  "lists of fixed-size lists of numbers (or a Hugging Face Array2D..5D feature)")
        dtype, shape = layout
        return _Plan(kind, RaggedArrayField(dtype, shape), dtype, shape[1:])  # type: ignore[arg-type]
    if kind == "bytes":
        if not (_is_binary(arrow_type, pa) or _is_text(arrow_type, pa) or _is_image_struct(arrow_type, pa)):
            raise ConversionError(f"column {name!r} is {arrow_type}, which cannot be stored as bytes")
        return _Plan(kind, BytesField())
    return _Plan("json", JSONField())


def _declared_dtype(feature: dict | None, arrow_type: Any) -> np.dtype | None:
    """The numeric dtype a Hugging Face ``Value`` feature declares where it differs from the column's own type
    (its values are then checked to fit it), else None."""
    if not isinstance(feature, dict) or feature.get("_type") != "Value" or not isinstance(feature.get("dtype"), str):
        return None
    try:
        declared = np.dtype(feature["dtype"])
        own = np.dtype(arrow_type.to_pandas_dtype())
    except (TypeError, NotImplementedError):
        return None
    return declared if declared.kind in "biuf" and declared != own else None


def _auto_kind(name: str, arrow_type: Any, feature: dict | None, first_file: str, pa: Any) -> str:
    types = pa.types
    hf_type = (feature or {}).get("_type")
    if hf_type == "Image" or (_is_image_struct(arrow_type, pa) and hf_type is None and
                              _first_is_image(first_file, name, pa)):
        return "image"
    if _is_binary(arrow_type, pa):
        return "image" if _first_is_image(first_file, name, pa) else "bytes"
    if _is_image_struct(arrow_type, pa):
        return "bytes"  # {bytes, path} of something else (HF Audio, say)
    if types.is_integer(arrow_type) or types.is_boolean(arrow_type):
        return "int"
    if types.is_floating(arrow_type):
        return "float"
    if fixed_layout(arrow_type, feature, pa) is not None:
        return "ndarray"
    if ragged_layout(arrow_type, feature, pa) is not None:
        return "ragged"
    return "json"


def _is_binary(arrow_type: Any, pa: Any) -> bool:
    """Whether the column holds byte strings in any of Arrow's layouts: a Parquet file may hold fixed-size binary
    (UUIDs, hashes), binary views, or dictionary-encoded binary, which read as ``bytes`` like plain binary."""
    types = pa.types
    if types.is_dictionary(arrow_type):
        arrow_type = arrow_type.value_type
    return types.is_binary(arrow_type) or types.is_large_binary(arrow_type) or \
        types.is_fixed_size_binary(arrow_type) or _view_test(types, "is_binary_view")(arrow_type)


def _is_text(arrow_type: Any, pa: Any) -> bool:
    """Whether the column holds strings in any of Arrow's layouts (plain, large, view, dictionary-encoded)."""
    types = pa.types
    if types.is_dictionary(arrow_type):
        arrow_type = arrow_type.value_type
    return types.is_string(arrow_type) or types.is_large_string(arrow_type) or \
        _view_test(types, "is_string_view")(arrow_type)


def _view_test(types: Any, name: str) -> Callable[[Any], bool]:
    """pyarrow's test for a view type; pyarrow before 16 has no view types (the extra allows pyarrow 14)."""
    return getattr(types, name, lambda arrow_type: False)


def _is_image_struct(arrow_type: Any, pa: Any) -> bool:
    return pa.types.is_struct(arrow_type) and {arrow_type.field(i).name for i in range(arrow_type.num_fields)} >= \
        {"bytes", "path"}


def _first_is_image(path: str, column: str, pa: Any) -> bool:
    """Whether the column's first non-null value in ``path`` is an image file (decides binary columns)."""
    for batch in pa.parquet.ParquetFile(path).iter_batches(batch_size=_BATCH_ROWS, columns=[column]):
        for value in _binary_values(batch.column(0), pa):
            if value is not None:
                return sniff_image_format(value[:16]) is not None
    return False


def _binary_values(column: Any, pa: Any) -> list[bytes | None]:
    if pa.types.is_struct(column.type):
        return column.field("bytes").to_pylist()
    return column.to_pylist()


class _Rows:
    """The rows of every file as sample tuples, streamed a batch at a time; rows the converter itself refuses
    (a null a field cannot hold) go to ``skipped`` (or raise, with on_error="fail")."""

    def __init__(self, files: list[str], names: list[str], plans: Mapping[str, _Plan], on_error: str, pa: Any) -> None:
        self.files, self.names, self.plans, self.on_error, self.pa = files, names, plans, on_error, pa
        self.counts = [pa.parquet.ParquetFile(path).metadata.num_rows for path in files]
        self.total = sum(self.counts)
        self.skipped: list[SkippedSource] = []
        self._yielded: list[tuple[int, int]] = []  # (file, first row) of each run of consecutive yielded rows
        self._run_starts: list[int] = []  # the position of each run's first sample
        self._yielded_count = 0
        self._reading = (0, 0)  # (file, row) being read

    def source_name(self, position: int) -> str:
        import bisect

        run = bisect.bisect_right(self._run_starts, position) - 1
        if run < 0 or position >= self._yielded_count:  # failed while reading, before yielding this sample
            return f"{self.files[self._reading[0]]} row {self._reading[1]}"
        file, first_row = self._yielded[run]
        return f"{self.files[file]} row {first_row + position - self._run_starts[run]}"

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        position = 0
        for number, path in enumerate(self.files):
            row = 0
            reader = self.pa.parquet.ParquetFile(path)
            self._reading = (number, row)
            for batch in self._batches(reader, path, lambda: row):
                columns = [self._values(batch.column(i), self.plans[name], name) for i, name in enumerate(self.names)]
                for values in zip(*columns):
                    problem = next((value.reason for value in values if isinstance(value, BadValue)), None)
                    if problem is not None:
                        self._skip(f"{path} row {row}", problem)
                    else:
                        if not self._yielded or self._last_end(position) != (number, row):
                            self._yielded.append((number, row))
                            self._run_starts.append(position)
                        position += 1
                        self._yielded_count = position
                        yield values
                    row += 1
                    self._reading = (number, row)
        if position == 0 and self.skipped:  # an empty file would hide it: fail (the target is kept)
            first = self.skipped[0]
            raise ConversionError(f"every row was skipped; the first: {first.source}: {first.reason}")

    def _batches(self, reader: Any, path: Any, row: Callable[[], int]) -> Iterator[Any]:
        """The file's record batches; a batch pyarrow cannot read is a ConversionError naming file and row (some
        pyarrow versions cannot read back every file they write, e.g. null fixed-size lists inside lists)."""
        batches = reader.iter_batches(batch_size=_BATCH_ROWS, columns=self.names)
        while True:
            try:
                batch = next(batches)
            except StopIteration:
                return
            except self.pa.ArrowException as error:
                raise ConversionError(f"{path}: pyarrow {self.pa.__version__} cannot read the rows from row "
                                      f"{row()} on: {error}") from None
            yield batch

    def _last_end(self, position: int) -> tuple[int, int]:
        file, first_row = self._yielded[-1]
        return file, first_row + position - self._run_starts[-1]

    def _skip(self, source: str, reason: str) -> None:
        if self.on_error == "fail":
            raise ConversionError(f"{source}: {reason} (on_error='skip', --on-error skip, leaves such rows out)")
        self.skipped.append(SkippedSource(source, reason))

    def _values(self, column: Any, plan: _Plan, name: str) -> list[Any]:
        pa = self.pa
        if plan.kind in ("image", "bytes") and _is_text(column.type, pa):
            values = [None if value is None else value.encode("utf-8") for value in column.to_pylist()]
        elif plan.kind in ("image", "bytes"):
            values = _binary_values(column, pa)
        elif plan.kind == "ndarray":
            values = fixed_arrays(column, plan.dtype, plan.shape, pa)
        elif plan.kind == "ragged":
            values = ragged_arrays(column, plan.dtype, plan.shape, pa)
        elif plan.kind == "json":
            values = _json_values(column, pa)
        else:
            values = column.to_pylist()
            if plan.dtype is not None:  # a HF Value feature declares another dtype: each value must fit it
                values = _declared_values(column, values, plan.dtype, pa)
        if plan.kind != "json":
            what = {"image": "image", "ragged": "list"}.get(plan.kind, f"{plan.kind} value")
            values = [BadValue(f"column {name!r}: the {what} is null") if value is None else
                      BadValue(f"column {name!r}: {value.reason}") if isinstance(value, BadValue) else value
                      for value in values]
        return values


def _declared_values(column: Any, values: list[Any], dtype: np.dtype, pa: Any) -> list[Any]:
    """``values`` with a BadValue for each one the declared ``dtype`` cannot hold (see ``fitted``)."""
    if pa.types.is_dictionary(column.type):
        column = column.dictionary_decode()
    raw = column.fill_null(False if pa.types.is_boolean(column.type) else 0).to_numpy(zero_copy_only=False)
    _, bad = fitted(raw, dtype)
    if bad is None:
        return values
    bad &= column.is_valid().to_numpy(zero_copy_only=False)
    return [BadValue(f"holds {value!r}, which the declared dtype {dtype} cannot hold") if wrong else value
            for value, wrong in zip(values, bad)]


def _json_values(column: Any, pa: Any) -> list[Any]:
    types = pa.types
    if types.is_dictionary(column.type):
        column = column.dictionary_decode()
    if types.is_temporal(column.type) or types.is_decimal(column.type):  # ISO 8601 text; decimals exactly
        return [None if value is None else value.isoformat() if hasattr(value, "isoformat") else str(value)
                for value in column.to_pylist()]
    return column.to_pylist()  # NaN stays NaN: JSONField refuses it, naming the row (never a silent null)
