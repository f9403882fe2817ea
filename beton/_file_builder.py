"""Assembling a .beton file in the parent process: heap pages, then tables, then the header, then rename.

:class:`FileBuilder` receives encoded chunks in sample order, packs payloads into pages (see
:class:`HeapPacker`), and on :meth:`FileBuilder.commit` writes the tables and the header into a temporary file
that it renames onto the target. :meth:`FileBuilder.abort` deletes the temporary file, so nothing
half-written ever appears under the target name and an existing file there is left untouched.
"""

from __future__ import annotations

import json
import os
import tempfile
import zlib
from typing import BinaryIO

import numpy as np

from beton import format as fmt
from beton._encode import EncodedChunk, EncodeSpec
from beton.errors import WriterError

_TABLE_ALIGNMENT = 64
_WRITE_BUFFER = 1 << 20


class HeapPacker:
    """Appends payloads to the heap, page by page, computing each page's CRC32 as it goes.

    A payload that fits in a page never crosses a page boundary (the rest of the page is zero-filled);
    a larger one starts on a fresh page and spans as many consecutive pages as it needs.
    """

    def __init__(self, file: BinaryIO, page_size: int) -> None:
        self._file = file
        self._page_size = page_size
        self._position = 0  # bytes written to the heap so far
        self._page_crc = 0
        self.page_checksums: list[int] = []

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
        """Close the last (possibly short) page; return every page's CRC32."""
        if self._position % self._page_size:
            self.page_checksums.append(self._page_crc)
            self._page_crc = 0
        return np.array(self.page_checksums, dtype=fmt.PAGE_CHECKSUM_DTYPE)

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while len(view):
            room = self._page_size - self._position % self._page_size
            piece, view = view[:room], view[room:]
            self._file.write(piece)
            self._page_crc = zlib.crc32(piece, self._page_crc)
            self._position += len(piece)
            if self._position % self._page_size == 0:
                self.page_checksums.append(self._page_crc)
                self._page_crc = 0


class FileBuilder:
    """Owns the temporary file of one write; see the module docstring."""

    def __init__(self, spec: EncodeSpec, page_size: int) -> None:
        self._spec = spec
        self._page_size = page_size
        self._payload_fields = spec.payload_fields
        directory = os.path.dirname(os.path.abspath(spec.path))
        handle, self._temp_path = tempfile.mkstemp(
            prefix=os.path.basename(spec.path) + ".tmp-", dir=directory
        )
        self._file = os.fdopen(handle, "wb", buffering=_WRITE_BUFFER)
        self._file.write(bytes(fmt.HEAP_OFFSET))  # the header is written last, over these zeros
        self._heap = HeapPacker(self._file, page_size)
        self._rows: list[np.ndarray] = []
        self._allocations: list[np.ndarray] = []
        self.num_samples = 0

    def add(self, chunk: EncodedChunk) -> None:
        if chunk.first_position != self.num_samples:
            raise WriterError(f"chunk for sample {chunk.first_position} arrived at {self.num_samples}")
        allocations = np.zeros((len(chunk.payloads), len(self._payload_fields)), fmt.ALLOCATION_DTYPE)
        for row, payloads in enumerate(chunk.payloads):
            for column, payload in enumerate(payloads):
                allocations[row, column] = (self._heap.append(payload), len(payload))
        self._rows.append(chunk.rows)
        self._allocations.append(allocations)
        self.num_samples += len(chunk.rows)

    def commit(self) -> None:
        """Write tables and header, flush to disk, and rename onto the target path."""
        page_checksums = self._heap.finish()
        tables = {
            "field_table": field_table_bytes(self._spec),
            "data_table": _concatenate(self._rows, self._spec.data_dtype).tobytes(),
            "allocation_table": _concatenate(
                self._allocations, fmt.ALLOCATION_DTYPE, (0, len(self._payload_fields))
            ).tobytes(),
            "page_checksums": page_checksums.tobytes(),
        }
        header = np.zeros((), fmt.HEADER_DTYPE)
        position = fmt.HEAP_OFFSET + self._heap.size
        for name, blob in tables.items():
            padding = -position % _TABLE_ALIGNMENT
            self._file.write(bytes(padding))
            position += padding
            header[name] = (position, len(blob), zlib.crc32(blob), 0)
            self._file.write(blob)
            position += len(blob)
        self._fill_header(header, len(page_checksums))
        self._file.seek(0)
        self._file.write(header_bytes(header))
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        os.replace(self._temp_path, self._spec.path)

    def abort(self) -> None:
        self._file.close()
        try:
            os.unlink(self._temp_path)
        except FileNotFoundError:
            pass

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
        records[index]["metadata_dtype"] = add_string(fmt.dtype_to_json(field.metadata_dtype))
        records[index]["payload_column"] = payload_columns.get(index, fmt.NO_PAYLOAD)
    return records.tobytes() + bytes(strings)


def _concatenate(parts: list[np.ndarray], dtype: np.dtype, empty_shape: tuple = (0,)) -> np.ndarray:
    return np.concatenate(parts) if parts else np.zeros(empty_shape, dtype)
