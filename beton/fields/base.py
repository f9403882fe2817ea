"""The Field extension point: what one column of a dataset is, how to store it and how to read it back.

A field has two parts on disk:

* **metadata**: a small fixed-width record (``metadata_dtype``) stored in the data table, one per sample;
  for an integer label that record *is* the value;
* **payload** (optional, ``has_payload``): a variable-size byte string stored in the heap pages, whose offset
  and size the allocation table keeps (arrays, bytes, JSON, images).

Writing a new modality means subclassing :class:`Field`::

    @dataclasses.dataclass(frozen=True)
    class AudioField(Field):
        sample_rate: int

        metadata_dtype = np.dtype([("num_frames", "<u4")])
        has_payload = True

        def encode(self, value, context):
            pcm = np.ascontiguousarray(value, dtype="<i2")
            return Encoded(metadata=(len(pcm),), payload=pcm.tobytes())

        def to_python(self, metadata, payload):
            return np.frombuffer(payload, "<i2").copy()

        def arguments(self):
            return {"sample_rate": self.sample_rate}

The file stores the class's type name (``module.QualifiedName``), its ``arguments()`` as JSON and its metadata
dtype. A reader never imports that name (files are untrusted input): it finds the class among those the
program vouches for - ``beton.fields.register(AudioField)``, ``custom_fields={"audio": AudioField}`` or a
``beton.fields`` entry point (see :mod:`beton.fields.registry`).

A subclass may instead follow FFCV's field contract (``metadata_type``, ``encode(destination, value, malloc)``,
``to_binary``/``from_binary``, ``get_decoder_class``): beton stores and reads it through
:class:`beton.ffcv.fields.FFCVField`. A subclass of a built-in field may also override only ``encode`` FFCV's
way and call ``super().encode(destination, value, malloc)``: the built-ins' ``encode`` answers that call
(:func:`answers_ffcv_encode`), and :class:`beton.ffcv.fields.FFCVStyleSubclass` stores such a field.
"""

from __future__ import annotations

import abc
import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import numpy as np

from beton.errors import EncodeError, FieldError, PipelineError
from beton.limits import ReadLimits
from beton.pieces import Pieces
from beton.pipeline.operation import Operation
from beton.random import encode_rng

__all__ = ["Field", "Encoded", "EncodeContext", "UnknownField", "Pieces", "ARG_TYPE", "follows_ffcv_field_contract",
           "answers_ffcv_encode"]

#: FFCV's type of a field's stored arguments (``to_binary``'s result, ``from_binary``'s argument): 1024 bytes.
ARG_TYPE = np.dtype([("", "<u1", 1024)])
_FFCV_FIELD_METHODS = ("to_binary", "from_binary", "get_decoder_class")


@dataclasses.dataclass(frozen=True)
class Encoded:
    """One encoded value: a tuple for the metadata record and optional payload bytes."""

    metadata: tuple = ()
    payload: bytes | bytearray | memoryview | None = None


@dataclasses.dataclass(frozen=True)
class EncodeContext:
    """Where a value is being encoded; ``rng()`` gives randomness that depends only on this place.

    Encoding may run in any worker process in any order; keying the generator by (writer seed, sample
    position, field position) is what makes the written file identical whatever ``num_workers`` is.

    ``sample`` is the position in the file being written; ``first_sample`` is where that file starts in the
    whole dataset when it is one shard of it (``DatasetWriter.from_indexed_dataset(shard=...)``), else 0. The
    generator is keyed by the position in the dataset, ``first_sample + sample``, so that shards written apart
    and merged hold what one write of the dataset holds.
    """

    sample: int
    field: int
    seed: int
    first_sample: int = 0

    @property
    def dataset_sample(self) -> int:
        """The sample's position in the whole dataset (in the file, for a file that is not a shard)."""
        return self.first_sample + self.sample

    def rng(self) -> np.random.Generator:
        return encode_rng(self.seed, self.dataset_sample, self.field)


class Field(abc.ABC):
    """Base class of every field. Subclasses are immutable and fully described by ``arguments()``."""

    #: Name stored in the file. Built-in fields use short names ("beton.IntField"); by default a subclass is
    #: stored as "module.QualifiedName", the name a reader looks up among registered classes.
    type_name: ClassVar[str | None] = None
    #: Fixed-width record stored per sample in the data table (little-endian, no objects).
    metadata_dtype: ClassVar[np.dtype] = np.dtype([])
    #: Whether each sample also stores a variable-size payload in the heap.
    has_payload: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # FFCV's field contract has no to_python; a class written to it gives Reader[i] its stored form unless
        # it defines one. Set before ABCMeta collects the abstract methods, so such a class can be instantiated.
        if follows_ffcv_field_contract(cls) and getattr(cls.to_python, "__isabstractmethod__", False):
            cls.to_python = _stored_form

    @classmethod
    def stored_type_name(cls) -> str:
        return cls.type_name or f"{cls.__module__}.{cls.__qualname__}"

    @abc.abstractmethod
    def encode(self, value: Any, context: EncodeContext) -> Encoded:
        """Turn one sample's value into its metadata tuple and payload; raise EncodeError if it does not fit."""

    @abc.abstractmethod
    def to_python(self, metadata: np.void, payload: np.ndarray | None) -> Any:
        """Turn a stored record (and payload bytes as a uint8 array) back into the value, as a new object."""

    def arguments(self) -> dict[str, Any]:
        """The constructor's keyword arguments as a JSON-serialisable dict."""
        return {}

    def prepare_encoding(self) -> None:
        """Called once by the writer before its encoding processes start: compile what ``encode`` runs, so that
        each process loads it from numba's disk cache instead of compiling it again at the same time."""

    # Grouped page layout (optional): a field whose payload splits into pieces of increasing importance (the
    # scans of a progressive JPEG) may ask the writer to store, within each page, every sample's first piece,
    # then every sample's second piece, and so on, so that reading the first k pieces of all samples of a page
    # reads a prefix of the page. The allocation then spans the sample's pieces (other samples' pieces
    # interleaved), and the metadata records where each piece starts.

    def layout_pieces(self, metadata: np.void) -> list[int] | None:
        """End offsets (in the encoded payload) of the pieces to group; None stores the payload contiguously.
        Bytes after the last end are not stored."""
        return None

    def record_piece_starts(self, metadata: np.void, starts: list[int]) -> None:
        """Record where the writer put each piece, relative to the allocation's offset (metadata is writable)."""
        raise NotImplementedError(f"{type(self).__name__} groups pieces but cannot record where they went")

    def read_pieces(self, records: np.ndarray, setting: int | None) -> Pieces | None:
        """The parts of each sample's allocation a decoder reads at ``setting`` (progressive fidelity: scans to
        read, None: all), when that is less than the whole allocation; None reads whole allocations.

        The memory layers ask this (never the field's codec) to read only those parts of a page and to hand the
        decoder the pieces laid end to end, followed by ``Pieces.trailer``.
        """
        return None

    def lengths(self, records: np.ndarray, sizes: np.ndarray | None) -> np.ndarray | None:
        """Each sample's length (rows of a ragged array, bytes of a byte string) from its stored record and
        payload size, for length-aware orders and statistics; None for fields without one."""
        return None

    def modes(self, records: np.ndarray) -> np.ndarray | None:
        """Each sample's storage mode, for ``OrderOption.BALANCED``, which gives every batch the same share of
        mode 0 (stored uncompressed: cheap to decode, many bytes; other modes are compressed, as an image stored
        raw or as JPEG); None for fields stored one way only."""
        return None

    def summary(self, records: np.ndarray) -> list[str]:
        """Lines ``beton info`` prints about this field's samples (``records``: its data-table column, at least
        one record), beside the payload sizes it prints for every field; none by default."""
        return []

    # Reading: what a field decodes to when the user gives no pipeline for it.

    def default_pipeline(self) -> list[Operation]:
        """The operations a Loader runs for this field when ``pipelines=`` names none: its decoder, usually
        followed by ``ToTensor``. Fields without a default raise PipelineError, so users must give a pipeline."""
        raise PipelineError(f"field type {self.stored_type_name()} has no default decoder; give a pipeline for it")

    # Records that hold their own sample's place in the file (FFCV's payload pointers, see beton.ffcv.fields)
    # follow their sample when it moves: a sample skipped before it, shards merged before it.

    #: Whether :meth:`move_records` changes anything: the writer and ``beton merge`` skip the others.
    holds_sample_places: ClassVar[bool] = False

    def move_records(self, records: np.ndarray, offset: int) -> None:
        """Renumber, in place, what ``records`` (a writable array of this field's records) hold of their own
        samples' places in the file, for records moved ``offset`` samples on. beton's fields hold no such thing."""

    # Files are untrusted input (an attacker can re-sign every checksum): before anything reads a field, the
    # reader shows it every stored record, so that decoders - compiled kernels included - may trust them.

    def check_records(self, records: np.ndarray, sizes: np.ndarray | None, limits: ReadLimits) -> None:
        """Raise FormatError (with ``sample`` set) for the first stored record this field cannot read safely.

        Called when a file opens, with this field's whole data-table column and its payload sizes (None without
        payload): keep it to vectorised checks of what decoding trusts (sizes it allocates, indices it follows).
        """

    def check_payloads(self, records: np.ndarray, sizes: np.ndarray | None) -> None:
        """Like :meth:`check_records`, for checks that :func:`beton.storage.verify` runs and opening does not (decoders
        check these per sample anyway)."""

    @classmethod
    def from_arguments(cls, arguments: Mapping[str, Any]) -> Field:
        return cls(**arguments)

    def describe(self) -> str:
        arguments = ", ".join(f"{key}={value!r}" for key, value in self.arguments().items())
        return f"{type(self).__name__}({arguments})"


def follows_ffcv_field_contract(field: Any) -> bool:
    """Whether ``field`` (an object or a class) is written to FFCV's field contract rather than beton's."""
    return all(callable(getattr(field, name, None)) for name in _FFCV_FIELD_METHODS)


def answers_ffcv_encode(encode: Callable[[Any, Any, EncodeContext], Encoded]) -> Callable[..., Any]:
    """Make a built-in field's ``encode(value, context)`` also answer FFCV's built-in fields' call
    ``encode(destination, value, malloc)``, which a user's subclass written in FFCV's style makes through
    ``super().encode(destination, value, malloc)``.

    Called that way it encodes ``value`` as beton does, writes the metadata record into ``destination`` (a
    one-record array of the field's ``metadata_dtype``) and the payload into the buffer ``malloc(size)`` returns.
    ``malloc`` must be the one beton's writer gave (:class:`beton.ffcv.fields.FFCVStyleSubclass`): it carries the
    sample's :class:`EncodeContext`, from which beton's fields draw their randomness.
    """

    @functools.wraps(encode)
    def either(self: Field, *arguments: Any, **keywords: Any) -> Any:
        if len(arguments) != 3 or keywords:
            return encode(self, *arguments, **keywords)
        destination, value, malloc = arguments
        context = getattr(malloc, "context", None)
        if not isinstance(context, EncodeContext):
            raise EncodeError(f"{type(self).__name__}.encode(destination, value, malloc) is FFCV's call, which beton "
                              "answers inside a DatasetWriter only (its malloc carries the sample's place)")
        encoded = encode(self, value, context)
        if self.metadata_dtype.names:
            destination[0] = encoded.metadata
        if encoded.payload is not None:
            _, buffer = malloc(len(encoded.payload))
            buffer[:] = np.frombuffer(encoded.payload, np.uint8)

    return either


def _stored_form(self: Field, metadata: np.void, payload: np.ndarray | None) -> tuple[Any, bytes | None]:
    """The ``to_python`` of fields written to FFCV's contract: a copy of the metadata record and the payload
    bytes (None without a payload)."""
    return metadata.copy(), None if payload is None else payload.tobytes()


@dataclasses.dataclass(frozen=True)
class UnknownField(Field):
    """Stands in for a stored field whose class cannot be found, so the file can still be inspected."""

    stored_name: str
    stored_arguments: Mapping[str, Any]
    stored_metadata_dtype: np.dtype
    stored_has_payload: bool
    reason: str

    def encode(self, value: Any, context: EncodeContext) -> Encoded:
        raise FieldError(f"cannot write field type {self.stored_name!r}: {self.reason}")

    def to_python(self, metadata: np.void, payload: np.ndarray | None) -> Any:
        raise FieldError(f"cannot decode field type {self.stored_name!r}: {self.reason}")

    def arguments(self) -> dict[str, Any]:
        return dict(self.stored_arguments)

    def default_pipeline(self) -> list[Operation]:
        raise PipelineError(self.reason)

    def describe(self) -> str:
        return f"<unknown {self.stored_name}>({self.stored_arguments})"
