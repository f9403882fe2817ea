"""Assembling a .beton file in the parent process: heap pages, then tables, then the header, then rename.

:class:`FileBuilder` receives encoded chunks in sample order, packs payloads into pages (see
:class:`HeapPacker`), and on :meth:`FileBuilder.commit` writes the tables and the header into a temporary file
that it renames onto the target. :meth:`FileBuilder.abort` deletes the temporary file, so nothing
half-written ever appears under the target name and an existing file there is left untouched; it removes the
file first and never flushes, so a full disk (whose every write fails) cannot keep it from being removed.

The temporary file is created with mode 0666 minus the umask, as ``open()`` creates files (``mkstemp`` would
give 0600 whatever the umask, and the renamed dataset would be unreadable to other users and containers).

What ends a write, and what becomes of the temporary file ``<target>.tmp-<pid>-<random>``:

* an error, Ctrl-C, **SIGTERM** or **SIGHUP** (a closed terminal or SSH session): the write unwinds, the worker
  processes are stopped and the temporary file removed; a signal is then raised again with its previous (default)
  handler, so the process ends as the sender asked (:func:`sigterm_cleans_up`);
* **SIGKILL** (the OOM killer) or a crash: nothing can run in the process. Its worker processes end with it
  (:mod:`beton.storage.worker_lifetime`); the temporary file stays, and the next write to the same target
  removes it (:func:`remove_stale_temporaries`).

A stale file is told from a live one by a lock, not by its pid (which a later process may reuse): the writer holds
an exclusive ``flock`` on its temporary file from creation until the rename, and the kernel drops that lock when
the last descriptor of the file is closed, that is when the writer and every process it forked have ended. A file
named like a temporary of the target that can be locked is one whose writer is gone; a concurrent writer's cannot
be locked and is left alone. Where the file system does not support ``flock``, nothing is removed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import hashlib
import json
import os
import re
import secrets
import signal
import stat
import tempfile
import threading
import zlib
from collections.abc import Iterator
from typing import Any, BinaryIO

import numpy as np

from beton import dtypes
from beton.storage import format as fmt
from beton.storage.digests import digest
from beton.storage.encode import EncodedChunk, EncodeSpec
from beton.errors import BetonError, WriterError, locate
from beton.storage.remote.options import RemoteOptions, is_url, remote_or_default
from beton.storage.remote.upload import check_destination, upload_file

_TABLE_ALIGNMENT = 64
_WRITE_BUFFER = 1 << 20
_TEMPORARY_NAME_ATTEMPTS = 100  # as tempfile's: names are random, a clash is a stale file or a concurrent writer
#: The signals that end a write cleanly while they have their default action (see :func:`sigterm_cleans_up`).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class HeapPacker:
    """Appends payloads to the heap, page by page, computing each page's CRC32 and SHA-256 as it goes.

    A payload that fits in a page never crosses a page boundary (the rest of the page is zero-filled);
    a larger one starts on a fresh page and spans as many consecutive pages as it needs.
    """

    def __init__(self, file: BinaryIO, page_size: int) -> None:
        self._file = file
        self._page_size = page_size
        self._position = 0  # bytes written to the heap so far
        self._page_crc = 0
        self._page_hash = _page_hasher()
        self.page_checksums: list[int] = []
        self.page_digests: list[bytes] = []

    @property
    def size(self) -> int:
        return self._position

    def append(self, payload: bytes) -> int:
        """Write one payload; return its absolute offset in the file."""
        used = self._position % self._page_size
        if used and used + len(payload) > self._page_size:
            self._write(bytes(self._page_size - used))  # start a fresh page
        offset = fmt.HEAP_OFFSET + self._position
        self._write(payload)
        return offset

    def finish(self) -> np.ndarray:
        """Close the last (possibly short) page; return every page's CRC32 (:attr:`page_digests` holds their
        digests)."""
        if self._position % self._page_size:
            self._end_page()
        return np.array(self.page_checksums, dtype=fmt.PAGE_CHECKSUM_DTYPE)

    def _end_page(self) -> None:
        self.page_checksums.append(self._page_crc)
        self.page_digests.append(self._page_hash.digest())
        self._page_crc, self._page_hash = 0, _page_hasher()

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while len(view):
            room = self._page_size - self._position % self._page_size
            piece, view = view[:room], view[room:]
            self._file.write(piece)
            self._page_crc = zlib.crc32(piece, self._page_crc)
            self._page_hash.update(piece)
            self._position += len(piece)
            if self._position % self._page_size == 0:
                self._end_page()


def _page_hasher() -> Any:
    return hashlib.sha256()


@dataclasses.dataclass
class _RecordSample:
    """A sample waiting in a record: where its row and allocations live, its payloads and their pieces."""

    rows: np.ndarray
    allocations: np.ndarray
    row: int
    payloads: list[bytes]
    pieces: list[list[int] | None]

    @property
    def nbytes(self) -> int:
        return sum(len(payload) if ends is None else ends[-1] for payload, ends in zip(self.payloads, self.pieces))


class _Record:
    """Samples that share a page when some field groups its pieces (progressive-JPEG scans, PCR's layout).

    Layout of a record: every sample's ungrouped payloads, in sample order; then every sample's first piece,
    then every sample's second piece, and so on. Reading the first k pieces of every sample of the record thus
    reads a prefix of it. A grouped payload's allocation spans from its first piece to the end of its last;
    the field records where each piece starts, relative to that offset. Bytes after the last piece end are
    not stored (for JPEGs: the end marker, which readers append).
    """

    def __init__(self) -> None:
        self.samples: list[_RecordSample] = []
        self.nbytes = 0

    def add(self, sample: _RecordSample) -> None:
        self.samples.append(sample)
        self.nbytes += sample.nbytes

    def layout(self) -> tuple[bytes, list[list[tuple[int, int, list[int] | None]]]]:
        """The record's bytes, and per sample and column (start in the record, allocation size, piece starts)."""
        data = bytearray()
        placements: list[list] = []
        for sample in self.samples:
            placements.append([])
            for payload, ends in zip(sample.payloads, sample.pieces):
                placements[-1].append((len(data), len(payload), None) if ends is None else None)
                if ends is None:
                    data += payload
        piece_positions: dict[tuple[int, int], list[int]] = {}
        depth = max((len(ends) for s in self.samples for ends in s.pieces if ends is not None), default=0)
        for level in range(depth):
            for number, sample in enumerate(self.samples):
                for column, (payload, ends) in enumerate(zip(sample.payloads, sample.pieces)):
                    if ends is not None and level < len(ends):
                        piece_positions.setdefault((number, column), []).append(len(data))
                        data += payload[(ends[level - 1] if level else 0) : ends[level]]
        for (number, column), positions in piece_positions.items():
            ends = self.samples[number].pieces[column]
            last_end = positions[-1] + ends[-1] - (ends[-2] if len(ends) > 1 else 0)
            placements[number][column] = (positions[0], last_end - positions[0], [p - positions[0] for p in positions])
        return bytes(data), placements


class FileBuilder:
    """Owns the temporary file of one write; see the module docstring. ``remote``: how a target at a URL is
    reached (its ``storage_options`` and retry budget)."""

    def __init__(self, spec: EncodeSpec, page_size: int, metadata: bytes | None = None,
                 field_table: bytes | None = None, remote: RemoteOptions | None = None) -> None:
        self._spec = spec
        self._remote = remote_or_default(remote)
        self._url = spec.path if is_url(spec.path) else None
        if self._url is not None:
            check_destination(self._url, self._remote)  # unreachable, refused or missing: before any encoding
        local_target = spec.path if self._url is None else staging_path(self._url)
        self._page_size = page_size
        self._metadata = b"{}" if metadata is None else metadata  # the metadata table's bytes
        # The field table's bytes (the writer's, built once; merging copies the shards'), or None: built from spec
        self._field_table = field_table
        self._payload_fields = spec.payload_fields
        remove_stale_temporaries(local_target)
        handle, self._temp_path = create_temporary(local_target)
        self._file = os.fdopen(handle, "wb", buffering=_WRITE_BUFFER)
        self._file.write(bytes(fmt.HEAP_OFFSET))  # the header is written last, over these zeros
        self._heap = HeapPacker(self._file, page_size)
        self._record = _Record()  # samples with grouped pieces, waiting until a page is full
        self._rows: list[np.ndarray] = []
        self._allocations: list[np.ndarray] = []
        self.num_samples = 0
        self.file_size: int | None = None  # bytes of the file, once committed
        self._next_position = 0  # of the next chunk: samples written plus samples skipped

    def add(self, chunk: EncodedChunk) -> None:
        if chunk.first_position != self._next_position:
            raise WriterError(f"chunk for sample {chunk.first_position} arrived at {self._next_position}")
        self._next_position += chunk.num_items
        allocations = np.zeros((len(chunk.payloads), len(self._payload_fields)), fmt.ALLOCATION_DTYPE)
        for row, payloads in enumerate(chunk.payloads):
            pieces = self._pieces(chunk.rows[row])
            if any(p is not None for p in pieces) or self._record.samples:
                self._add_to_record(_RecordSample(chunk.rows, allocations, row, payloads, pieces))
                continue
            for column, payload in enumerate(payloads):
                allocations[row, column] = (self._heap.append(payload), len(payload))
        self._rows.append(chunk.rows)
        self._allocations.append(allocations)
        self.num_samples += len(chunk.rows)

    def _pieces(self, row: np.void) -> list[list[int] | None]:
        """Per payload column, the piece ends of a field that groups pieces within pages (else None; a field
        with no pieces for this sample stores it whole)."""
        return [self._spec.fields[index].layout_pieces(row[self._spec.names[index]]) or None
                for index in self._payload_fields]

    def _add_to_record(self, sample: _RecordSample) -> None:
        if self._record.samples and self._record.nbytes + sample.nbytes > self._page_size:
            self._flush_record()
        self._record.add(sample)

    def _flush_record(self) -> None:
        """Write the pending samples as one record (see :class:`_Record`), then fill their allocations."""
        if not self._record.samples:
            return
        data, placements = self._record.layout()
        offset = self._heap.append(data)
        for sample, placement in zip(self._record.samples, placements):
            for column, (start, size, piece_starts) in enumerate(placement):
                sample.allocations[sample.row, column] = (offset + start, size)
                if piece_starts is not None:
                    index = self._payload_fields[column]
                    self._spec.fields[index].record_piece_starts(sample.rows[sample.row][self._spec.names[index]],
                                                                 piece_starts)
        self._record = _Record()

    def commit(self) -> None:
        """Write tables and header, flush to disk, and rename onto the target path (or upload to the target URL,
        then remove the local file)."""
        self._flush_record()
        page_checksums = self._heap.finish()
        tables = {
            "field_table": field_table_bytes(self._spec) if self._field_table is None else self._field_table,
            "data_table": _concatenate(self._rows, self._spec.data_dtype).tobytes(),
            "allocation_table": _concatenate(
                self._allocations, fmt.ALLOCATION_DTYPE, (0, len(self._payload_fields))
            ).tobytes(),
            "page_checksums": page_checksums.tobytes(),
            "metadata": self._metadata,
        }
        # Last, the digest table: every page's digest, then every table's (format.DIGESTED_TABLES' order)
        tables["digest_table"] = b"".join([*self._heap.page_digests, *(digest(tables[name]) for name in fmt.DIGESTED_TABLES)])
        header = np.zeros((), fmt.HEADER_DTYPE)
        header["content_digest"] = digest(tables["digest_table"])
        position = fmt.HEAP_OFFSET + self._heap.size
        for name, blob in tables.items():
            padding = -position % _TABLE_ALIGNMENT
            self._file.write(bytes(padding))
            position += padding
            header[name] = (position, len(blob), zlib.crc32(blob), 0)
            self._file.write(blob)
            position += len(blob)
        self.file_size = position
        self._fill_header(header, len(page_checksums))
        self._file.seek(0)
        self._file.write(header_bytes(header))
        self._file.flush()
        if self._url is not None:
            upload_file(self._temp_path, self._url, self._remote)
            os.unlink(self._temp_path)  # before close, which drops the lock that marks the file live
        else:
            os.fsync(self._file.fileno())
            os.replace(self._temp_path, self._spec.path)  # before close, as above
        self._file.close()

    def abort(self) -> None:
        """Remove the temporary file; never raises for the file's own I/O errors (the error that made the
        write fail is the one to report)."""
        try:
            os.unlink(self._temp_path)  # first: an open file can be unlinked, and its space is freed on close
        except FileNotFoundError:
            pass
        finally:
            try:
                self._file.close()
            except OSError:
                pass  # close() flushes the buffer, which fails again on a full disk; the data is discarded anyway

    def _fill_header(self, header: np.ndarray, num_pages: int) -> None:
        header["magic"] = fmt.MAGIC
        header["version"] = fmt.FORMAT_VERSION
        header["header_size"] = fmt.HEADER_SIZE
        header["page_size"] = self._page_size
        header["num_samples"] = self.num_samples
        header["num_fields"] = len(self._spec.fields)
        header["num_payload_fields"] = len(self._payload_fields)
        header["heap_offset"] = fmt.HEAP_OFFSET
        header["heap_size"] = self._heap.size
        header["num_pages"] = num_pages


_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


def write_error(path: str, error: OSError) -> WriterError:
    """The WriterError for an OSError while a file was written (a full disk says so; a BetonError's own message,
    without the file it names again)."""
    detail = error.args[0] if isinstance(error, BetonError) and error.args else error.strerror or error
    folder = os.path.dirname(os.path.abspath(path))
    hint = (" (the disk or quota is full)" if error.errno in _FULL_ERRNOS else
            f" (the folder {folder} does not exist: make it first)"
            if error.errno == errno.ENOENT and not is_url(path) and not os.path.isdir(folder) else "")
    return locate(WriterError(f"writing failed: {detail}{hint}"), path=path)


class _Terminated(BaseException):
    """SIGTERM or SIGHUP arrived during a write: unwinds it like KeyboardInterrupt (``except Exception`` in a
    dataset does not stop it), then the signal is raised again."""


@contextlib.contextmanager
def sigterm_cleans_up() -> Iterator[None]:
    """While the block runs, SIGTERM and SIGHUP (:data:`STOP_SIGNALS`) unwind it (running every cleanup: workers
    are stopped, the temporary file is removed) instead of killing the process at once; afterwards the previous
    handlers are back and the signal is raised again, so the process still ends as the sender asked. Only in the
    main thread, and only for a signal that has its default action (a handler of the program's own, or SIG_IGN as
    under ``nohup``, is left alone)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    handled = [signum for signum in STOP_SIGNALS if signal.getsignal(signum) is signal.SIG_DFL]
    owner = os.getpid()
    received: list[int] = []

    def handler(signum: int, frame: Any) -> None:
        if os.getpid() != owner:  # a forked worker before its initializer ran: die as it would have
            signal.signal(signum, signal.SIG_DFL)
            signal.raise_signal(signum)
        elif not received:  # a second signal must not interrupt the cleanup the first one started
            received.append(signum)
            raise _Terminated

    previous = {signum: signal.signal(signum, handler) for signum in handled}
    try:
        yield
    except _Terminated:
        pass
    finally:
        for signum, action in previous.items():
            signal.signal(signum, action)
        if received:  # also when the cleanup raised something else: the sender asked for the process to end
            signal.raise_signal(received[0])  # the default action: the process ends, killed by that signal


def staging_path(url: str) -> str:
    """Where the file for ``url`` is built before its upload: in the system's temporary directory, named by the
    URL's last part and a digest of the whole URL (two URLs never share a name; a write to the same URL finds a dead
    writer's file)."""
    digest = hashlib.sha256(url.encode("utf-8")).hexdigest()[:16]
    name = re.sub(r"[^A-Za-z0-9._-]", "_", url.rstrip("/").rsplit("/", 1)[-1])[:64]
    return os.path.join(tempfile.gettempdir(), f"beton-upload-{digest}-{name}")


def create_temporary(path: str) -> tuple[int, str]:
    """Create a new, empty file next to ``path`` (so the final rename stays on one file system), open it for
    writing and lock it (``flock``, held as long as the descriptor is open: see the module docstring); return its
    descriptor and name. Its mode is 0666 minus the umask, as for ``open(path, "w")``.
    """
    directory, name = os.path.split(os.path.abspath(path))
    for _ in range(_TEMPORARY_NAME_ATTEMPTS):
        temporary = os.path.join(directory, f"{name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
        try:
            handle = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            continue
        if _lock(handle) is False or not _same_file(handle, temporary):
            # Between creating and locking, another write's clean-up found it unlocked, locked it (hence False)
            # and may have removed it: take another name.
            os.close(handle)
            continue
        return handle, temporary
    raise FileExistsError(f"no unused temporary name next to {path} after {_TEMPORARY_NAME_ATTEMPTS} attempts")


def remove_stale_temporaries(path: str) -> list[str]:
    """Remove the temporary files of earlier writes to ``path`` whose writers have ended (killed by SIGKILL, a
    crash, a power cut) and return their names: files named as :func:`create_temporary` names them that nobody
    holds locked. A concurrent writer's file is locked, and kept. Never raises for a file it cannot open, lock or
    remove (another user's, say): the write goes on, the file stays."""
    directory, name = os.path.split(os.path.abspath(path))
    pattern = re.compile(re.escape(name) + r"\.tmp-([0-9]+)-[0-9a-f]{8}")
    removed = []
    try:  # this process's own files are live: where flock is emulated by POSIX locks (NFS), which belong to the
        # process, another thread's write would get the lock at once
        entries = [entry.name for entry in os.scandir(directory)
                   if (match := pattern.fullmatch(entry.name)) and int(match[1]) != os.getpid()]
    except OSError:
        return removed
    for entry in entries:
        temporary = os.path.join(directory, entry)
        try:  # O_RDWR: flock on NFS is a POSIX lock, which needs a writable descriptor for an exclusive lock
            handle = os.open(temporary, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            if stat.S_ISREG(os.fstat(handle).st_mode) and _lock(handle) and _same_file(handle, temporary):
                os.unlink(temporary)  # with the lock held, so no writer can be starting on this file
                removed.append(temporary)
        except OSError:
            pass
        finally:
            os.close(handle)
    return removed


def _lock(handle: int) -> bool | None:
    """Take an exclusive flock without waiting: True, False when another descriptor holds one, None when the
    file system cannot lock (then no write's file is ever taken for stale)."""
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError:
        return None
    return True


def _same_file(handle: int, path: str) -> bool:
    """Whether ``path`` still names the file open as ``handle`` (it was not removed or replaced meanwhile)."""
    try:
        named = os.lstat(path)
    except FileNotFoundError:
        return False
    opened = os.fstat(handle)
    return (named.st_dev, named.st_ino) == (opened.st_dev, opened.st_ino)


def header_bytes(header: np.ndarray) -> bytes:
    """The header record with its own CRC32 filled in."""
    header = header.copy()
    header["header_crc32"] = zlib.crc32(header.tobytes()[: fmt.HEADER_SIZE - 4])
    return header.tobytes()


def field_table_bytes(spec: EncodeSpec) -> bytes:
    """Field records followed by the UTF-8 strings they point to."""
    records = np.zeros(len(spec.fields), fmt.FIELD_RECORD_DTYPE)
    strings = bytearray()

    def add_string(text: str) -> tuple[int, int]:
        data = text.encode("utf-8")
        strings.extend(data)
        return len(strings) - len(data), len(data)

    payload_columns = {field_index: column for column, field_index in enumerate(spec.payload_fields)}
    for index, (name, field) in enumerate(zip(spec.names, spec.fields)):
        records[index]["type_name"] = add_string(field.stored_type_name())
        records[index]["name"] = add_string(name)
        records[index]["arguments"] = add_string(json.dumps(field.arguments(), ensure_ascii=False))
        records[index]["metadata_dtype"] = add_string(dtypes.dtype_to_json(field.metadata_dtype))
        records[index]["payload_column"] = payload_columns.get(index, fmt.NO_PAYLOAD)
    return records.tobytes() + bytes(strings)


def _concatenate(parts: list[np.ndarray], dtype: np.dtype, empty_shape: tuple = (0,)) -> np.ndarray:
    return np.concatenate(parts) if parts else np.zeros(empty_shape, dtype)
