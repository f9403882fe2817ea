"""Encoding samples into data-table rows and payloads: the part of writing that runs in worker processes.

A chunk is a list of consecutive samples; encoding it returns the rows (already in the data table's dtype)
and every payload, in order. The parent process alone decides where payloads go in the file, so the file
does not depend on which worker encoded what.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from beton.errors import BetonError, DatasetError, EncodeError, error_context, locate
from beton.fields.base import EncodeContext, Field

@dataclasses.dataclass(frozen=True)
class EncodeSpec:
    """Everything a worker needs to encode samples: the fields, the row dtype, the seed, the file name."""

    path: str
    names: tuple[str, ...]
    fields: tuple[Field, ...]
    data_dtype: np.dtype
    seed: int

    @property
    def payload_fields(self) -> tuple[int, ...]:
        return tuple(i for i, field in enumerate(self.fields) if field.has_payload)


@dataclasses.dataclass
class EncodedChunk:
    """Encoded samples: rows of the data table and, per sample, one payload per payload field."""

    first_position: int
    rows: np.ndarray
    payloads: list[list[bytes]]


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
    rows = []
    payloads = []
    for item in items:
        sample = _fetch(spec, dataset, item)
        metadata, sample_payloads = _encode_sample(spec, sample, item)
        rows.append(metadata)
        payloads.append(sample_payloads)
    return EncodedChunk(items[0].position, _rows_array(spec, rows, items), payloads)


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
            with error_context(field=name):
                encoded = _encode_value(field, value, EncodeContext(item.position, field_index, spec.seed))
            metadata.append(encoded.metadata)
            if field.has_payload:
                payload = encoded.payload
                payloads.append(payload if isinstance(payload, bytes) else memoryview(payload).cast("B").tobytes())
        return tuple(metadata), payloads


def _encode_value(field: Field, value: Any, context: EncodeContext):
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
