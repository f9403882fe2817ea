"""Encoding samples into data-table rows and payloads: the part of writing that runs in worker processes.

A chunk is a list of consecutive samples; encoding it returns the rows (already in the data table's dtype)
and every payload, in order. The parent process alone decides where payloads go in the file, so the file
does not depend on which worker encoded what.

What happened to single samples travels back with the chunk as :class:`SampleProblem` entries: samples left
out because their value could not be read or encoded (only when the writer skips them, ``on_error="skip"``),
and what :func:`warn_sample` reported while a sample was read or encoded. The report is collected in a context
variable set around each sample, not through the ``warnings`` module, whose capture is process-wide (two
writers encoding in threads of one process would swap each other's warnings filters).
"""

from __future__ import annotations

import contextvars
import dataclasses
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from beton.errors import BetonError, DatasetError, EncodeError, error_context, locate
from beton.fields.base import EncodeContext, Encoded, Field

__all__ = ["SampleWarning", "SampleProblem", "sample_problem", "warn_sample", "EncodeSpec", "EncodedChunk",
           "ChunkItem", "encode_chunk", "encode_value"]


class SampleWarning(UserWarning):
    """What :func:`warn_sample` issues when no write is collecting warnings."""


# The warnings of the sample being encoded in this thread (None outside encoding): a ContextVar, so that writers
# running in several threads of one process each collect their own.
_SAMPLE_WARNINGS: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("beton_sample_warnings",
                                                                                     default=None)


def warn_sample(message: str) -> None:
    """Report something about the sample being written that did not stop it (an alpha channel dropped, say).

    Called from a dataset's ``__getitem__`` or a field's ``encode`` during a write, the message goes to the
    write's :class:`~beton.storage.writer.WriteReport` with the sample's index, and is not printed; anywhere
    else it is issued as a :class:`SampleWarning`.
    """
    collected = _SAMPLE_WARNINGS.get()
    if collected is None:
        warnings.warn(SampleWarning(message), stacklevel=2)
    else:
        collected.append(str(message))


@dataclasses.dataclass(frozen=True)
class SampleProblem:
    """A sample that was skipped, or that warned (:class:`SampleWarning`), while it was written."""

    index: int  # in the dataset (an iterable's: the position it came at)
    kind: str  # the exception's or warning's class name (for a DatasetError, the dataset's own exception's)
    message: str  # without the location (file, sample), which the index and field give
    field: str | None = None  # the field being encoded, when known

    def describe(self) -> str:
        """The problem in words, e.g. "field 'image': JPEG is truncated..." or "OSError: [Errno 2] ..."."""
        where = f"field {self.field!r}: " if self.field else ""
        return where + (self.message if self.kind in _SELF_EXPLAINING else f"{self.kind}: {self.message}")


_SELF_EXPLAINING = {"EncodeError", "DatasetError", "SampleWarning"}  # their messages need no class name


def sample_problem(index: int, error: BetonError) -> SampleProblem:
    """The problem a sample's DatasetError or EncodeError describes: a DatasetError by the dataset's own
    exception (its cause), which says what went wrong."""
    cause = error.__cause__ if isinstance(error, DatasetError) and error.__cause__ is not None else error
    message = Exception.__str__(cause) if isinstance(cause, BetonError) else str(cause)
    return SampleProblem(index, type(cause).__name__, message, error.field)


@dataclasses.dataclass(frozen=True)
class EncodeSpec:
    """Everything a worker needs to encode samples: the fields, the row dtype, the seed, the file name, whether
    samples that cannot be read or encoded are left out (``skip_errors``) instead of failing the write, and where
    the file starts in the dataset when it is one shard of it (``first_sample``)."""

    path: str
    names: tuple[str, ...]
    fields: tuple[Field, ...]
    data_dtype: np.dtype
    seed: int
    skip_errors: bool = False
    first_sample: int = 0  # where the file starts in the dataset, for a shard (EncodeContext.first_sample)

    @property
    def payload_fields(self) -> tuple[int, ...]:
        return tuple(i for i, field in enumerate(self.fields) if field.has_payload)


@dataclasses.dataclass
class EncodedChunk:
    """Encoded samples: rows of the data table and, per sample, one payload per payload field.

    ``num_items`` counts the chunk's samples before any was skipped (the next chunk starts that many positions
    on); ``skipped`` and ``warned`` say what happened to single samples.
    """

    first_position: int
    rows: np.ndarray
    payloads: list[list[bytes]]
    num_items: int = -1  # -1: as many as rows
    skipped: list[SampleProblem] = dataclasses.field(default_factory=list)
    warned: list[SampleProblem] = dataclasses.field(default_factory=list)
    #: where each row was encoded (its ChunkItem.position), when a sample of the chunk was skipped; else None
    #: (row r was encoded at first_position + r)
    positions: np.ndarray | None = None

    def encoded_positions(self) -> np.ndarray:
        """The position each row was encoded at (``EncodeContext.sample``), before any skipped sample moved it."""
        if self.positions is not None:
            return self.positions
        return self.first_position + np.arange(len(self.rows), dtype=np.int64)

    def __post_init__(self) -> None:
        if self.num_items < 0:
            self.num_items = len(self.rows)


@dataclasses.dataclass(frozen=True)
class ChunkItem:
    """One sample to encode: its position in the file, its index in the dataset, and its value if known.

    Items of an indexed dataset carry no value (``fetch``): the worker reads ``dataset[dataset_index]``
    itself, so samples are not pickled twice.
    """

    position: int
    dataset_index: int
    value: Any = None
    fetch: bool = True


def encode_chunk(spec: EncodeSpec, dataset: Any, items: Sequence[ChunkItem]) -> EncodedChunk:
    rows, payloads, kept, skipped, warned = [], [], [], [], []
    for item in items:
        collected: list[str] = []
        token = _SAMPLE_WARNINGS.set(collected)
        try:
            sample = _fetch(spec, dataset, item)
            metadata, sample_payloads = _encode_sample(spec, sample, item)
        except (DatasetError, EncodeError) as error:  # the sample's own data; never a dead worker or Ctrl-C
            if not spec.skip_errors:
                raise
            skipped.append(sample_problem(item.dataset_index, error))
            continue
        finally:
            _SAMPLE_WARNINGS.reset(token)
            warned += [SampleProblem(item.dataset_index, SampleWarning.__name__, message) for message in collected]
        rows.append(metadata)
        payloads.append(sample_payloads)
        kept.append(item)
    positions = np.array([item.position for item in kept], np.int64) if skipped else None
    return EncodedChunk(items[0].position, _rows_array(spec, rows, kept), payloads, len(items), skipped, warned,
                        positions)


def _rows_array(spec: EncodeSpec, rows: list[tuple], items: Sequence[ChunkItem]) -> np.ndarray:
    try:
        return np.array(rows, dtype=spec.data_dtype)
    except (TypeError, ValueError, OverflowError):
        pass
    # Slow path, only to name the sample and field whose metadata does not fit: the same conversion, one value
    # at a time, each as a member of its record (converted alone, a list given for a record would broadcast).
    table = np.zeros(len(rows), spec.data_dtype)
    for position, (row, item) in enumerate(zip(rows, items)):
        for name, metadata in zip(spec.names, row):
            try:
                table[name][position] = metadata
            except (TypeError, ValueError, OverflowError) as error:
                raise locate(EncodeError(f"metadata {metadata!r} does not fit dtype {spec.data_dtype[name]}: {error}"),
                             path=spec.path, sample=item.dataset_index, field=name) from None
    return table


def _fetch(spec: EncodeSpec, dataset: Any, item: ChunkItem) -> Any:
    if not item.fetch:
        return item.value
    try:
        return dataset[item.dataset_index]
    except Exception as error:
        raise dataset_error(spec.path, item.dataset_index, error) from error


def dataset_error(path: str, dataset_index: int, error: BaseException) -> DatasetError:
    """The error for a dataset (indexed or iterable) that raised while the writer read sample ``dataset_index``."""
    return locate(DatasetError(f"the dataset raised {type(error).__name__}: {error}"), path=path,
                  sample=dataset_index)


def _encode_sample(spec: EncodeSpec, sample: Any, item: ChunkItem) -> tuple[tuple, list[bytes]]:
    with error_context(path=spec.path, sample=item.dataset_index):
        if not isinstance(sample, (tuple, list)) or len(sample) != len(spec.fields):
            got = f"{type(sample).__name__} of length {len(sample)}" if isinstance(sample, (tuple, list)) \
                else type(sample).__name__
            raise EncodeError(f"expected a tuple of {len(spec.fields)} values {spec.names}, got {got}")
        metadata = []
        payloads = []
        for field_index, (name, field, value) in enumerate(zip(spec.names, spec.fields, sample)):
            context = EncodeContext(item.position, field_index, spec.seed, spec.first_sample)
            with error_context(field=name):
                encoded = encode_value(field, value, context)
            metadata.append(encoded.metadata)
            if field.has_payload:
                payload = encoded.payload
                payloads.append(payload if isinstance(payload, bytes) else memoryview(payload).cast("B").tobytes())
        return tuple(metadata), payloads


def encode_value(field: Field, value: Any, context: EncodeContext) -> Encoded:
    """``field.encode(value, context)`` as the writer calls it: a user field's exception or a payload that
    contradicts ``has_payload`` becomes an EncodeError."""
    try:
        encoded = field.encode(value, context)
    except BetonError:
        raise
    except Exception as error:  # a user field's bug: still say which sample and field
        raise EncodeError(f"{type(field).__name__}.encode raised {type(error).__name__}: {error}") from error
    if field.has_payload and encoded.payload is None:
        raise EncodeError(f"{type(field).__name__}.encode returned no payload")
    if not field.has_payload and encoded.payload is not None:
        raise EncodeError(f"{type(field).__name__}.encode returned a payload but has_payload is False")
    return encoded
