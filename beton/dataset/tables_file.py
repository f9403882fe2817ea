"""A manifest's tables file: every shard's tables in one file beside the manifest, so that a dataset of 100,000
shards opens by reading two files rather than 100,000.

A :class:`~beton.dataset.union.ShardedDataset` needs every shard's data and allocation tables and page geometry
before its first batch (the orders and the memory layers read them for every sample). Without a tables file it reads
them from every shard (:mod:`beton.dataset.shard_tables`): one visit per file, minutes for 100,000 shards on a
network file system or a store. ``beton index`` (:func:`beton.dataset.shards.index`) and ``beton.ray`` therefore
also write ``<manifest>.tables`` (``train.json`` -> ``train.tables``) and record its SHA-256 in the manifest, which
pins it as it pins each shard's header.

The file is itself a beton file (so it is read, bounded and checked by the machinery every beton file goes
through), one sample per shard, in order: the shard's size, page count, page size, heap offset and size, whether
it has page digests (integers), and its data table, allocation table (the shard's own offsets), file-level
metadata and page digests (bytes, as the shard stores them). Its file-level metadata holds the first shard's
header and field table, from which the dataset's fields are built. A tables file is written only where every
shard's field table is byte for byte the first shard's (what one writer's shards have).

Beside a manifest at a URL it is at a URL too: written locally and uploaded before the manifest, fetched whole
(bounded by its reported size, retried as every remote read) and read from a local copy once its SHA-256 is the
manifest's. Reading it (:func:`read_tables_file`) is untrusted input like any file: its SHA-256 must be the
manifest's, its fields these, one sample per shard, each table's size what the manifest's counts and the first
shard's fields make it, geometry a beton file can have, every payload inside its shard's heap, and the first shard's
header the one the manifest lists (its SHA-256), its field table the one that header's CRC32 names. No shard is
opened: each is checked when the first batch with samples in it is computed
(:meth:`beton.dataset.union.ShardedPages.will_serve`, called by the memory layer before the batch's values are
read): its header's SHA-256 is the manifest's, and its tables, read and checked as without a tables file, must
equal the tables file's, or a :class:`~beton.errors.ShardError` names it before any of its samples is served (a
field without payloads takes its values from the tables file, and no page read would open its shard).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import tempfile
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence

import numpy as np

from beton.errors import BetonError, CorruptDataError, FormatError, ShardError, error_context, locate
from beton.fields import BytesField
from beton.fields.base import Field
from beton.dataset.manifest import Manifest, TablesFile, field_specs, header_digest
from beton.dataset.shard_tables import FirstShard, UnionTables, file_ends, headers_pass
from beton.storage import format as fmt
from beton.storage.digests import digest
from beton.storage.local_file import open_regular
from beton.storage.remote import RemoteOptions, is_url, remote_or_default
from beton.storage.remote.fetch import RangeFetcher
from beton.storage.remote.upload import upload_file
from beton.storage.reader import CONTENT_DIGEST_SLICE, FieldDescriptor, Reader, parse_field_table, read_header

__all__ = ["TABLE_FIELDS", "TABLES_KIND", "tables_file_name", "tables_row", "local_tables_row", "TablesRow",
           "write_tables_file", "write_indexed_manifest", "read_tables_file", "OpenedTables", "check_shard_tables"]

TABLES_KIND = "beton shard tables"
_BLOBS = ("header", "data_table", "allocation_table", "metadata", "digest_table")
#: The fields of a tables file, one sample per shard: its tables as it stores them (empty where it has none).
TABLE_FIELDS: dict[str, Field] = {name: BytesField() for name in _BLOBS}


def tables_file_name(manifest_location: str) -> str:
    """Where ``beton index`` writes the tables file of the manifest at ``manifest_location``: beside it, its name
    ending in ``.tables`` rather than ``.json`` (not ``.beton``: a glob over the shards must not list it)."""
    return manifest_location[: -len(".json")] + ".tables"


@dataclasses.dataclass(frozen=True)
class TablesRow:
    """What the tables file keeps of one shard (``row``: its sample, in :data:`TABLE_FIELDS`' order), with the
    field table that the first shard's row gives the file."""

    row: tuple[bytes, ...]
    field_table: bytes


def tables_row(reader: Reader) -> TablesRow:
    """The tables file's row of an open, validated shard (read while it is open; it may be closed after)."""
    return _row(reader.header, reader.header.tobytes(),
                lambda offset, size: bytes(reader.file_map[offset : offset + size]))


def local_tables_row(manifest: Manifest, number: int) -> TablesRow:
    """The tables file's row of local shard ``number`` of ``manifest``, read from its file (a few reads, no map):
    for shards already validated (``beton index`` opens them together as a union first). A ShardError names a
    shard whose header is no longer the one the manifest lists, or that is shorter than its header says (it
    changed since it was validated)."""
    shard = manifest.shards[number]
    changed = f"shard {number} changed while it was indexed: run `beton index` again"
    with error_context(path=shard.location):
        descriptor = open_regular(shard.location)
        try:
            raw = os.pread(descriptor, fmt.HEADER_SIZE, 0)
            if header_digest(raw) != shard.header_sha256:
                raise ShardError(changed)
            header = np.frombuffer(raw, fmt.HEADER_DTYPE)[0]

            def read(offset: int, size: int) -> bytes:
                data = os.pread(descriptor, size, offset)
                if len(data) != size:
                    raise ShardError(changed)
                return data

            return _row(header, raw, read)
        finally:
            os.close(descriptor)


def _row(header: np.void, raw_header: bytes, read: Callable[[int, int], bytes]) -> TablesRow:
    """A shard's row from its ``header`` (and its bytes), its tables read where the header says they lie."""
    def table(name: str) -> bytes:
        return read(int(header[name]["offset"]), int(header[name]["size"]))

    return TablesRow(tuple(raw_header if name == "header" else table(name) for name in _BLOBS), table("field_table"))


def write_tables_file(location: str, rows: Sequence[TablesRow]) -> tuple[str, int] | None:
    """Write the tables file of the shards whose rows are ``rows`` (in order) at ``location`` (a local path), and
    return its SHA-256 (hex) and size, which the manifest records; None, writing nothing, where a shard's field
    table differs from the first's in its bytes (those shards are read one by one when the dataset opens)."""
    from beton.storage.writer import DatasetWriter  # the writing side, only for `beton index`

    first = rows[0]
    if any(row.field_table != first.field_table for row in rows[1:]):
        return None
    metadata = {"kind": TABLES_KIND, "first_field_table": first.field_table.hex()}
    DatasetWriter(location, TABLE_FIELDS, metadata=metadata, num_workers=0, progress=False).from_indexed_dataset(
        [row.row for row in rows])
    sha256 = hashlib.sha256()
    with open(location, "rb") as file:  # in pieces: hashlib.file_digest is Python 3.11+
        for chunk in iter(lambda: file.read(FETCH_BYTES), b""):
            sha256.update(chunk)
        return sha256.hexdigest(), os.fstat(file.fileno()).st_size


def write_indexed_manifest(manifest: Manifest, output: str, rows: Sequence[TablesRow],
                           remote: RemoteOptions | None = None) -> Manifest:
    """Write the manifest file ``output`` (a path or URL) of ``manifest`` with its tables file (``rows``: each
    shard's :func:`tables_row`, in order) beside it, and return the manifest as written (``source`` and ``tables``
    set). What ``beton index`` and ``beton.ray`` write. The tables file is written first, since the manifest pins
    it; at a URL it is written locally and uploaded whole (:func:`~beton.storage.remote.upload.upload_file`, within
    the retry budget of ``remote``, default the manifest's own), as the manifest is. A shard the manifest cannot
    list is a ValueError before anything is written."""
    manifest.to_json(output)
    location = tables_file_name(output)
    _refuse_a_shard_as_tables_file(manifest, location)
    if is_url(output):
        with tempfile.TemporaryDirectory(prefix="beton-tables-") as directory:
            local = os.path.join(directory, "manifest.tables")
            pinned = write_tables_file(local, rows)
            if pinned is not None:
                upload_file(local, location, remote_or_default(remote if remote is not None else manifest.remote))
    else:
        pinned = write_tables_file(location, rows)
        if pinned is None:  # a tables file of an earlier index would stay beside the manifest, unpinned
            with contextlib.suppress(FileNotFoundError):
                os.unlink(location)
    written = dataclasses.replace(manifest, tables=None if pinned is None else TablesFile(location, *pinned))
    written.write(output, remote=remote)
    return dataclasses.replace(written, source=output)


def _refuse_a_shard_as_tables_file(manifest: Manifest, location: str) -> None:
    """ValueError before anything is written where the tables file would be written over a listed shard."""
    if is_url(location):
        clash = any(shard.location == location for shard in manifest.shards)
    else:
        clash = any(not is_url(shard.location) and _same_file(shard.location, location) for shard in manifest.shards)
    if clash:
        raise ValueError(f"the tables file {location} would be written over a shard of the manifest: name the "
                         "manifest otherwise (its tables file is the manifest's name with .tables)")


def _same_file(shard: str, location: str) -> bool:
    try:
        return os.path.samefile(shard, location)
    except OSError:
        return os.path.abspath(shard) == os.path.abspath(location)


#: Bytes of a tables file at a URL fetched by one request (and held in memory at once).
FETCH_BYTES = 8 * 1024 * 1024


@dataclasses.dataclass(frozen=True, eq=False)
class OpenedTables:
    """What a tables file gives a dataset: the shards' tables as columns, the first shard's header (a structured
    record) and descriptors, and the first shard as the others are compared with it."""

    tables: UnionTables
    header: np.void
    descriptors: dict[str, FieldDescriptor]
    first: FirstShard

    def shard_tables(self, manifest: Manifest, number: int) -> tuple[bytes, bytes]:
        """Shard ``number``'s data and allocation tables as the tables file holds them (as the shard stores them:
        its own offsets)."""
        low, high = (int(bound) for bound in manifest.bounds[number : number + 2])
        data, allocation = self.first.data_dtype.itemsize, self.first.num_payload_fields * fmt.ALLOCATION_DTYPE.itemsize
        return (self.tables.data[low * data : high * data],
                self.tables.allocations[low * allocation : high * allocation])


def check_shard_tables(manifest: Manifest, number: int, stored: tuple[bytes, bytes], listed: tuple[bytes, bytes]
                       ) -> None:
    """ShardError naming shard ``number`` of ``manifest`` unless its data and allocation tables as its file stores
    them (``stored``) are those its tables file holds for it (``listed``): the comparison a dataset makes when it
    first opens the shard, and ``beton verify`` for every shard."""
    assert manifest.tables is not None
    different = [what for what, mine, theirs in zip(("data table", "allocation table"), stored, listed)
                 if mine != theirs]
    if different:
        verb = "differ" if len(different) > 1 else "differs"
        raise locate(ShardError(
            f"shard {number} is not the file the manifest's tables file ({manifest.tables.location}) describes: its "
            f"{' and '.join(different)} {verb} (the shard or the tables file changed since `beton index` wrote them; "
            "run it again)"), path=manifest.shards[number].location)


def read_tables_file(manifest: Manifest, verify_content: bool | None,
                     remote: RemoteOptions | None = None) -> OpenedTables:
    """The tables file ``manifest.tables`` (a path, or a URL reached as ``remote`` says, default the manifest's
    own), checked as the module docstring says: a FormatError naming it (and the shard) for anything else, a
    ShardError where ``verify_content`` asks for digests a shard lacks. ``verify_content`` as
    :meth:`~beton.dataset.manifest.Manifest.content_checks` gives it.

    Its size must be the manifest's before a byte is read. At a URL it is fetched in ranges of
    :data:`FETCH_BYTES` (the bounded, retried range reads of any remote file) into a local temporary file, hashed
    as it arrives, so that its pin is checked before any parser sees its bytes (a digest that differs is fetched
    again within the retry budget, as a page is: a byte damaged on the way); then it is read from that file as a
    local one is."""
    listed = manifest.tables
    assert listed is not None
    if not is_url(listed.location):
        return _read_tables_file(manifest, listed.location, verify_content)
    options = remote_or_default(remote if remote is not None else manifest.remote)
    with error_context(path=listed.location), tempfile.TemporaryDirectory(prefix="beton-tables-") as directory:
        local = os.path.join(directory, "manifest.tables")
        try:
            fetcher = RangeFetcher(listed.location, options)
            _check_size(fetcher.size, listed.size)
            for _ in range(options.retries + 1):  # a digest that differs: a byte damaged on the way, fetched again
                digest = _copy(fetcher, local)
                if digest == listed.sha256:
                    break
        except FileNotFoundError as error:
            raise _missing(error) from None
        except OSError as error:  # the local copy: a full disk, say
            if isinstance(error, BetonError):
                raise
            raise FormatError(f"the tables file could not be copied to {local}: {error}") from None
        _check_sha256(digest, listed.sha256)
        try:
            return _read_tables_file(manifest, local, verify_content)
        except BetonError as error:
            if getattr(error, "path", None) == local:  # the file the user knows is the URL
                error.path = listed.location
            raise


def _copy(fetcher: RangeFetcher, local: str) -> str:
    """The remote tables file copied to ``local`` in ranges of :data:`FETCH_BYTES`; the SHA-256 of what arrived."""
    sha256 = hashlib.sha256()
    with open(local, "wb") as file:
        for start in range(0, fetcher.size, FETCH_BYTES):
            end = min(fetcher.size, start + FETCH_BYTES)
            chunk = fetcher.fetch(start, end, f"the tables file (bytes {start}..{end})")
            sha256.update(chunk)
            file.write(chunk)
    return sha256.hexdigest()


def _missing(error: BaseException) -> FormatError:
    return FormatError(f"the manifest's tables file is missing ({error}); run `beton index` again, or remove "
                       "\"tables\" from the manifest to read every shard's tables instead")


def _check_size(size: int, listed: int) -> None:
    if size != listed:
        raise FormatError(f"the tables file is {size} bytes, the manifest lists {listed} (it changed since "
                          "`beton index` wrote it; run it again)")


def _check_sha256(sha256: str, expected: str) -> None:
    if sha256 != expected:
        raise FormatError("the tables file is not the one the manifest lists: its SHA-256 differs (the file changed "
                          "since `beton index` wrote it; run it again)")


def _read_tables_file(manifest: Manifest, path: str, verify_content: bool | None) -> OpenedTables:
    """:func:`read_tables_file` of the local file ``path`` (the manifest's tables file, or a copy of it)."""
    listed = manifest.tables
    assert listed is not None
    with error_context(path=listed.location):
        try:
            reader = Reader(path, max_image_pixels=None)
        except FileNotFoundError as error:
            raise _missing(error) from None
        with reader:
            _check_size(len(reader.file_map), listed.size)  # before the copy below costs its size
            content = reader.file_map.tobytes()  # what is hashed is what is used
            _check_sha256(hashlib.sha256(content).hexdigest(), listed.sha256)
            names = [(d.name, d.type_name) for d in reader.descriptors.values()]
            if names != [(name, field.type_name) for name, field in TABLE_FIELDS.items()] or \
                    reader.metadata.get("kind") != TABLES_KIND:
                raise FormatError(f"not a tables file: its fields are {names}")
            if reader.num_samples != len(manifest.shards):
                raise FormatError(f"the tables file lists {reader.num_samples} shards, the manifest "
                                  f"{len(manifest.shards)}")
            columns = {name: reader.descriptors[name].payload_column for name in _BLOBS}
            allocation = np.array(reader.allocation_table)
            metadata = reader.metadata
        blobs = {name: _Column(content, allocation[:, column]) for name, column in columns.items()}
        if (blobs["header"].sizes != fmt.HEADER_SIZE).any():
            raise FormatError(f"a shard's header in the tables file is not {fmt.HEADER_SIZE} bytes")
        headers = np.frombuffer(b"".join(blobs["header"]), fmt.HEADER_DTYPE)
        header, descriptors = _first_shard(manifest, headers[0], metadata)
        field_table = bytes.fromhex(str(metadata["first_field_table"]))
        first = FirstShard(field_table, int(header["num_fields"]), int(header["num_payload_fields"]),
                           _data_dtype(descriptors), {d.name: d.payload_column for d in descriptors.values()
                                                      if d.has_payload})
        sizes = file_ends(headers)
        ok = headers_pass(manifest, range(len(headers)), blobs["header"], headers, sizes, first)
        ok &= (headers["field_table"]["crc32"] == zlib.crc32(field_table)) & \
            (headers["field_table"]["size"] == len(field_table))
        page_digests = _check_tables(headers, blobs, field_table, ok, verify_content)
        for number in np.flatnonzero(~ok)[:1].tolist():
            raise locate(FormatError(
                f"shard {number}: the tables file does not hold the tables its header names (the header the manifest "
                "lists, by SHA-256): the tables file or the manifest was changed; run `beton index` again"),
                note=f"(shard {manifest.shards.locations[number]})")
        tables = UnionTables(sizes.astype(np.int64), headers["num_pages"].astype(np.int64),
                             headers["page_size"].astype(np.int64), headers["heap_offset"].astype(np.int64),
                             headers["heap_size"].astype(np.int64), b"".join(blobs["data_table"]),
                             b"".join(blobs["allocation_table"]),
                             list(blobs["metadata"]), page_digests,
                             table_offsets=np.stack([headers["data_table"]["offset"],
                                                     headers["allocation_table"]["offset"]], axis=1).astype(np.int64))
        _check_allocations(manifest, tables, first)
        return OpenedTables(tables, header, descriptors, first)


def _check_tables(headers: np.ndarray, blobs: Mapping[str, _Column], field_table: bytes, ok: np.ndarray,
                  verify_content: bool | None) -> list[bytes | None]:
    """Clear ``ok`` for the shards whose tables in the file are not those their header names: each table's CRC32,
    the digest table against the header's content digest and, where content is checked, each table against its
    digest. Every check runs over all shards at once (a hash per table and shard, compared as arrays). Returns
    each shard's page digests where its content is checked, else None."""
    names = ("data_table", "allocation_table", "metadata", "digest_table")
    for name in names:
        # each table as long as its header says, before anything is hashed, joined or reshaped: lengths that only
        # add up would move samples across shards
        ok &= blobs[name].sizes == headers[name]["size"].astype(np.int64)
    if verify_content is False:  # where the digests are checked they pin every table, CRC32s add nothing
        for name in names:
            numbers = np.flatnonzero(ok)
            crcs = np.array([zlib.crc32(blobs[name][number]) for number in numbers.tolist()], np.uint32)
            ok[numbers] &= crcs == headers[name]["crc32"][numbers]
    numbers = np.flatnonzero(ok)
    tables = [blobs["digest_table"][number] for number in numbers.tolist()]
    header_bytes = headers.view(np.uint8).reshape(len(headers), fmt.HEADER_SIZE)
    ok[numbers] &= (_digests(tables) == header_bytes[numbers, CONTENT_DIGEST_SLICE]).all(axis=1)
    if verify_content is False:
        return [None] * len(headers)
    rows = np.frombuffer(b"".join(tables), np.uint8).reshape(-1, fmt.DIGEST_SIZE)
    # shard k's digest table is num_pages + len(DIGESTED_TABLES) rows; the tables' rows follow its pages'
    first_rows = np.concatenate([[0], np.cumsum(headers["num_pages"][numbers].astype(np.int64) +
                                                len(fmt.DIGESTED_TABLES))])[:-1]
    for position, name in enumerate(fmt.DIGESTED_TABLES):
        if name == "page_checksums":
            continue  # not kept: the union does not read it
        expected = rows[first_rows + headers["num_pages"][numbers].astype(np.int64) + position]
        if name == "field_table":  # every shard's is the first shard's
            ok[numbers] &= (expected == np.frombuffer(digest(field_table), np.uint8)).all(axis=1)
            continue
        ok[numbers] &= (_digests([blobs[name][number] for number in numbers.tolist()]) == expected).all(axis=1)
    pages = headers["num_pages"].tolist()
    return [blobs["digest_table"][number][: pages[number] * fmt.DIGEST_SIZE] if ok[number] else None
            for number in range(len(headers))]


class _Column:
    """One field's payloads in a tables file (``content``), one per shard, each sliced out when asked for: a list
    of them all would hold 100,000 small objects per field at once (in memory until the end, and in the garbage
    collector's passes)."""

    def __init__(self, content: bytes, allocation: np.ndarray) -> None:
        self._content = content
        self._offsets, self.sizes = allocation["offset"].tolist(), allocation["size"].astype(np.int64)
        self._ends = (allocation["offset"] + allocation["size"]).tolist()

    def __len__(self) -> int:
        return len(self._offsets)

    def __getitem__(self, number: int) -> bytes:
        return self._content[self._offsets[number] : self._ends[number]]

    def __iter__(self) -> Iterator[bytes]:
        content = self._content
        return (content[start:end] for start, end in zip(self._offsets, self._ends))


def _digests(blobs: list[bytes]) -> np.ndarray:
    """The digest of each blob, as a ``(len(blobs), DIGEST_SIZE)`` uint8 array."""
    return np.frombuffer(b"".join(map(digest, blobs)), np.uint8).reshape(len(blobs), fmt.DIGEST_SIZE)


def _check_allocations(manifest: Manifest, tables: UnionTables, first: FirstShard) -> None:
    """FormatError naming the first shard with a payload outside its heap (the Reader's rule, every shard at
    once)."""
    columns = first.num_payload_fields
    if not columns or not len(tables.allocations):
        return
    counts = manifest.shards.counts
    table = np.frombuffer(tables.allocations, fmt.ALLOCATION_DTYPE).reshape(-1, columns)
    start = np.repeat(tables.heap_offsets, counts)[:, None].astype(np.uint64)
    size = np.repeat(tables.heap_sizes, counts)[:, None].astype(np.uint64)
    sizes = table["size"]
    bad = (table["offset"] < start) | (sizes > size) | (table["offset"] - start > size - np.minimum(sizes, size))
    rows = np.flatnonzero(bad.any(axis=1))
    if len(rows):
        number = int(np.searchsorted(manifest.shards.starts[1:], rows[0], side="right"))
        raise locate(FormatError(f"shard {number}: a payload lies outside its heap (in the tables file)"),
                     note=f"(shard {manifest.shards.locations[number]})")


def _first_shard(manifest: Manifest, header: np.void, metadata: Mapping[str, object]
                 ) -> tuple[np.void, dict[str, FieldDescriptor]]:
    """The first shard's header (checked as a Reader checks a header, and the manifest's) and fields, from its field
    table in the tables file's metadata (the table its header's CRC32 names)."""
    raw_header = header.tobytes()
    header = read_header(np.frombuffer(raw_header, np.uint8))
    try:
        manifest.check_head(0, raw_header, int(header["num_samples"]))  # the manifest pins it
    except ShardError:  # the shard itself was not read: the tables file is the one that disagrees with the manifest
        raise ShardError("the tables file holds another header for shard 0 than the manifest lists (its SHA-256 or "
                         "sample count differs: the tables file is another index's, or either changed; run "
                         "`beton index` again)") from None
    try:
        field_table = bytes.fromhex(str(metadata.get("first_field_table")))
    except ValueError:
        raise FormatError("the tables file's first field table is not hexadecimal") from None
    if zlib.crc32(field_table) != int(header["field_table"]["crc32"]) or \
            len(field_table) != int(header["field_table"]["size"]):
        raise CorruptDataError("the tables file's first field table is not the one its header names")
    descriptors = {d.name: d for d in parse_field_table(np.frombuffer(field_table, np.uint8), header)}
    manifest.check_fields(0, field_specs(descriptors))
    return header, descriptors


def _data_dtype(descriptors: Mapping[str, FieldDescriptor]) -> np.dtype:
    try:
        return fmt.data_table_dtype((d.name, d.metadata_dtype) for d in descriptors.values())
    except (TypeError, ValueError) as error:
        raise FormatError(f"the fields' metadata dtypes do not form a data table record: {error}") from None
