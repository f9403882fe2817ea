"""A dataset in several files: whatever names it (files, URLs, globs, manifest files, a list of these) becomes one
:class:`~beton.dataset.manifest.Manifest`, and ``beton index`` writes one as a manifest file.

:func:`dataset_manifest` is the single road from what a user names to the shards in order; ``Loader([...])``,
``Loader("data/*.beton")``, ``Loader("train.manifest.json")`` and ``beton merge`` all take it:

* a path or URL ending in ``.json`` (any case) is a manifest file (:func:`~beton.dataset.manifest.read_manifest`);
* a local path with ``*``, ``?`` or ``[`` that names no existing file is a glob, and so is a URL with ``*``, ``?``
  or ``[`` that names no object in its store (except HTTP(S), which cannot list; there ``?`` starts a query; a
  URL's store is asked when the glob is listed): the matches, sorted by name, so shards
  are named with zero-padded numbers (``train-00007-of-00064.beton``); an HTTP(S) URL with ``*`` or ``[`` in its
  path is refused (:class:`~beton.errors.ShardNotFoundError`, before any request) rather than fetched as a file
  of that name: its shards are named by a list of URLs or a manifest file;
* anything else is one beton file.

A list concatenates what each entry names, in order. The fields of every file must be those of the first (the
first difference is named in a :class:`~beton.errors.ShardError`); a file named twice (under any spelling, or through
a link) is refused. For files named directly, the header and field table are read
(:func:`~beton.storage.reader.read_head`: two small reads per file, for a URL as for a path), not the other tables:
opening a shard is left to whoever reads it.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import glob
import os
import random
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from typing import Any, Union

from beton.errors import BetonError, ShardError, ShardNotFoundError, error_context, locate
from beton.fields.base import Field
from beton.dataset.manifest import Manifest, field_specs, fields_difference, header_digest, read_manifest
from beton.dataset.tables_file import local_tables_row, tables_row, write_indexed_manifest
from beton.storage.page_source import file_identity
from beton.storage.reader import read_head
from beton.storage.remote import RemoteOptions, is_http, is_url, remote_or_default
from beton.storage.remote.fetch import backoff, filesystem, with_retries
from beton.storage.verify import verify_reader

__all__ = ["dataset_manifest", "index", "is_manifest_name", "names_one_file", "Source"]

#: What names a dataset: a path or URL (a file, a glob, a manifest), a list of those, or a Manifest.
Source = Union[str, "os.PathLike[str]", Sequence[Union[str, "os.PathLike[str]"]], Manifest]

_GLOB_CHARACTERS = ("*", "?", "[")
_MAX_CONCURRENT_HEADS = 16  # files whose headers are fetched at once when a dataset lists many URLs


def is_manifest_name(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` names a manifest file (it ends in ``.json``) rather than a beton file."""
    return os.fspath(path).lower().endswith(".json")


def names_one_file(source: Source) -> bool:
    """Whether ``source`` names a single beton file (a path or URL that is neither a manifest file nor a glob, by
    the rules of the module docstring), rather than a dataset of several files."""
    if not isinstance(source, (str, os.PathLike)):
        return False  # a list (even of one file) or a Manifest
    item = os.fspath(source)
    return not is_manifest_name(item) and not _is_glob(item)


def dataset_manifest(source: Source, *, remote: RemoteOptions | None = None, allow_outside: bool = False) -> Manifest:
    """The shards, in order, of the dataset ``source`` names (module docstring). A manifest file read alone keeps
    its ``source``; anything else is a manifest built in memory (``source`` None). URLs are read as ``remote``
    (a :class:`~beton.storage.remote.RemoteOptions`) says, and the manifest keeps it for opening its shards
    (:meth:`~beton.dataset.manifest.Manifest.open_shard`); a Manifest given keeps its own unless ``remote`` is
    given. ``allow_outside``: the manifest files named are trusted to name shards outside their own directories
    (:mod:`beton.dataset.manifest`); a ``Loader`` or ``merge`` given the Manifest returned reads those shards."""
    remote_or_default(remote)  # a slip is named here, before anything is read
    if isinstance(source, Manifest):
        return source if remote is None else dataclasses.replace(source, remote=remote)
    if isinstance(source, (bytes, bytearray)):  # iterated, they would be read as a list of numbers
        raise TypeError(f"a dataset is named by paths, URLs, globs or manifest files as str (or os.PathLike), got "
                        f"bytes {bytes(source)[:80]!r}: decode it first")
    items = [source] if isinstance(source, (str, os.PathLike)) else list(source)
    if not items:
        raise ShardError("no shards given: name at least one file, glob or manifest")
    named: list[Manifest | str] = []  # manifests read, and files still to read, in order
    for item in items:
        if not isinstance(item, (str, os.PathLike)):
            raise TypeError(f"a dataset is named by paths, URLs, globs or manifest files, got {type(item).__name__}")
        item = os.fspath(item)
        if is_manifest_name(item):
            named.append(read_manifest(item, remote=remote, allow_outside=allow_outside))
        else:
            named += _expand(item, remote)
    files = _one_file_manifests([entry for entry in named if isinstance(entry, str)], remote)
    parts = [files[entry] if isinstance(entry, str) else entry for entry in named]
    return dataclasses.replace(parts[0] if len(parts) == 1 else _concatenate(parts), remote=remote)


def _one_file_manifests(paths: list[str], remote: RemoteOptions | None) -> dict[str, Manifest]:
    """A manifest of one shard per file, from its header and field table. URLs are read several at once (each costs
    a few round trips), local files one after the other."""

    parsed: dict = {}  # the field tables parsed: the files of one writer share one

    def one(path: str) -> Manifest:
        try:
            head = read_head(path, remote=remote, parsed=parsed)
        except FileNotFoundError as error:
            if isinstance(error, BetonError):
                raise
            raise locate(ShardNotFoundError(f"no such file: {error}"), path=path) from None
        return Manifest.of([(path, head.num_samples, header_digest(head.header))], field_specs(head.descriptors))

    urls = sum(1 for path in paths if is_url(path))
    if urls < 2:
        return {path: one(path) for path in paths}
    with concurrent.futures.ThreadPoolExecutor(min(urls, _MAX_CONCURRENT_HEADS),
                                               thread_name_prefix="beton-head") as pool:
        return dict(zip(paths, pool.map(one, paths)))  # in order: the first failure in order is raised


def _file_identity(location: str) -> object:
    """What makes two names one file: a URL as written; a local path by its device and inode
    (:func:`~beton.storage.page_source.file_identity` without the modification time), so that another spelling
    (relative, ``./``, ``//``), a symbolic link or a hard link is the same file; its resolved path where it cannot
    be looked up."""
    if is_url(location):
        return location
    try:
        return file_identity(os.stat(location))[:2]
    except OSError:
        return os.path.realpath(location)


def _concatenate(parts: list[Manifest]) -> Manifest:
    first = parts[0]
    seen: dict[object, tuple[int, str]] = {}
    entries = []
    for part in parts:
        difference = fields_difference(first.fields, part.fields)
        if difference is not None:
            where = part.source or part.shards[0].location
            raise locate(ShardError(f"its fields differ from those of {first.source or first.shards[0].location}: "
                                    f"{difference}"), path=where)
        for shard in part.shards:
            identity = _file_identity(shard.location)
            if identity in seen:
                number, location = seen[identity]
                spelled = "" if location == shard.location else f", first as {location!r}"
                raise locate(ShardError(f"named twice (as shard {number} and {len(entries)}{spelled}): a dataset "
                                        "lists each file once"), path=shard.location)
            seen[identity] = len(entries), shard.location
            entries.append((shard.location, shard.num_samples, shard.header_sha256))
    return Manifest.of(entries, first.fields)


def _is_glob(item: str) -> bool:
    """Whether the path or URL ``item`` is a glob (module docstring): a local path with a glob character that
    names no existing file, or a URL other than HTTP(S) with one. An HTTP(S) URL that looks like a glob raises
    :class:`~beton.errors.ShardNotFoundError` (every road from a name to files passes here)."""
    if not any(character in item for character in _GLOB_CHARACTERS):
        return False
    if is_url(item):
        if not is_http(item):
            return True
        _refuse_http_glob(item)
        return False  # '?' starts a query
    return not os.path.exists(item)


def _refuse_http_glob(url: str) -> None:
    """HTTP has no listing (fsspec's HTTP glob reads the links of an HTML index page, which a file server or a
    bucket's HTTP face need not serve), so a URL whose path holds ``*`` or ``[`` (``[`` is not allowed unescaped in
    a URL's path; a host's ``[::1]`` is not its path) is refused before a request, not fetched as a file of that
    name."""
    if any(character in urllib.parse.urlsplit(url).path for character in ("*", "[")):
        raise locate(ShardNotFoundError(
            "a glob over HTTP(S) cannot be expanded: HTTP cannot list files. Globs work on local paths and on "
            "stores that list (s3://, gs://, ...); for shards served over HTTP, name them by a list of URLs or by "
            "a manifest file written by `beton index` (a file whose name holds '*' is written %2A in its URL)"),
            path=url)


def _spelled_as_given(url: str, pattern: str, path: str, fs: Any) -> str:
    """``path``, a match of the glob ``url`` (``pattern`` is ``url`` as its store spells it, without the protocol),
    spelled as the user spelled ``url``: ``memory://d/part-*`` lists ``/d/part-0``, which the store's own spelling
    turns into ``memory:///d/part-0``, a name a manifest at ``memory://d/`` would not take as within its folder."""
    def folder(text: str) -> str:  # up to the last "/" before the first glob character
        first = min((text.find(character) for character in _GLOB_CHARACTERS if character in text), default=len(text))
        return text[: text.rfind("/", 0, first) + 1]

    given, stored = folder(url), folder(pattern)
    return given + path[len(stored):] if path.startswith(stored) else fs.unstrip_protocol(path)


def _names_a_file(fs: Any, path: str) -> bool:
    """Whether the store holds a file named ``path`` exactly (glob characters and all). Only a missing file is
    an answer: any other failure reaches the retry budget around the listing."""
    try:
        return fs.info(path).get("type") == "file"
    except FileNotFoundError:
        return False


def _expand(item: str, remote: RemoteOptions | None) -> list[str]:
    """The files a path, URL or glob names, in order."""
    if not _is_glob(item):
        return [item]
    if is_url(item):
        options = remote_or_default(remote)
        jitter = random.Random()  # spreads the retries of many machines listing at once

        def listing(fresh: bool) -> list[str]:
            fs, pattern = filesystem(item, options)
            if _names_a_file(fs, pattern):  # as a local path: an object named 'a[1].beton' is that object,
                return [item]               # not the glob's match 'a1.beton'
            return [_spelled_as_given(item, pattern, path, fs) for path in sorted(fs.glob(pattern))]

        matches = with_retries(listing, options, item, "listing the files of the glob",
                               lambda number: time.sleep(backoff(options, number, jitter.random())),
                               missing="no such bucket or folder")
    else:
        matches = sorted(glob.glob(item))
    if not matches:
        raise locate(ShardNotFoundError("no file matches this glob"), path=item)
    return matches


def index(output: str | os.PathLike[str], source: Source, *, verify: bool = False,
          custom_fields: Mapping[str, type[Field]] | None = None, remote: RemoteOptions | None = None) -> Manifest:
    """``beton index``: write the manifest file ``output`` (a path or URL ending in ``.json``) for the shards
    ``source`` names, in that order, and return the manifest.

    Every shard is validated as a Reader validates a file (header, every table, every record against its field):
    local shards all at once, as a union of them opens (:class:`~beton.dataset.union.ShardedDataset`: files read
    in batches, checks run as arrays, seconds for 100,000 small shards), URLs one by one as Readers. With
    ``verify`` every shard is opened as a Reader and every page's CRC32 checked too (``beton verify`` of each
    shard). Shards are listed relative to the manifest where they lie in its directory or below, else by URL; a
    local shard elsewhere is a ValueError (see :mod:`beton.dataset.manifest` for why). The manifest's tables file
    is written beside it (:func:`~beton.dataset.tables_file.write_indexed_manifest`). ``remote``: how shards,
    manifests and ``output`` at URLs are reached (:class:`~beton.storage.remote.RemoteOptions`), kept by the
    manifest returned.
    """
    output = os.fspath(output)
    if not is_manifest_name(output):
        raise ValueError(f"a manifest file's name ends in .json (that is how readers tell it from a beton file), "
                         f"got {output!r}")
    manifest = dataclasses.replace(dataset_manifest(source, remote=remote), tables=None)  # every shard is read
    if verify or any(map(is_url, manifest.shards.locations)):
        rows = []
        for number, shard in enumerate(manifest.shards):
            with manifest.open_shard(number, custom_fields=custom_fields) as reader, \
                    error_context(path=shard.location):
                if verify:
                    verify_reader(reader)
                rows.append(tables_row(reader))
    else:
        # the union builds on this module, so it is imported here, where it is used
        from beton.dataset.union import ShardedDataset

        ShardedDataset(manifest, custom_fields=custom_fields).close()  # raises for the first shard that fails
        rows = [local_tables_row(manifest, number) for number in range(len(manifest.shards))]
    return write_indexed_manifest(manifest, output, rows)
