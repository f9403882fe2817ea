"""The on-disk layout of a ``.beton`` file, format version 3: the single source of truth.

Every record is a little-endian numpy structured dtype defined here; ``docs/format.md`` describes the same
bytes in prose and ``tests/storage/test_format.py`` pins every itemsize and offset.

::

    offset 0            +-------------------------------+
                        | header (HEADER_DTYPE, 256 B)  |  magic, version, counts, a TableRef per table,
                        |  zero padding to HEAP_OFFSET  |  CRC32 of the header itself
    HEAP_OFFSET (4 KiB) +-------------------------------+
                        | page 0    (page_size bytes)   |  payloads of variable size (arrays, bytes, images)
                        | page 1                        |  a payload never crosses a page boundary unless it
                        | ...                           |  is larger than a page: then it starts a page and
                        | page n-1  (may be shorter)    |  fills consecutive pages
                        +-------------------------------+
                        | field table                   |  FIELD_RECORD_DTYPE x num_fields, then UTF-8 strings
                        | data table                    |  one fixed-width record per sample (fields' metadata)
                        | allocation table              |  ALLOCATION_DTYPE x num_samples x num_payload_fields
                        | page checksum table           |  CRC32 (<u4) of every heap page
                        | metadata table                |  UTF-8 JSON object: the dataset's own description
                        | digest table                  |  SHA-256 of every heap page, then of every table
                        +-------------------------------+ end of file

Why it looks like this:

* **Magic and version first** so that any other file is refused at once, and so a future version is
  recognised as such rather than read as garbage.
* **Tables after the heap**: the writer streams payloads in one pass and only knows the tables' sizes at the
  end; it then writes them and finally rewrites the header. The file is written under a temporary name and
  renamed when complete, so a crash never leaves a file that opens as valid.
* **Heap at 4 KiB**: page starts are aligned for mmap and direct I/O without wasting a whole 8 MiB page.
* **Pages**: the unit of reading ahead (process cache) and of page-aware shuffling (QUASI_RANDOM). Keeping
  small payloads inside one page means a sample costs one page read.
* **Allocation table as a dense (sample, payload field) matrix**: offset and size of any payload in O(1),
  without a search, and exact sizes (bytes and JSON come back with their true length).
* **Checksums**: CRC32 of the header, of every table, and of every page. Tables are checked on open (cheap);
  pages by :func:`beton.storage.verify`, which reads the whole file. CRC32 finds accidents, not intent: whoever
  edits a file can keep any CRC32 by choosing 4 bytes (padding, say).
* **Content digests**: a SHA-256 of every page and of every table (the digest table), and in the
  header the SHA-256 of the digest table (``content_digest``). So the header pins every byte of the file, and
  a hash of the header (what a manifest records) pins the content: a forged byte changes a page's digest, hence
  the digest table, hence the header. Per page, so a reader can check each page as it first loads it instead of
  reading the whole file first. SHA-256 because :mod:`hashlib` has it everywhere and CPUs with SHA instructions
  (x86 SHA-NI, ARMv8) hash it faster than BLAKE2b (figures: docs/format.md, "Digest table").
* **One version.** Versions 1 and 2 (without the digest table, and version 1 without the metadata table) were
  never released: a reader refuses them like any other version it does not know, rather than reading files
  whose content no digest pins. A later version changes the number, so that this reader refuses it instead of
  misreading it.
* **Field records keep full UTF-8 names and JSON constructor arguments** (never pickle), plus the metadata
  dtype, so a file describes itself even where the field's class cannot be imported.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

MAGIC = b"\x89BETON\r\n"  # non-ASCII first byte and CR LF catch text-mode transfers, as PNG's magic does
FORMAT_VERSION = 3  # the one version read and written (1 and 2, unreleased, had no digest table)
HEADER_SIZE = 256
HEAP_OFFSET = 4096
DEFAULT_PAGE_SIZE = 8 * 1024 * 1024
#: Largest metadata table a writer writes and a reader accepts: class names of the largest label sets (ImageNet-21k's
#: 21,841 synsets are about 0.5 MiB of JSON) fit many times over; more is data, which belongs in a field.
MAX_METADATA_BYTES = 16 * 1024 * 1024
MIN_PAGE_SIZE = 256  # small pages are allowed so that tests can exercise page boundaries cheaply
MAX_PAGE_SIZE = 1 << 32

TABLE_REF_DTYPE = np.dtype(
    [("offset", "<u8"), ("size", "<u8"), ("crc32", "<u4"), ("reserved", "<u4")]
)
"""Where a table lives: absolute byte offset, size in bytes and CRC32 of those bytes."""

HEADER_DTYPE = np.dtype(
    [
        ("magic", "S8"),
        ("version", "<u4"),
        ("header_size", "<u4"),
        ("page_size", "<u8"),
        ("num_samples", "<u8"),
        ("num_fields", "<u4"),
        ("num_payload_fields", "<u4"),
        ("heap_offset", "<u8"),
        ("heap_size", "<u8"),
        ("num_pages", "<u8"),
        ("field_table", TABLE_REF_DTYPE),
        ("data_table", TABLE_REF_DTYPE),
        ("allocation_table", TABLE_REF_DTYPE),
        ("page_checksums", TABLE_REF_DTYPE),
        ("metadata", TABLE_REF_DTYPE),
        ("digest_table", TABLE_REF_DTYPE),
        ("content_digest", "S32"),  # SHA-256 of the digest table
        ("reserved", "S12"),
        ("header_crc32", "<u4"),  # CRC32 of the HEADER_SIZE - 4 bytes before it
    ]
)

STRING_REF_DTYPE = np.dtype([("offset", "<u4"), ("size", "<u4")])
"""A UTF-8 string in the field table's string area: offset from the area's start, size in bytes."""

FIELD_RECORD_DTYPE = np.dtype(
    [
        ("type_name", STRING_REF_DTYPE),  # e.g. "beton.IntField", or "package.module.ClassName"
        ("name", STRING_REF_DTYPE),  # the field's full name
        ("arguments", STRING_REF_DTYPE),  # JSON object: the constructor's keyword arguments
        ("metadata_dtype", STRING_REF_DTYPE),  # JSON: numpy descr of the field's data-table record
        ("payload_column", "<i4"),  # column in the allocation table, or -1 for no payload
        ("reserved", "<u4"),
    ]
)

ALLOCATION_DTYPE = np.dtype([("offset", "<u8"), ("size", "<u8")])
"""One payload: absolute byte offset in the file and size in bytes."""

PAGE_CHECKSUM_DTYPE = np.dtype("<u4")

DIGEST_SIZE = 32
"""Bytes of one SHA-256 digest. The digest table holds one per heap page, then one per table in
:data:`DIGESTED_TABLES`."""

#: The tables whose digests follow the pages' in the digest table, in this order (the digest table itself is
#: pinned by the header's ``content_digest``).
DIGESTED_TABLES = ("field_table", "data_table", "allocation_table", "page_checksums", "metadata")

NO_PAYLOAD = -1

def page_count(heap_size: int, page_size: int) -> int:
    """Number of pages a heap of ``heap_size`` bytes occupies (the last page may be short)."""
    return -(-heap_size // page_size)


def is_valid_page_size(page_size: int) -> bool:
    return MIN_PAGE_SIZE <= page_size <= MAX_PAGE_SIZE and page_size & (page_size - 1) == 0


def data_table_dtype(columns: Iterable[tuple[str, np.dtype]]) -> np.dtype:
    """The data table's record: one member per field, named after it, holding the field's metadata record."""
    return np.dtype([(name, dtype) for name, dtype in columns])
