"""Fields written to FFCV's field contract, stored and read by beton.

FFCV's contract (with beton, subclass :class:`beton.fields.Field` as FFCV fields subclass ``ffcv.fields.Field``):

* ``metadata_type``: the numpy dtype of the field's per-sample metadata record (a property);
* ``encode(destination, value, malloc)``: fill ``destination`` (a one-record array of ``metadata_type``) for
  ``value``; for a payload, ``pointer, buffer = malloc(size)`` gives a writable uint8 buffer to fill and the
  pointer to keep in the record (``destination['ptr'] = pointer``);
* ``to_binary() -> ARG_TYPE`` and ``@staticmethod from_binary(binary) -> Field``: the field's arguments as 1024
  bytes, and the field rebuilt from them;
* ``get_decoder_class()``: its decoder, an operation written to FFCV's contract whose ``generate_code()``
  returns ``decoder(batch_indices, destination, metadata, storage_state)`` and which reads a payload with
  ``self.memory_read(pointer, storage_state)`` (see :mod:`beton.ffcv.operations`).

:class:`FFCVField` adapts such a field onto beton's contract; the field registry (:data:`CONTRACT`, registered
by :mod:`beton.ffcv`) wraps one a :class:`~beton.storage.writer.DatasetWriter` is given
(:func:`beton.fields.registry.as_beton_field`), and rebuilds one a Reader opens
(:func:`beton.fields.registry.field_from_arguments`) when the program vouches for the class, as for every user field
(``custom_fields=`` or ``beton.fields.register``). How it is stored:

* the metadata record, as ``metadata_type`` (plain little-endian numbers), in the data table;
* the buffer ``malloc`` gave as the sample's payload (empty when the field calls no ``malloc``); one ``malloc``
  per sample, a second is an :class:`~beton.errors.EncodeError`;
* the pointer ``malloc`` returns is a handle of the sample, not a file offset (see
  :mod:`beton.ffcv.memory` for why); a record that called ``malloc`` must keep it in a 64-bit integer
  member, and no 64-bit integer member may hold a value in the pointer range other than the record's own
  sample's pointer (its own metadata being far below 2**62). The writer checks both for each sample, the reader
  for the whole file on open, so a decoder can only ever be given its own sample's pointer;
* ``to_binary()`` as the JSON argument ``{"binary": base64}`` (trailing zero bytes dropped), never pickle.

Reading: the Loader's default pipeline for the field is its decoder alone (numpy batches, as FFCV's loader
gives them); ``Reader[i]`` gives the class's ``to_python(metadata, payload)`` if it defines one, else the
record and the payload bytes.

**Subclasses of built-in fields written in FFCV's style** (:data:`SUBCLASS_CONTRACT`): FFCV's own fields follow
its contract, so an FFCV program may subclass one (``class StringField(NDArrayField)``), override only
``encode(self, destination, value, malloc)`` and call ``super().encode(destination, value, malloc)``.
:class:`FFCVStyleSubclass` stores such a field as the built-in it extends: the user's ``encode`` is called with a
record of the built-in's metadata and a ``malloc``, and the built-in's ``encode`` answers FFCV's call
(:func:`beton.fields.base.answers_ffcv_encode`). The file holds a plain built-in field (same type name and
arguments), so it opens without the class; given the class (``custom_fields=``), the field is rebuilt as the
built-in it extends, as FFCV's inherited ``from_binary`` does.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import inspect
import operator
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from beton import dtypes
from beton.errors import BetonError, EncodeError, FieldError, PipelineError, first_bad_record
from beton.fields.base import ARG_TYPE, EncodeContext, Encoded, Field, follows_ffcv_field_contract
from beton.fields.registry import FieldContract
from beton.limits import ReadLimits
from beton.ffcv.operations import FFCVOperation, follows_ffcv_contract
from beton.ffcv.memory import POINTER_BASE, POINTER_SPAN, pointer_of
from beton.pipeline.operation import Operation

__all__ = ["FFCVField", "CONTRACT", "FFCVStyleSubclass", "SUBCLASS_CONTRACT", "move_pointers"]

#: The longest base64 text 1024 bytes encode to.
_MAX_ARGUMENT_TEXT = 4 * -(-ARG_TYPE.itemsize // 3)


@dataclasses.dataclass(frozen=True)
class FFCVField(Field):
    """A field written to FFCV's contract (``field``), stored and read as a beton field (module docstring)."""

    field: Field
    has_payload = True
    holds_sample_places = True

    def __post_init__(self) -> None:
        name = type(self.field).__name__
        if not (isinstance(self.field, Field) and follows_ffcv_field_contract(self.field)):
            raise FieldError(f"{name} is not written to FFCV's field contract, or does not subclass "
                             "beton.fields.Field (as FFCV fields subclass ffcv.fields.Field)")
        try:
            dtype = np.dtype(self.field.metadata_type)
            dtypes.check_metadata_dtype(dtype)
        except (TypeError, ValueError, AttributeError) as error:
            raise FieldError(f"{name}.metadata_type must be a numpy dtype of little-endian numbers: {error}") \
                from None
        object.__setattr__(self, "metadata_dtype", dtype)  # per instance: FFCV's metadata_type is a property
        self.binary()  # to_binary's result is checked now, not when the file is complete

    def stored_type_name(self) -> str:  # type: ignore[override]  # the wrapped class's name, not this adapter's
        return type(self.field).stored_type_name()

    # ---- writing ------------------------------------------------------------------------------------------

    def encode(self, value: Any, context: EncodeContext) -> Encoded:
        destination, malloc = _encode_ffcv_way(self.field, self.metadata_dtype, value, context)
        pointers = _pointers(destination, np.array([context.sample], np.int64))
        if pointers.foreign[0] >= 0:
            raise EncodeError(f"{pointers.foreign_text(0)}: a value in the range beton reserves for payload "
                              "pointers [2**62, 2**62 + 2**48); only the pointer malloc returned may be stored there")
        if malloc.buffer is not None and not pointers.own[0]:
            raise EncodeError(f"{type(self.field).__name__}.encode called malloc but kept the pointer it returned "
                              "in no 64-bit integer member of its metadata (as destination['ptr'] = pointer): "
                              "its decoder would find no payload")
        return Encoded(metadata=destination[0], payload=b"" if malloc.buffer is None else malloc.buffer.tobytes())

    def arguments(self) -> dict[str, Any]:
        return {"binary": base64.b64encode(self.binary().rstrip(b"\0")).decode("ascii")}

    def binary(self) -> bytes:
        """``to_binary()`` of the wrapped field as FFCV's 1024 bytes (a shorter result is padded with zeros)."""
        name = type(self.field).__name__
        value = self.field.to_binary()
        if isinstance(value, (bytes, bytearray, memoryview)):
            data = bytes(value)
        elif isinstance(value, (np.ndarray, np.generic)) and not np.asarray(value).dtype.hasobject:
            data = value.tobytes()
        else:
            raise FieldError(f"{name}.to_binary() must return numpy data or bytes (FFCV's ARG_TYPE), got "
                             f"{type(value).__name__}")
        if len(data) > ARG_TYPE.itemsize:
            raise FieldError(f"{name}.to_binary() gave {len(data)} bytes; FFCV's ARG_TYPE holds "
                             f"{ARG_TYPE.itemsize}")
        return data.ljust(ARG_TYPE.itemsize, b"\0")

    # ---- reading ------------------------------------------------------------------------------------------

    @classmethod
    def from_binary_of(cls, field_class: type[Field], arguments: Mapping[str, Any]) -> FFCVField:
        """The field of ``field_class`` rebuilt by its ``from_binary`` from the stored ``arguments``."""
        name = field_class.__name__
        text = arguments.get("binary") if set(arguments) == {"binary"} else None
        if not isinstance(text, str) or len(text) > _MAX_ARGUMENT_TEXT:
            raise FieldError(f"{name} is written to FFCV's field contract: its stored arguments must be "
                             f"{{'binary': <base64 of at most {ARG_TYPE.itemsize} bytes>}}, got keys "
                             f"{sorted(arguments)}")
        try:
            data = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            raise FieldError(f"{name}: the stored binary arguments are not base64") from None
        if len(data) > ARG_TYPE.itemsize:
            raise FieldError(f"{name}: the stored binary arguments are {len(data)} bytes, more than "
                             f"{ARG_TYPE.itemsize}")
        binary = np.frombuffer(data.ljust(ARG_TYPE.itemsize, b"\0"), np.uint8).copy()
        try:
            field = field_class.from_binary(binary)
        except BetonError:
            raise
        except Exception as error:  # the class's code, given the file's bytes
            raise FieldError(f"{name}.from_binary raised {type(error).__name__}: {error}") from error
        if not isinstance(field, field_class):
            raise FieldError(f"{name}.from_binary returned {type(field).__name__}, not a {name}")
        return cls(field)

    def move_records(self, records: np.ndarray, offset: int) -> None:
        move_pointers(records, offset)

    def check_records(self, records: np.ndarray, sizes: np.ndarray | None, limits: ReadLimits) -> None:
        pointers = _pointers(records, np.arange(len(records), dtype=np.int64))
        first_bad_record(pointers.foreign >= 0, lambda s: f"{pointers.foreign_text(s)}, not its own")
        if sizes is not None:
            first_bad_record((sizes > 0) & ~pointers.own, lambda s: (
                f"the sample has a {int(sizes[s])}-byte payload but its metadata holds no pointer to it"))

    def default_pipeline(self) -> list[Operation]:
        decoder = self.field.get_decoder_class()
        if not (isinstance(decoder, type) and follows_ffcv_contract(decoder)):
            raise PipelineError(f"{type(self.field).__name__}.get_decoder_class() must return an Operation class "
                                f"written to FFCV's contract, got {decoder!r}")
        return [FFCVOperation(decoder())]

    def to_python(self, metadata: np.void, payload: np.ndarray | None) -> Any:
        return self.field.to_python(metadata, payload)

    def describe(self) -> str:
        return f"{type(self.field).__name__} (FFCV contract)"


@dataclasses.dataclass(frozen=True)
class FFCVStyleSubclass(Field):
    """A subclass of a built-in field whose ``encode`` is FFCV's (module docstring), stored as that built-in."""

    field: Field

    def __post_init__(self) -> None:
        # per instance, as the built-in's (an image field's metadata depends on nothing, but a user's may)
        object.__setattr__(self, "metadata_dtype", self.field.metadata_dtype)
        object.__setattr__(self, "has_payload", self.field.has_payload)

    def stored_type_name(self) -> str:  # type: ignore[override]  # the built-in's name: the file holds one
        return _builtin_of(type(self.field)).stored_type_name()

    def arguments(self) -> dict[str, Any]:
        return self.field.arguments()

    def encode(self, value: Any, context: EncodeContext) -> Encoded:
        destination, malloc = _encode_ffcv_way(self.field, self.metadata_dtype, value, context)
        if self.has_payload and malloc.buffer is None:
            raise EncodeError(f"{type(self.field).__name__}.encode stored no payload: call "
                              "super().encode(destination, value, malloc)")
        return Encoded(metadata=destination[0] if self.metadata_dtype.names else (),
                       payload=None if malloc.buffer is None else malloc.buffer.tobytes())

    def layout_pieces(self, metadata: np.void) -> list[int] | None:
        return self.field.layout_pieces(metadata)

    def record_piece_starts(self, metadata: np.void, starts: list[int]) -> None:
        self.field.record_piece_starts(metadata, starts)

    def default_pipeline(self) -> list[Operation]:
        return self.field.default_pipeline()

    def to_python(self, metadata: np.void, payload: np.ndarray | None) -> Any:
        return self.field.to_python(metadata, payload)

    def describe(self) -> str:
        return f"{type(self.field).__name__} (FFCV-style subclass of {_builtin_of(type(self.field)).__name__})"

    @staticmethod
    def rebuild(field_class: type[Field], arguments: Mapping[str, Any]) -> Field:
        """The field a file stores for ``field_class``: the built-in it extends (FFCV's ``from_binary``, which a
        subclass inherits, also builds the built-in)."""
        return _builtin_of(field_class).from_arguments(arguments)


def speaks_ffcv_encode(field: Any) -> bool:
    """Whether ``field`` (an object or a class) subclasses a beton field whose ``encode`` is beton's, overriding
    it with FFCV's ``encode(destination, value, malloc)``, without the rest of FFCV's field contract."""
    cls = field if isinstance(field, type) else type(field)
    return issubclass(cls, Field) and not follows_ffcv_field_contract(cls) and \
        _encode_arity(cls.encode) == 3 and _builtin_of(cls) is not None


def _builtin_of(cls: type[Field]) -> type[Field] | None:
    """The nearest ancestor of ``cls`` that defines beton's ``encode(value, context)``."""
    return next((base for base in cls.__mro__[1:] if issubclass(base, Field) and base is not Field
                 and "encode" in vars(base) and _encode_arity(base.encode) == 2), None)


def _encode_arity(encode: Any) -> int | None:
    """How many arguments ``encode`` needs after ``self``: 2 for beton's, 3 for FFCV's (None: no signature to
    read). Parameters with defaults do not count, so a beton ``encode`` with options stays beton's."""
    try:
        parameters = list(inspect.signature(encode).parameters.values())[1:]
    except (TypeError, ValueError):
        return None
    if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in parameters):
        return None
    return sum(p.default is p.empty for p in parameters)


def _encode_ffcv_way(field: Field, metadata_dtype: np.dtype, value: Any,
                     context: EncodeContext) -> tuple[np.ndarray, _Malloc]:
    """Call a field's FFCV-style ``encode(destination, value, malloc)``: its filled record and its malloc."""
    destination = np.zeros(1, metadata_dtype)
    malloc = _Malloc(pointer_of(context.sample), context)
    try:
        field.encode(destination, value, malloc)
    except BetonError:
        raise
    except Exception as error:  # the user's field: say which one, the writer adds sample and field name
        raise EncodeError(f"{type(field).__name__}.encode raised {type(error).__name__}: {error}") from error
    return destination, malloc


class _Malloc:
    """FFCV's ``malloc`` for one sample and field: one zeroed payload buffer, and the sample's pointer. It
    carries the sample's ``context``, for a built-in field's ``encode`` called FFCV's way
    (:func:`beton.fields.base.answers_ffcv_encode`)."""

    def __init__(self, pointer: int, context: EncodeContext) -> None:
        self.pointer = pointer
        self.context = context
        self.buffer: np.ndarray | None = None

    def __call__(self, size: Any) -> tuple[int, np.ndarray]:
        if self.buffer is not None:
            raise EncodeError("malloc called a second time for one sample: beton stores one payload per sample "
                              "and field")
        try:
            size = operator.index(size)
        except TypeError:
            raise EncodeError(f"malloc needs an integer size, got {size!r}") from None
        if size < 0:
            raise EncodeError(f"malloc needs a size of at least 0, got {size}")
        self.buffer = np.zeros(size, np.uint8)
        return self.pointer, self.buffer


@dataclasses.dataclass(frozen=True)
class _Pointers:
    """What the 64-bit integer members of some records hold, per record."""

    foreign: np.ndarray  # the sample whose pointer a member holds though it is not the record's own; -1: none
    member: np.ndarray  # the member holding that foreign pointer (str objects)
    own: np.ndarray  # whether some member holds the record's own pointer

    def foreign_text(self, index: int) -> str:
        return f"{self.member[index]} holds the payload pointer of sample {int(self.foreign[index])}"


def _pointers(records: np.ndarray, samples: np.ndarray) -> _Pointers:
    """Which pointers the records of ``samples`` hold (values in the pointer range, see the module docstring)."""
    own = (POINTER_BASE + samples)[:, None]
    rows = np.arange(len(records))
    foreign = np.full(len(records), -1, np.int64)
    members = np.full(len(records), "", object)
    holds = np.zeros(len(records), bool)
    for name, values in _integer_members(records):
        alien = (values >= POINTER_BASE) & (values < POINTER_BASE + POINTER_SPAN) & (values != own)
        first = alien.any(axis=1) & (foreign < 0)  # the first member wins
        foreign = np.where(first, values[rows, np.argmax(alien, axis=1)] - POINTER_BASE, foreign) \
            if values.shape[1] else foreign
        members[first] = name
        holds |= (values == own).any(axis=1)
    return _Pointers(foreign, members, holds)


def move_pointers(records: np.ndarray, offset: int) -> None:
    """Renumber, in place, the pointers that ``records`` (a writable array of an FFCV-contract field's records)
    hold, for records moved ``offset`` samples on in a file (``beton merge`` puts a shard's samples after those of
    the shards before it). The reader's check on open guarantees that every value in the pointer range is its own
    record's pointer, so adding ``offset`` to those values, and only those, renumbers exactly the pointers."""
    if records.dtype.names:
        for name in records.dtype.names:
            move_pointers(records[name], offset)
    elif records.dtype.kind in "iu" and records.dtype.itemsize == 8:
        values = records.astype(np.int64)  # as _integer_members reads them: a uint64 above 2**63 is no pointer
        pointers = (values >= POINTER_BASE) & (values < POINTER_BASE + POINTER_SPAN)
        moved = values[pointers] + offset
        if moved.size and (moved.min() < POINTER_BASE or moved.max() >= POINTER_BASE + POINTER_SPAN):
            raise FieldError(f"moving records {offset} samples takes a payload pointer out of the pointer range")
        records[pointers] = moved.astype(records.dtype)


def _integer_members(array: np.ndarray, path: tuple[str, ...] = ()) -> Iterator[tuple[str, np.ndarray]]:
    """(description, values as an int64 (records, elements) array) of every 64-bit integer member, nested and
    subarray members included. A uint64 value above 2**63 wraps negative: it is no pointer either way."""
    if array.dtype.names:
        for name in array.dtype.names:
            yield from _integer_members(array[name], (*path, name))
    elif array.dtype.kind in "iu" and array.dtype.itemsize == 8:
        elements = int(np.prod(array.shape[1:], dtype=np.int64))
        description = f"metadata member {'.'.join(path)!r}" if path else "the metadata record"
        yield description, array.reshape(len(array), elements).astype(np.int64)


#: FFCV's field contract, as the field registry adapts it (registered by :mod:`beton.ffcv`).
CONTRACT = FieldContract("ffcv", follows_ffcv_field_contract, FFCVField, FFCVField.from_binary_of)
#: Subclasses of built-in fields that override ``encode`` FFCV's way (registered by :mod:`beton.ffcv`).
SUBCLASS_CONTRACT = FieldContract("ffcv-subclass", speaks_ffcv_encode, FFCVStyleSubclass, FFCVStyleSubclass.rebuild)
