"""Manifests: the ordered shards (``.beton`` files) of one dataset, and the small JSON file that lists them.

A :class:`Manifest` holds each shard's location (path or URL), sample count, the SHA-256 of its header and the
range of global sample indices it holds, plus the fields every shard has. Global sample ``g`` is sample
``g - shard.start`` of the shard whose ``[start, end)`` holds it (:meth:`Manifest.locate`, vectorised). A manifest
comes from a manifest file (:func:`read_manifest`) or is built in memory from files, URLs and globs
(:func:`beton.dataset.shards.dataset_manifest`): every way of naming a dataset of several files ends in this one
structure. Nothing here reads a shard's data: :meth:`Manifest.open_shard` opens one shard when asked and checks it
against what the manifest says, so a Loader can open shards lazily.

Why the header's hash identifies a shard: the header holds the SHA-256 of the digest table, which holds every
page's and table's digest, so a changed byte anywhere changes the header, and hashing 256 bytes costs nothing.
The file format (docs/format.md, "Manifest files")::

    {"format": "beton-manifest", "version": 1, "num_samples": 120,
     "tables": {"path": "train.tables", "sha256": "41d0...", "size": 58211840},
     "fields": [{"name": "image", "type": "beton.RGBImageField", "arguments": {...},
                 "metadata_dtype": [["mode", "|u1"], ...], "payload": true}, ...],
     "shards": [{"path": "train-00000-of-00003.beton", "num_samples": 40, "header_sha256": "9f2c..."}, ...]}

``tables`` (optional) names the manifest's tables file (:mod:`beton.dataset.tables_file`: every shard's header and
tables in one file, so that a dataset opens without reading its shards) and pins it by its SHA-256.

A manifest file is untrusted input, read with bounds: at most :data:`MAX_MANIFEST_BYTES`, JSON nesting at most
:data:`beton.bounded_json.MAX_JSON_DEPTH` levels (metadata dtypes 16), exactly the keys above (``tables`` may be absent),
counts that are integers in [0, 2**63) and add up to ``num_samples``, at least one shard, no shard listed twice.
A list of 100,000 plain entries (what ``beton index`` writes) is checked list by list, not entry by entry, by the
same rules, and the shards are kept as columns (:class:`Shards`): reading it takes a fraction of a second.

Shard paths in a manifest file (decided so that a manifest moves with its shards and names nothing but its shards;
docs/shards.md, "What a manifest may name"):

* an entry is resolved against the manifest's own directory (a local manifest's folder; for a manifest at a URL,
  the URL without its last segment, query and fragment: ``https://host/data/train.json`` + ``a/0.beton`` ->
  ``https://host/data/a/0.beton``) and normalised (``.``, ``..`` and empty segments), and must lie in that
  directory or below it. It is checked as written and percent-decoded (repeatedly; a decoded backslash counts
  as ``/``), since a server decodes ``%2e%2e/`` to ``../``: both readings must stay inside. An absolute path (for
  a local manifest) or a URL (same store and prefix, for a manifest at a URL) is allowed when it stays inside;
* never: chained URLs (``a::b``: ``simplecache::``, ``tar://x::...``, ...), wrapping or local protocols
  (``file://``, ``tar://``, ``zip://``, ``simplecache://``...), a backslash or NUL, and for a manifest at a URL any
  local path (a manifest from a store names shards on that store only);
* ``allow_outside=True`` (given to :func:`read_manifest` or ``dataset_manifest`` by whoever trusts the file)
  lifts only the "inside the directory" rule: then a local manifest may name any local path or a URL of a
  data store, a manifest at a URL any URL of a data store.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import operator
import os
import re
import tempfile
import urllib.parse
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from beton import bounded_json, dtypes
from beton.errors import FormatError, ShardError, error_context, locate
from beton.storage.file_builder import create_temporary
from beton.storage.local_file import open_regular
from beton.storage.reader import FieldDescriptor, Reader
from beton.storage.remote import RemoteOptions, is_http, is_url, remote_or_default
from beton.storage.remote.fetch import RangeFetcher
from beton.storage.remote.upload import upload_file

__all__ = ["Manifest", "Shard", "Shards", "TablesFile", "FieldSpec", "read_manifest", "parse_manifest", "field_specs",
           "fields_difference",
           "header_digest", "MANIFEST_FORMAT", "MANIFEST_VERSION", "MAX_MANIFEST_BYTES"]

MANIFEST_FORMAT = "beton-manifest"
MANIFEST_VERSION = 1
#: Largest manifest file read: about 300,000 shards at typical name lengths.
MAX_MANIFEST_BYTES = 64 * 1024 * 1024
_MAX_COUNT = 2**63  # sample counts are stored as u8 in headers; beyond int64 numpy index arrays would wrap
_SHA256 = re.compile(r"[0-9a-f]{64}")
#: fsspec protocols that name files of this machine: refused in manifest files (see the module docstring).
_LOCAL_PROTOCOLS = frozenset({"file", "local"})
#: fsspec protocols that open other files (caches, archives, references): never named by a manifest, even with
#: ``allow_outside`` (chained ``a::b`` URLs are refused before this; these refuse the unchained spelling too).
_WRAPPING_PROTOCOLS = frozenset({"simplecache", "blockcache", "filecache", "cached", "tar", "zip", "libarchive",
                                 "reference", "dir", "jlab", "jupyter"})
_TOP_KEYS = ("format", "version", "num_samples", "fields", "shards")
_OPTIONAL_TOP_KEYS = ("tables",)
_TABLES_KEYS = ("path", "sha256", "size")
_FIELD_KEYS = ("name", "type", "arguments", "metadata_dtype", "payload")
_SHARD_KEYS = ("path", "num_samples", "header_sha256")
_SHARD_KEY_SET = frozenset(_SHARD_KEYS)
#: A relative shard path of plain segments (letters, digits, '_', '-', '.', never first): nothing to decode or resolve.
_PLAIN_PATH = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]*(/[A-Za-z0-9_-][A-Za-z0-9_.-]*)*")
_PLAIN_CHARACTERS = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-./\n"
#: What plain paths one a line never hold: an empty segment or one that starts with '.'.
_NOT_PLAIN_PAIRS = ("//", "/.", "\n\n", "\n/", "/\n", "\n.")


# ---- fields --------------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class FieldSpec:
    """A field as every shard of a dataset must store it: name, stored type name, constructor arguments (as
    canonical JSON text: key order does not matter), metadata dtype, and whether it has a payload."""

    name: str
    type_name: str
    arguments_json: str
    metadata_dtype: np.dtype
    has_payload: bool

    @classmethod
    def from_descriptor(cls, descriptor: FieldDescriptor) -> FieldSpec:
        return cls(descriptor.name, descriptor.type_name, _canonical(descriptor.arguments), descriptor.metadata_dtype,
                   descriptor.has_payload)

    @property
    def arguments(self) -> dict[str, Any]:
        """The arguments as a new dict."""
        return json.loads(self.arguments_json)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "type": self.type_name, "arguments": self.arguments,
                "metadata_dtype": json.loads(dtypes.dtype_to_json(self.metadata_dtype)), "payload": self.has_payload}

    def describe(self) -> str:
        return f"{self.name!r} ({self.type_name} {self.arguments_json})"


def field_specs(descriptors: Mapping[str, FieldDescriptor]) -> tuple[FieldSpec, ...]:
    """The fields of a file (``Reader.descriptors``, ``FileHead.descriptors``), in the file's order."""
    return tuple(FieldSpec.from_descriptor(descriptor) for descriptor in descriptors.values())


def fields_difference(expected: Sequence[FieldSpec], got: Sequence[FieldSpec]) -> str | None:
    """The first difference between two files' fields, in words ("field 'label' has arguments ..."), or None when
    they are the same fields in the same order."""
    for number in range(max(len(expected), len(got))):
        if number >= len(got):
            return f"it has {len(got)} fields and lacks field {number}, {expected[number].describe()}"
        if number >= len(expected):
            return f"it has a field more than expected: field {number}, {got[number].describe()}"
        want, have = expected[number], got[number]
        if want.name != have.name:
            return f"field {number} is {have.name!r}, expected {want.name!r}"
        if want.type_name != have.type_name:
            return f"field {have.name!r} is a {have.type_name}, expected a {want.type_name}"
        if want.arguments_json != have.arguments_json:
            return f"field {have.name!r} ({have.type_name}) has {_argument_difference(want.arguments, have.arguments)}"
        if want.metadata_dtype != have.metadata_dtype:
            return (f"field {have.name!r} has metadata dtype {dtypes.dtype_to_json(have.metadata_dtype)}, expected "
                    f"{dtypes.dtype_to_json(want.metadata_dtype)}")
        if want.has_payload != have.has_payload:
            return f"field {have.name!r} {'has' if have.has_payload else 'has no'} payload, unlike the others"
    return None


def _argument_difference(want: dict[str, Any], have: dict[str, Any]) -> str:
    for key in sorted(set(want) | set(have)):
        if key not in have:
            return f"no argument {key!r}, expected {key}={_canonical(want[key])}"
        if key not in want:
            return f"argument {key}={_canonical(have[key])}, which the others lack"
        if _canonical(want[key]) != _canonical(have[key]):
            return f"argument {key}={_canonical(have[key])}, expected {key}={_canonical(want[key])}"
    return f"arguments {_canonical(have)}, expected {_canonical(want)}"  # pragma: no cover - equal after all


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def header_digest(header: bytes) -> str:
    """The SHA-256 (hex) of a beton file's 256 header bytes: what a manifest records to know a shard again."""
    return hashlib.sha256(header).hexdigest()


# ---- the manifest ---------------------------------------------------------------------------------------------

class Shard(NamedTuple):
    """One file of a dataset: where it is (``location``: a path or URL, ready to open), its samples, the SHA-256
    of its header, and the global indices ``[start, end)`` of its samples. (A named tuple: a manifest makes one
    per shard, 100,000 of them in a fraction of what as many dataclasses cost.)"""

    location: str
    num_samples: int
    header_sha256: str
    start: int

    @property
    def end(self) -> int:
        return self.start + self.num_samples


class Shards(Sequence[Shard]):
    """A manifest's shards in order, kept as columns (``locations``, ``digests``: tuples of strings; ``counts``,
    ``starts``: read-only int64 arrays): a :class:`Shard` is made when one is asked for, so a manifest of 100,000
    shards holds a few objects rather than 100,000 (which also cost the garbage collector a pass over each). A
    sequence: indexing, slicing (a new Shards, its ranges starting at 0), ``len``, iteration, equality."""

    def __init__(self, locations: Sequence[str], counts: Sequence[int], digests: Sequence[str]) -> None:
        self.locations, self.digests = tuple(locations), tuple(digests)
        try:
            self.counts = np.array(counts, np.int64).reshape(-1)
        except OverflowError:  # a count past int64 (a header's uint64, say)
            self.counts = None
        if self.counts is None or (self.counts < 0).any():
            number, count = next((k, int(c)) for k, c in enumerate(counts) if not 0 <= int(c) < 1 << 63)
            raise ShardError(f"shard {number} ({self.locations[number]!r}): a sample count must lie in [0, 2**63), "
                             f"got {count}")
        self.starts = np.concatenate([[0], np.cumsum(self.counts)]).astype(np.int64)
        if not len(self.locations) == len(self.counts) == len(self.digests):
            raise ValueError("shards are listed with one location, count and digest each")
        self.counts.flags.writeable = self.starts.flags.writeable = False

    def __len__(self) -> int:
        return len(self.locations)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return Shards(self.locations[index], self.counts[index], self.digests[index])
        number = range(len(self.locations))[index]  # IndexError as a tuple's, negative from the end
        return Shard(self.locations[number], int(self.counts[number]), self.digests[number],
                     int(self.starts[number]))

    def __iter__(self) -> Iterator[Shard]:
        return map(Shard, self.locations, self.counts.tolist(), self.digests, self.starts.tolist())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Shards):
            return (self.locations == other.locations and self.digests == other.digests
                    and np.array_equal(self.counts, other.counts))
        return NotImplemented

    def __hash__(self) -> int:
        return hash((self.locations, self.digests, self.counts.tobytes()))

    def __repr__(self) -> str:
        return f"Shards({list(self)!r})" if len(self) <= 3 else f"Shards([{self[0]!r}, ... {len(self)} shards])"


@dataclasses.dataclass(frozen=True)
class TablesFile:
    """Where a manifest's tables file lies (``location``, resolved as a shard's path is), the SHA-256 (hex) of its
    bytes, which the manifest pins, and its size in bytes, which bounds what reading it may cost before the hash
    can be checked (:mod:`beton.dataset.tables_file`)."""

    location: str
    sha256: str
    size: int


@dataclasses.dataclass(frozen=True)
class Manifest:
    """The shards of one dataset in order, and their common fields. ``source`` is the manifest file it was read
    from, or None for one built in memory. ``remote``: the :class:`~beton.storage.remote.RemoteOptions` it was
    read with, with which :meth:`open_shard` and :meth:`write` reach URLs (not part of what the manifest says, so
    not compared). Build one with :meth:`of`, :func:`read_manifest` or
    :func:`beton.dataset.shards.dataset_manifest`."""

    shards: Shards
    fields: tuple[FieldSpec, ...]
    source: str | None = None
    remote: RemoteOptions | None = dataclasses.field(default=None, compare=False, repr=False)
    tables: TablesFile | None = dataclasses.field(default=None, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.shards, Shards):  # Shard objects (their ranges follow from the counts)
            shards = list(self.shards)
            object.__setattr__(self, "shards", Shards([shard.location for shard in shards],
                                                      [shard.num_samples for shard in shards],
                                                      [shard.header_sha256 for shard in shards]))
        object.__setattr__(self, "fields", tuple(self.fields))

    @classmethod
    def of(cls, entries: Iterable[tuple[str, int, str]], fields: Sequence[FieldSpec],
           source: str | None = None) -> Manifest:
        """A manifest from (location, num_samples, header SHA-256) per shard, in order: the global ranges follow
        from the counts."""
        entries = list(entries)
        locations, counts, digests = zip(*entries) if entries else ((), (), ())
        return cls(Shards(locations, [int(count) for count in counts], digests), tuple(fields), source)

    @property
    def num_samples(self) -> int:
        return int(self.shards.starts[-1])

    @property
    def bounds(self) -> np.ndarray:
        """int64 array of ``len(shards) + 1`` entries: shard k holds global samples ``bounds[k]..bounds[k+1]``."""
        return self.shards.starts

    def locate(self, indices: Any) -> tuple[np.ndarray, np.ndarray]:
        """(shard number, index within that shard) of each global sample index, as two int64 arrays of the
        indices' shape. Empty shards hold no index. IndexError names the first index outside ``[0,
        num_samples)``."""
        array = np.asarray(indices)
        if array.size and array.dtype.kind not in "iu":
            raise TypeError(f"sample indices must be integers, got an array of {array.dtype}")
        array = array.astype(np.int64, copy=False)  # uint64 beyond int64 wraps negative, caught below
        bad = (array < 0) | (array >= self.num_samples)
        if bad.any():
            raise IndexError(f"sample index {np.asarray(indices)[bad].ravel()[0]} out of range for "
                             f"{self.num_samples} samples")
        shard = np.searchsorted(self.bounds[1:], array, side="right").astype(np.int64)
        return shard, array - self.bounds[shard]

    # ---- shards ---------------------------------------------------------------------------------------------

    def open_shard(self, number: int, **reader_options: Any) -> Reader:
        """Open shard ``number`` as a :class:`~beton.storage.reader.Reader` (``reader_options`` as the Reader's;
        ``remote`` defaults to the manifest's own) and check it against the manifest (:meth:`check_shard`); the
        caller closes it. The shards of a manifest file are read with their content digests checked where they have
        them (``verify_content=None``): the header hash it lists pins those digests."""
        reader_options.setdefault("remote", self.remote)
        reader_options["verify_content"] = self.content_checks(reader_options.get("verify_content", False))
        reader = Reader(self.shards[number].location, **reader_options)
        try:
            self.check_shard(number, reader)
        except BaseException:
            reader.close()
            raise
        return reader

    def content_checks(self, verify_content: bool | None) -> bool | None:
        """The ``verify_content`` its shards are read with when ``verify_content`` is asked for: as asked, except
        that the shards of a manifest file are always checked (None), as the hash of each header it lists pins
        their digests."""
        return None if self.source is not None and not verify_content else verify_content

    def check_shard(self, number: int, reader: Reader) -> None:
        """Raise :class:`~beton.errors.ShardError`, naming the shard, unless ``reader`` has the header, sample count
        and fields the manifest lists for shard ``number``."""
        if reader.header is None:
            raise locate(ShardError("an FFCV file carries no checksums, so it cannot be a shard of a dataset"),
                         path=self.shards[number].location)
        self.check_head(number, reader.header.tobytes(), reader.num_samples)
        self.check_fields(number, field_specs(reader.descriptors))

    def check_head(self, number: int, header: bytes, num_samples: int) -> None:
        """:class:`~beton.errors.ShardError`, naming the shard, unless ``header`` (a shard's 256 header bytes) and
        its sample count are those the manifest lists for shard ``number``."""
        shard = self.shards[number]
        with error_context(path=shard.location):
            digest = header_digest(header)
            if digest != shard.header_sha256:
                raise ShardError(f"shard {number} is not the file the manifest lists: its header's SHA-256 is "
                                 f"{digest}, the manifest says {shard.header_sha256} (the file changed since the "
                                 "manifest was made; make it again with `beton index`)")
            if num_samples != shard.num_samples:
                raise ShardError(f"shard {number} holds {num_samples} samples, the manifest says "
                                 f"{shard.num_samples}")

    def check_fields(self, number: int, fields: Sequence[FieldSpec]) -> None:
        """:class:`~beton.errors.ShardError`, naming the shard, unless shard ``number`` has the manifest's fields."""
        difference = fields_difference(self.fields, fields)
        if difference is not None:
            raise locate(ShardError(f"shard {number} does not have the manifest's fields: {difference}"),
                         path=self.shards[number].location)

    # ---- the file -------------------------------------------------------------------------------------------

    def to_json(self, location: str | os.PathLike[str]) -> bytes:
        """The manifest file for ``location`` (where it will be written): shard locations relative to it where the
        rules of the module docstring allow, else full URLs; ValueError for a shard that cannot be listed from
        there (a local file outside the manifest's directory, or any local file for a manifest at a URL)."""
        location = os.fspath(location)
        shards = [{"path": _listed_path(shard.location, location), "num_samples": shard.num_samples,
                   "header_sha256": shard.header_sha256} for shard in self.shards]

        def lines(items: list[dict[str, Any]]) -> str:  # one field or shard per line: readable, diffable
            return "[\n  " + ",\n  ".join(json.dumps(item, ensure_ascii=False) for item in items) + "\n ]"

        head = {"format": MANIFEST_FORMAT, "version": MANIFEST_VERSION, "num_samples": self.num_samples}
        if self.tables is not None:
            head["tables"] = {"path": _listed_path(self.tables.location, location), "sha256": self.tables.sha256,
                              "size": self.tables.size}
        fields = lines([field.to_json() for field in self.fields])
        return f'{json.dumps(head)[:-1]},\n "fields": {fields},\n "shards": {lines(shards)}\n}}\n'.encode("utf-8")

    def write(self, location: str | os.PathLike[str], *, remote: RemoteOptions | None = None) -> None:
        """Write the manifest file: a local file atomically (a temporary file renamed into place), a URL as a local
        temporary file uploaded whole (:func:`~beton.storage.remote.upload.upload_file`: within the retry budget of
        ``remote``, default the manifest's own; nothing at the URL changes unless the upload completes)."""
        location = os.fspath(location)
        data = self.to_json(location)
        if is_url(location):
            options = remote_or_default(remote if remote is not None else self.remote)
            with tempfile.TemporaryDirectory(prefix="beton-manifest-") as directory:
                local = os.path.join(directory, "manifest.json")
                with open(local, "wb") as file:
                    file.write(data)
                upload_file(local, location, options)
            return
        handle, temporary = create_temporary(location)
        try:
            with os.fdopen(handle, "wb") as file:
                file.write(data)
                file.flush()
                os.fsync(file.fileno())
            os.replace(temporary, location)
        except BaseException:
            try:
                os.unlink(temporary)
            except FileNotFoundError:
                pass
            raise


# ---- reading manifest files -----------------------------------------------------------------------------------

def read_manifest(location: str | os.PathLike[str], *, remote: RemoteOptions | None = None,
                  allow_outside: bool = False) -> Manifest:
    """The manifest file at ``location`` (a path or URL, read as ``remote`` says), validated (module docstring);
    FormatError naming the file and the entry for anything else. Shards are not opened; the manifest keeps
    ``remote`` for opening them. ``allow_outside``: the file is trusted to name shards outside its own directory
    (module docstring)."""
    location = os.fspath(location)
    options = remote_or_default(remote)
    with error_context(path=location):
        if is_url(location):
            fetcher = RangeFetcher(location, options)
            _check_size(fetcher.size)
            data = fetcher.fetch(0, fetcher.size, "the manifest")
        else:
            with os.fdopen(open_regular(location), "rb") as file:
                data = file.read(MAX_MANIFEST_BYTES + 1)
            _check_size(len(data))
        return dataclasses.replace(parse_manifest(data, location, allow_outside=allow_outside), remote=remote)


def _check_size(size: int) -> None:
    if size > MAX_MANIFEST_BYTES:
        raise FormatError(f"a manifest is at most {MAX_MANIFEST_BYTES} bytes, this file is larger")


def parse_manifest(data: bytes, location: str, *, allow_outside: bool = False) -> Manifest:
    """The manifest that the bytes ``data`` of the file at ``location`` describe (shard paths are resolved against
    ``location`` and must lie in its directory unless ``allow_outside``: module docstring)."""
    with error_context(path=location):
        if len(data) > MAX_MANIFEST_BYTES:
            raise FormatError(f"a manifest is at most {MAX_MANIFEST_BYTES} bytes, this one is {len(data)}")
        try:
            document = bounded_json.loads(data)
        except ValueError as error:
            raise FormatError(f"not a manifest: invalid JSON: {error}") from None
        top = _object(document, _TOP_KEYS, "the manifest", optional=_OPTIONAL_TOP_KEYS)
        if top["format"] != MANIFEST_FORMAT:
            raise FormatError(f"not a beton manifest: \"format\" is {_short(top['format'])}, expected "
                              f"{MANIFEST_FORMAT!r}")
        version = _count(top["version"], "\"version\"")
        if version != MANIFEST_VERSION:
            raise FormatError(f"manifest version {version} is not the supported version {MANIFEST_VERSION}")
        fields = _fields(top["fields"])
        entries = _shards(top["shards"], location, allow_outside)
        total = _count(top["num_samples"], "\"num_samples\"")
        listed = int(entries.starts[-1])
        if listed != total:
            raise FormatError(f"the shards' sample counts add up to {listed}, the manifest's \"num_samples\" says "
                              f"{total}")
        tables = None if top.get("tables") is None else _tables_file(top["tables"], location, allow_outside, entries)
        return Manifest(entries, tuple(fields), source=location, tables=tables)


def _fields(value: Any) -> list[FieldSpec]:
    if not isinstance(value, list) or not value:
        raise FormatError(f"\"fields\" must be a non-empty list, got {_short(value)}")
    fields = []
    for number, item in enumerate(value):
        where = f"field {number}"
        entry = _object(item, _FIELD_KEYS, where)
        name, type_name = (_text(entry[key], f"{where}: {key!r}") for key in ("name", "type"))
        if not isinstance(entry["arguments"], dict):
            raise FormatError(f"{where} ({name!r}): \"arguments\" must be an object, got {_short(entry['arguments'])}")
        if not isinstance(entry["payload"], bool):
            raise FormatError(f"{where} ({name!r}): \"payload\" must be true or false, got {_short(entry['payload'])}")
        try:
            metadata_dtype = dtypes.dtype_from_json(json.dumps(entry["metadata_dtype"]))
            dtypes.check_metadata_dtype(metadata_dtype)
        except (ValueError, TypeError, LookupError, ArithmeticError, RecursionError) as error:
            raise FormatError(f"{where} ({name!r}): \"metadata_dtype\" is not a dtype of little-endian numbers: "
                              f"{error}") from None
        fields.append(FieldSpec(name, type_name, _canonical(entry["arguments"]), metadata_dtype, entry["payload"]))
    names = [field.name for field in fields]
    duplicated = next((name for name in names if names.count(name) > 1), None)
    if duplicated is not None:
        raise FormatError(f"field {duplicated!r} is listed twice")
    return fields


def _shards(value: Any, location: str, allow_outside: bool) -> Shards:
    if not isinstance(value, list) or not value:
        raise FormatError(f"\"shards\" must be a non-empty list, got {_short(value)}")
    plain = _plain_shards(value, location)
    if plain is not None:
        return plain
    entries, seen = [], {}
    for number, item in enumerate(value):
        where = f"shard {number}"
        entry = _object(item, _SHARD_KEYS, where)
        path = _text(entry["path"], f"{where}: \"path\"")
        resolved = resolve_listed_path(path, location, where, allow_outside=allow_outside)
        if resolved in seen:
            raise FormatError(f"{where} ({path!r}) is shard {seen[resolved]} again: a shard is listed once")
        seen[resolved] = number
        count = _count(entry["num_samples"], f"{where}: \"num_samples\"")
        digest = entry["header_sha256"]
        if not isinstance(digest, str) or not _SHA256.fullmatch(digest):
            raise FormatError(f"{where}: \"header_sha256\" must be 64 lowercase hexadecimal digits, got "
                              f"{_short(digest)}")
        entries.append((resolved, count, digest))
    if sum(count for _, count, _ in entries) >= _MAX_COUNT:
        raise FormatError(f"the shards hold {sum(count for _, count, _ in entries)} samples, more than 2**63 - 1")
    return Shards(*zip(*entries))


def _plain_shards(value: list[Any], location: str) -> Shards | None:
    """The entries of a local manifest's shard list where every one is plain (exactly the three keys, a plain
    relative path, a count, a digest: what ``beton index`` writes), checked list by list rather than entry by entry;
    None where any is not, for :func:`_shards` to take each entry through every rule and name the first it
    refuses. Only what those rules accept passes here: a plain path has no segment that climbs and no character
    that decodes, escapes or names another store (:func:`resolve_listed_path`)."""
    if is_url(location) or set(map(type, value)) != {dict} or \
            not all(map(operator.eq, map(dict.keys, value), itertools.repeat(_SHARD_KEY_SET))):
        return None
    paths, counts, digests = (list(map(operator.itemgetter(key), value)) for key in _SHARD_KEYS)
    if set(map(type, paths)) != {str} or set(map(type, counts)) != {int} or set(map(type, digests)) != {str}:
        return None  # (a bool is not an int here)
    if min(counts) < 0 or sum(counts) >= _MAX_COUNT or set(map(len, digests)) != {64} or \
            not _only("".join(digests), b"0123456789abcdef") or not _plain_lines("\n".join(paths)):
        return None
    # normpath(join(directory, path)) for a path of plain segments: the directory normalised, then the path
    prefix = os.path.normpath(os.path.join(os.path.dirname(location), "x"))[:-1]
    resolved = [prefix + path for path in paths]
    if len(set(resolved)) != len(resolved):
        return None  # listed twice: named by the rules' own loop
    return Shards(resolved, counts, digests)


def _only(text: str, characters: bytes) -> bool:
    """Whether ``text`` holds only ``characters`` (ASCII)."""
    return text.isascii() and not text.encode("ascii").translate(None, characters)


def _plain_lines(text: str) -> bool:
    """Whether every line of ``text`` is a plain path (:data:`_PLAIN_PATH`), checked over the whole text at once:
    only the plain characters, and no segment that is empty or starts with '.' (which also rules out '.' and '..')."""
    return bool(text) and _only(text, _PLAIN_CHARACTERS) and not text.startswith(("/", ".", "\n")) and \
        not text.endswith(("/", "\n")) and not any(pair in text for pair in _NOT_PLAIN_PAIRS)


def _tables_file(value: Any, location: str, allow_outside: bool, shards: Shards) -> TablesFile:
    entry = _object(value, _TABLES_KEYS, "\"tables\"")
    path = _text(entry["path"], "\"tables\": \"path\"")
    resolved = resolve_listed_path(path, location, "the tables file", allow_outside=allow_outside)
    if resolved in set(shards.locations):
        raise FormatError(f"the tables file ({path!r}) is also listed as a shard")
    digest = entry["sha256"]
    if not isinstance(digest, str) or not _SHA256.fullmatch(digest):
        raise FormatError(f"\"tables\": \"sha256\" must be 64 lowercase hexadecimal digits, got {_short(digest)}")
    return TablesFile(resolved, digest, _count(entry["size"], "\"tables\": \"size\""))


def _object(value: Any, keys: tuple[str, ...], where: str, optional: tuple[str, ...] = ()) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise FormatError(f"{where} must be a JSON object, got {_short(value)}")
    missing = [key for key in keys if key not in value]
    if missing:
        raise FormatError(f"{where} lacks {', '.join(repr(key) for key in missing)}")
    unknown = sorted(set(value) - set(keys) - set(optional))
    if unknown:
        raise FormatError(f"{where} has unknown keys {', '.join(repr(key) for key in unknown[:5])} (expected "
                          f"{', '.join(keys)})")
    return value


def _count(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < _MAX_COUNT:
        raise FormatError(f"{where} must be an integer in [0, 2**63), got {_short(value)}")
    return value


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise FormatError(f"{where} must be a non-empty string, got {_short(value)}")
    return value


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False) if not isinstance(value, float) or np.isfinite(value) else repr(value)
    return text if len(text) <= 80 else text[:80] + "..."


# ---- shard paths ----------------------------------------------------------------------------------------------

def resolve_listed_path(path: str, manifest_location: str, where: str = "a shard", *,
                        allow_outside: bool = False) -> str:
    """Where a shard listed as ``path`` in the manifest file at ``manifest_location`` is, normalised (module
    docstring); FormatError naming the entry for a path the rules refuse. Nothing is opened here."""

    if _PLAIN_PATH.fullmatch(path) and not is_url(manifest_location):
        # the common entry (``part-00007.beton``, ``train/part-7.beton``): no segment that climbs, no character
        # that decodes, escapes or names another store; it lies in the local manifest's directory, which is all
        # the rules below would find (a manifest of 100,000 shards spends most of its reading here otherwise)
        return os.path.normpath(os.path.join(os.path.dirname(manifest_location), path))

    def refuse(problem: str) -> FormatError:
        return FormatError(f"{where}: {path!r} {problem}")

    if "::" in path:
        raise refuse("is a chained URL ('::'), which opens a file through another (a cache, an archive); a manifest "
                     "names shards only")
    if "\\" in path or "\0" in path:
        raise refuse("holds a backslash or NUL; shard paths are separated by '/'")
    remote = is_url(manifest_location)
    if remote:
        base_origin, base = _split_url(_url_directory(manifest_location))
    else:
        base_origin, base = "", os.path.abspath(os.path.dirname(manifest_location) or os.curdir)
    base = _normalised(base)
    outside = (f"lies outside the manifest's directory ({base_origin}{base}); a manifest names shards in its "
               "directory or below (read it with allow_outside=True if you trust it to name others)")
    if is_url(path):
        protocol = path.split("://", 1)[0].lower()
        if protocol in _LOCAL_PROTOCOLS:
            raise refuse(f"names a file of this machine ({protocol}://); a manifest lists local shards by paths "
                         "relative to itself, and a manifest at a URL lists none")
        if protocol in _WRAPPING_PROTOCOLS:
            raise refuse(f"uses {protocol}://, which opens other files; a manifest names shards only")
        origin, full = _split_url(path)
        if allow_outside:
            return path
        if origin != base_origin:  # another store, host, port or bucket (or a URL in a local manifest)
            raise refuse(outside)
    elif remote and path.startswith("/"):
        raise refuse("is a local path: a manifest at a URL names only shards on its own store, by relative paths "
                     "or by URLs under its directory")
    else:
        origin, full = base_origin, path if path.startswith("/") else f"{base}/{path}"
    if remote and not allow_outside and is_http(origin) and \
            any(character in path for character in "?#"):
        raise refuse("holds a query or fragment; a manifest at a URL names shards by their paths")
    decoded = _decoded(full)
    if "\0" in decoded:
        raise refuse("holds an encoded NUL")
    if not allow_outside and not all(_within(_normalised(form), base) for form in (full, decoded)):
        raise refuse(outside)
    if remote:
        return origin + _normalised(full)
    if path.startswith("/"):
        return _normalised(full)
    return os.path.normpath(os.path.join(os.path.dirname(manifest_location), path))


def _split_url(url: str) -> tuple[str, str]:
    """(origin, path) of a URL: everything up to the end of its last part's host (``s3://bucket``,
    ``http://127.0.0.1:8000``, ``simplecache::s3://bucket``), and the rest (``/data/a.beton``, or empty)."""
    last = url.rsplit("::", 1)[-1]
    prefix = url[: len(url) - len(last)]
    if "://" not in last:
        return prefix, last
    scheme, rest = last.split("://", 1)
    host, slash, tail = rest.partition("/")
    return f"{prefix}{scheme}://{host}", slash + tail


def _decoded(path: str) -> str:
    """``path`` percent-decoded until nothing changes (a server may decode twice), a backslash read as '/'."""
    for _ in range(8):
        decoded = urllib.parse.unquote(path)
        if decoded == path:
            break
        path = decoded
    return path.replace("\\", "/")


def _normalised(path: str) -> str:
    """``path`` as '/'-separated segments without '.', '..' and empty ones, from the root ('..' at the root stays
    there, as servers and POSIX do)."""
    segments: list[str] = []
    for segment in path.split("/"):
        if segment == "..":
            if segments:
                segments.pop()
        elif segment not in ("", "."):
            segments.append(segment)
    return "/" + "/".join(segments)


def _within(path: str, directory: str) -> bool:
    return directory == "/" or path == directory or path.startswith(directory + "/")


def _listed_path(shard: str, manifest_location: str) -> str:
    """How the manifest file at ``manifest_location`` lists ``shard``: the inverse of :func:`resolve_listed_path`."""
    if is_url(manifest_location):
        directory = _url_directory(manifest_location) + "/"
        if is_url(shard) and shard.startswith(directory) and _relative_problem(shard[len(directory):]) is None:
            return shard[len(directory):]
        if not is_url(shard):
            raise ValueError(f"shard {shard!r} is a local file: a manifest at a URL ({manifest_location}) can list "
                             "only URLs")
    if is_url(shard):
        local = _local_protocol(shard)
        if local is not None:
            raise ValueError(f"shard {shard!r} names a local file by a {local}:// URL, which manifest files refuse; "
                             "give its path instead")
        return shard
    directory = os.path.abspath(os.path.dirname(manifest_location) or os.curdir)
    absolute, inside = os.path.abspath(shard), directory.rstrip(os.sep) + os.sep
    # a shard below the manifest is its path after the directory's (what relpath gives, at a tenth of its cost:
    # 100,000 shards are listed in seconds otherwise)
    relative = (absolute[len(inside):] if absolute.startswith(inside) else
                os.path.relpath(absolute, directory)).replace(os.sep, "/")
    if _relative_problem(relative) is not None:
        raise ValueError(f"shard {shard!r} is not inside the manifest's directory {directory}: a manifest lists local "
                         "shards by paths relative to itself, in its directory or below (write the manifest into a "
                         "directory that holds every shard)")
    return relative


def _relative_problem(path: str) -> str | None:
    if "\\" in path or "\0" in path:
        return "holds a backslash or NUL; relative shard paths are separated by '/'"
    if path.startswith("/"):
        return "is an absolute path; a manifest lists local shards by paths relative to itself"
    if any(part in ("", ".", "..") for part in path.split("/")):
        return "has an empty, '.' or '..' segment; a shard lies in the manifest's directory or below it"
    return None


def _local_protocol(url: str) -> str | None:
    """The first protocol of a (chained) URL that names files of this machine, or None."""
    for part in url.split("::"):
        protocol = part.split("://", 1)[0].lower() if "://" in part else part.lower()
        if protocol in _LOCAL_PROTOCOLS:
            return protocol
    return None


def _url_directory(url: str) -> str:
    """A URL without its last path segment (and, for HTTP(S), without query and fragment)."""
    base = url
    if is_http(url):
        base = re.split(r"[?#]", url, maxsplit=1)[0]
    return base.rpartition("/")[0]

