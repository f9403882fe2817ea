"""WebDataset tar shards: a sample is the run of consecutive files that share a key.

A member ``dir/n0001.seg.png`` has key ``dir/n0001`` and extension ``seg.png`` (the key ends at the first dot of
the file name, as in the ``webdataset`` package). Shards are local tar files (compressed ones too), named
one by one, by a brace pattern (``shards/train-{000000..000146}.tar``) or by a folder (its ``*.tar``,
``*.tar.gz`` and ``*.tgz``, sorted). They are read as streams, one sample at a time: memory holds one sample
(plus the writer's samples in flight), never a shard.

Extensions become fields named after them. Which: ``extensions=["jpg;png", "cls"]`` (webdataset's
``to_tuple`` syntax: alternatives separated by ``;``, the field named after the first), or by default every
extension of the first sample. Every sample must then have each field's extension (exactly one of the
alternatives) - a sample without one, with an extension the first sample lacks when nothing was
chosen, or with a key that came earlier in the shard, apart from its files (a tar not grouped by key), is a bad
sample: the conversion fails naming the shard and key, or with ``on_error="skip"`` it is
left out and listed in the report. The key is stored too, as a JSONField ``__key__`` (``keep_key=False`` drops
it).

What an extension holds, from its last part (``types={"ext": kind}`` overrides): ``jpg jpeg png webp bmp tif
tiff ppm pgm gif`` an image (RGBImageField through ImageFileField: stored JPEGs checked, other formats
converted); ``cls cls2 class count index inx id`` an integer in ASCII (IntField); ``json jsn`` JSON (JSONField);
``txt text`` UTF-8 text (JSONField, a string); anything else the bytes (BytesField).

What a shard may cost is bounded before it is read: a member larger than ``max_file_bytes`` (default
:data:`~beton.tools.convert.report.DEFAULT_MAX_FILE_BYTES`, by the size its header declares; a compressed
shard's 2 GiB member of zeros takes 2 MB on disk) refuses its sample without being read (it is decompressed and
thrown away a block at a time), and a tar header's own data (a pax header, a GNU long name), which Python's
tarfile reads whole, may be at most :data:`MAX_TAR_HEADER_BYTES`, else the shard cannot be read on.
"""

from __future__ import annotations

import array
import os
import re
import tarfile
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from beton import bounded_json
from beton.fields import BytesField, IntField, JSONField
from beton.fields.base import Field
from beton.storage import format as fmt
from beton.storage.remote.options import RemoteOptions
from beton.tools.convert.images import ImageOptions
from beton.tools.convert.report import (DEFAULT_MAX_FILE_BYTES, ConversionError, ConversionReport, SkippedSource,
                                       base_metadata, check_max_file_bytes, write)

__all__ = ["webdataset", "expand_braces", "shard_paths", "EXTENSION_KINDS", "KEY_FIELD", "MAX_TAR_HEADER_BYTES"]

#: Kind of value a member holds, by the last part of its extension.
EXTENSION_KINDS = {
    **dict.fromkeys(("jpg", "jpeg", "png", "webp", "bmp", "tif", "tiff", "ppm", "pgm", "gif"), "image"),
    **dict.fromkeys(("cls", "cls2", "class", "count", "index", "inx", "id"), "int"),
    **dict.fromkeys(("json", "jsn"), "json"),
    **dict.fromkeys(("txt", "text"), "text"),
}
KINDS = ("image", "int", "json", "text", "bytes")
KEY_FIELD = "__key__"
_SHARD_SUFFIXES = (".tar", ".tar.gz", ".tgz")
_RANGE = re.compile(r"^(\d+)\.\.(\d+)$")
_CHUNK_SAMPLES = 16  # samples per writer task: memory holds a few such chunks, whatever the samples' size
#: The most bytes a tar header's own data (a pax extended header, a GNU long name or link) may hold: tarfile
#: reads it whole before the member it describes is seen. Real ones hold a few names and numbers.
MAX_TAR_HEADER_BYTES = 1 << 20
_HEADER_TYPES = (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK, tarfile.XHDTYPE, tarfile.XGLTYPE,
                 tarfile.SOLARIS_XHDTYPE)


def expand_braces(pattern: str) -> list[str]:
    """``a{000..002}b{x,y}`` -> a000bx, a000by, a001bx, ... (numeric ranges keep the first bound's width)."""
    match = re.search(r"\{([^{}]*)\}", pattern)
    if match is None:
        return [pattern]
    inside = match.group(1)
    numbers = _RANGE.match(inside)
    if numbers:
        low, high = numbers.groups()
        if int(high) < int(low):
            raise ConversionError(f"brace range {{{inside}}} in {pattern!r} runs backwards")
        choices = [str(number).zfill(len(low)) for number in range(int(low), int(high) + 1)]
    else:
        choices = inside.split(",")
    head, tail = pattern[: match.start()], pattern[match.end() :]
    return [head + choice + rest for choice in choices for rest in expand_braces(tail)]


def shard_paths(sources: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> list[str]:
    """The shard files ``sources`` name (paths, brace patterns, folders), in order; each must exist."""
    if isinstance(sources, (str, os.PathLike)):
        sources = [sources]
    paths = []
    for source in map(os.fspath, sources):
        if os.path.isdir(source):
            found = sorted(os.path.join(source, name) for name in os.listdir(source)
                           if name.endswith(_SHARD_SUFFIXES) and not name.startswith("."))
            if not found:
                raise ConversionError(f"folder {source!r} holds no tar shards ({', '.join(_SHARD_SUFFIXES)})")
            paths += found
            continue
        for path in expand_braces(source):
            if not os.path.isfile(path):
                raise ConversionError(f"shard {path!r} does not exist")
            paths.append(path)
    if not paths:
        raise ConversionError("no shards given")
    return paths


def webdataset(sources: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], output: str | os.PathLike[str],
               *, extensions: Sequence[str] | None = None, types: Mapping[str, str] | None = None,
               keep_key: bool = True, on_error: str = "fail", metadata: Mapping[str, Any] | None = None,
               num_workers: int = -1, page_size: int = fmt.DEFAULT_PAGE_SIZE, progress: bool = True,
               max_file_bytes: int | None = DEFAULT_MAX_FILE_BYTES, remote: RemoteOptions | None = None,
               **image_options: Any) -> ConversionReport:
    """Write the samples of WebDataset shards (see the module docstring).

    Args:
        sources: shard paths, brace patterns or folders.
        output: the .beton file to write.
        extensions: the fields, as extensions with ``;``-separated alternatives (default: the first sample's).
        types: extension -> kind ("image", "int", "json", "text", "bytes"), overriding the choice.
        keep_key: store each sample's key in a field ``__key__``.
        on_error: "fail" or "skip" (samples missing a field's extension, with values that cannot be parsed, or
            with a bad image; a damaged shard's remaining samples).
        metadata: extra file-level metadata (the shards are stored).
        num_workers, page_size, progress, remote: as for :class:`~beton.DatasetWriter` (``output`` may be a URL).
        max_file_bytes: the largest member read (by its header's size); a sample with a larger member is bad and
            the member is not read (None: no cap).
        image_options: :class:`~beton.tools.convert.images.ImageOptions` for image extensions.
    """
    paths = shard_paths(sources)
    chosen = [tuple(item.split(";")) for item in extensions] if extensions is not None else None
    samples = _Samples(paths, chosen, on_error, check_max_file_bytes(max_file_bytes))
    first = samples.first_extensions()
    if chosen is None:
        chosen = [(extension,) for extension in first]
        samples.chosen, samples.exact = chosen, True
    kinds = {options[0]: _kind(options[0], types or {}) for options in chosen}
    unknown = set(types or {}) - set(kinds)
    if unknown:
        raise ConversionError(f"types= names extensions that are not converted: {sorted(unknown)}")
    names = list(kinds) + ([KEY_FIELD] if keep_key else [])
    if len(set(names)) != len(names):
        raise ConversionError(f"fields must be distinct, got {names}")
    fields: dict[str, Field] = {name: _field(kind, image_options) for name, kind in kinds.items()}
    if keep_key:
        fields[KEY_FIELD] = JSONField()
    samples.kinds, samples.keep_key = list(kinds.values()), keep_key
    stored = base_metadata("webdataset", {"shards": [os.path.abspath(path) for path in paths]}, None, metadata)
    return write(output, fields, samples, indexed=False, source_name=samples.source_name, metadata=stored,
                 on_error=on_error, skipped_before=samples.skipped, num_workers=num_workers, page_size=page_size,
                 progress=progress, chunksize=_CHUNK_SAMPLES, remote=remote)


def _kind(extension: str, types: Mapping[str, str]) -> str:
    kind = types.get(extension) or EXTENSION_KINDS.get(extension.rsplit(".", 1)[-1].lower(), "bytes")
    if kind not in KINDS:
        raise ConversionError(f"extension {extension!r}: kind must be one of {KINDS}, got {kind!r}")
    return kind


def _field(kind: str, image_options: Mapping[str, Any]) -> Field:
    if kind == "image":
        return ImageOptions(**image_options).field()
    return {"int": IntField, "json": JSONField, "text": JSONField, "bytes": BytesField}[kind]()


class _Names:
    """Sample i's source name ("shard.tar key"), kept compactly: one byte string, and where each name ends."""

    def __init__(self) -> None:
        self._text = bytearray()
        self._ends = array.array("Q")

    def append(self, name: str) -> None:
        self._text += name.encode("utf-8", "surrogateescape")
        self._ends.append(len(self._text))

    def __getitem__(self, index: int) -> str:
        start = self._ends[index - 1] if index else 0
        return self._text[start : self._ends[index]].decode("utf-8", "surrogateescape")


class _Samples:
    """The shards' samples as tuples, in order, streamed; the converter's own refusals go to ``skipped``."""

    def __init__(self, paths: list[str], chosen: list[tuple[str, ...]] | None, on_error: str,
                 max_file_bytes: int | None) -> None:
        self.paths, self.chosen, self.on_error, self.max_file_bytes = paths, chosen, on_error, max_file_bytes
        self.exact = False  # every sample must have exactly the chosen extensions (when chosen from the first)
        self.kinds: list[str] = []
        self.keep_key = True
        self.skipped: list[SkippedSource] = []
        self._names = _Names()

    def source_name(self, position: int) -> str:
        return self._names[position]

    def first_extensions(self) -> list[str]:
        for path in self.paths:  # a damaged shard is reported when the samples are read, not twice
            for key, members in _groups(path, lambda source, reason: None, self.max_file_bytes):
                return list(members)
        raise ConversionError(f"the shards hold no samples: {self.paths[0]}" +
                              (f" ... {self.paths[-1]}" if len(self.paths) > 1 else ""))

    def _refuse(self, source: str, reason: str) -> None:
        if self.on_error == "fail":
            raise ConversionError(f"{source}: {reason} (on_error='skip', --on-error skip, leaves such samples out)")
        self.skipped.append(SkippedSource(source, reason))

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        yielded = 0
        for path in self.paths:
            for key, members in _groups(path, self._refuse, self.max_file_bytes):
                source = f"{path} {key}"
                try:
                    values = self._values(members)
                except _BadSample as bad:
                    self._refuse(source, str(bad))
                    continue
                self._names.append(source)
                yielded += 1
                yield (*values, key) if self.keep_key else tuple(values)
        if yielded == 0 and self.skipped:  # an empty file would hide it: fail (the target is kept)
            first = self.skipped[0]
            raise ConversionError(f"every sample was skipped; the first: {first.source}: {first.reason}")

    def _values(self, members: dict[str, bytes]) -> list[Any]:
        used = set()
        values = []
        for options, kind in zip(self.chosen, self.kinds):
            present = [extension for extension in options if extension in members]
            if len(present) != 1:
                wanted = " or ".join(f".{extension}" for extension in options)
                raise _BadSample(f"has no {wanted}{_SPLIT_HINT}" if not present
                                 else f"has both {' and '.join(present)}")
            used.add(present[0])
            values.append(_parse(kind, present[0], members[present[0]]))
        extra = sorted(set(members) - used)
        if self.exact and extra:
            raise _BadSample(f"has extensions the first sample lacks: {', '.join(extra)} (choose the fields with "
                             "extensions=..., --extensions)")
        return values


#: a sample missing an extension may be the first part of a key whose other files come later in the shard
_SPLIT_HINT = " (if the key's other files come later in the shard, the tar is not grouped by key)"


class _BadSample(Exception):
    """A sample the converter refuses (the message says why)."""


def _parse(kind: str, extension: str, data: bytes) -> Any:
    if kind == "int":
        try:
            return int(data.decode("ascii").strip())
        except (UnicodeDecodeError, ValueError):
            raise _BadSample(f".{extension} holds {data[:40]!r}, not an integer") from None
    if kind == "json":
        try:
            return bounded_json.loads(data)
        except ValueError as error:
            raise _BadSample(f".{extension} is not valid JSON: {error}") from None
    if kind == "text":
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as error:
            raise _BadSample(f".{extension} is not UTF-8 text: {error}") from None
    return data  # image (checked in the writer's workers) or bytes


def _groups(path: str, refuse: Any, max_file_bytes: int | None) -> Iterator[tuple[str, dict[str, bytes]]]:
    """(key, {extension: bytes}) of each sample of one shard, read as a stream; a damaged shard (its remaining
    samples, and the one it broke in), a sample with a repeated extension or a member larger than
    ``max_file_bytes`` (not read) is refused."""
    key, members, problem = None, {}, None
    ended = set()  # keys whose files ended: one met again is a tar not grouped by key (its text: bounded by the shard)
    try:
        with tarfile.open(path, mode="r|*", tarinfo=_BoundedTarInfo) as archive:
            for member in archive:
                if not member.isfile():
                    continue
                directory, _, base = member.name.rpartition("/")
                stem, dot, extension = base.partition(".")
                if not dot or not stem:
                    continue  # no key or no extension: not part of a sample (webdataset skips these too)
                name = f"{directory}/{stem}" if directory else stem
                if name != key:
                    if key is not None:
                        ended.add(key)
                        yield from _finished(path, key, members, problem, refuse)
                    key, members, problem = name, {}, None
                    if key in ended:  # webdataset reads it as two samples, each missing what the other holds
                        problem = ("its files are not together: the key came earlier in this shard, apart from these "
                                   "(a tar not grouped by key; write each key's files one after another, e.g. "
                                   "tar --sort=name)")
                if max_file_bytes is not None and member.size > max_file_bytes:
                    problem = problem or (f"member {member.name!r} is {member.size} bytes, more than max_file_bytes="
                                          f"{max_file_bytes} (--max-file-bytes); it was not read")
                    continue  # the next member's header is found by skipping its data a block at a time
                data = archive.extractfile(member).read()
                if extension in members:
                    problem = problem or f"has .{extension} more than once (its files are not consecutive in the tar?)"
                members[extension] = data
            _check_end(archive)
    except (tarfile.TarError, OSError, EOFError) as error:
        refuse(f"{path}" + (f" after {key}" if key is not None else ""),
               f"the shard cannot be read on: {error}" if key is not None else f"not a readable tar file: {error}")
        return
    if key is not None:
        yield from _finished(path, key, members, problem, refuse)


class _BoundedTarInfo(tarfile.TarInfo):
    """A TarInfo whose header data (pax headers, GNU long names), which tarfile reads whole, is bounded."""

    def _proc_member(self, tarfile_: tarfile.TarFile) -> tarfile.TarInfo:
        if self.type in _HEADER_TYPES and self.size > MAX_TAR_HEADER_BYTES:
            raise tarfile.HeaderError(f"a {self.type!r} header declares {self.size} bytes of header data, more "
                                      f"than {MAX_TAR_HEADER_BYTES}")
        return super()._proc_member(tarfile_)


def _check_end(archive: tarfile.TarFile) -> None:
    """tarfile ends its iteration quietly at a cut (end of data where a header should be) or at a damaged header,
    as at the real end; only the real end is followed by a second zero block (every tar writer writes two)."""
    tail = archive.fileobj.read(tarfile.BLOCKSIZE)
    if len(tail) < tarfile.BLOCKSIZE or tail.strip(b"\0"):
        raise tarfile.ReadError("it ends without the end-of-archive blocks (cut short, or a damaged header)")


def _finished(path: str, key: str, members: dict[str, bytes], problem: str | None,
              refuse: Any) -> Iterator[tuple[str, dict[str, bytes]]]:
    if problem is not None:
        refuse(f"{path} {key}", problem)
    else:
        yield key, members
