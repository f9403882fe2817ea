"""The on-disk layout of a ``.beton`` file, format version 1: the single source of truth.

Every record is a little-endian numpy structured dtype defined here; ``docs/format.md`` describes the same
bytes in prose and ``tests/test_format.py`` pins every itemsize and offset.

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
  pages by :func:`beton.verify`, which reads the whole file.
* **Field records keep full UTF-8 names and JSON constructor arguments** (never pickle), plus the metadata
  dtype, so a file describes itself even where the field's class cannot be imported.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import numpy as np

from beton import _json

MAGIC = b"\x89BETON\r\n"  # non-ASCII first byte and CR LF catch text-mode transfers, as PNG's magic does
FORMAT_VERSION = 1
HEADER_SIZE = 256
HEAP_OFFSET = 4096
DEFAULT_PAGE_SIZE = 8 * 1024 * 1024
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
        ("reserved", "S92"),
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

NO_PAYLOAD = -1

#: Decoded pixels (height x width) a reader accepts per image unless told otherwise, as Pillow's
#: MAX_IMAGE_PIXELS: 11585 x 11585, 1 GiB at 4 channels of uint16. A file is refused on open when a record
#: claims more, before any buffer is allocated.
DEFAULT_MAX_IMAGE_PIXELS = 1 << 27
#: Environment variable that sets the cap for readers opened without ``max_image_pixels`` (the Loader, the
#: command line): a number of pixels, or "none" for no cap.
MAX_IMAGE_PIXELS_VARIABLE = "BETON_MAX_IMAGE_PIXELS"
#: Deepest nesting accepted in a stored metadata dtype's JSON (two levels per nested record).
MAX_DTYPE_DEPTH = 16
#: Kinds of the members of a metadata record: plain numbers (bool, signed, unsigned, float, complex).
METADATA_KINDS = "biufc"


@dataclasses.dataclass(frozen=True)
class ReadLimits:
    """What a reader accepts from a file beyond its own layout: bounds on what reading it may allocate.

    ``max_image_pixels``: decoded pixels per image (None: no cap). ``max_payload_bytes``: the largest payload a
    field may declare it needs (fields with a fixed payload size check their shape against it; the reader sets
    it to the file's size, since no payload can be larger).
    """

    max_image_pixels: int | None = DEFAULT_MAX_IMAGE_PIXELS
    max_payload_bytes: int | None = None


def max_image_pixels_from_environment() -> int | None:
    """The pixel cap ``$BETON_MAX_IMAGE_PIXELS`` sets, else :data:`DEFAULT_MAX_IMAGE_PIXELS`; "none" lifts it."""
    value = os.environ.get(MAX_IMAGE_PIXELS_VARIABLE, "").strip()
    if not value:
        return DEFAULT_MAX_IMAGE_PIXELS
    if value.lower() == "none":
        return None
    try:
        pixels = int(value)
    except ValueError:
        pixels = -1
    if pixels < 1:
        raise ValueError(f"${MAX_IMAGE_PIXELS_VARIABLE} must be a positive number of pixels or 'none', "
                         f"got {value!r}")
    return pixels


def dtype_to_json(dtype: np.dtype) -> str:
    """Serialise a (structured) dtype as JSON, the form stored in field records."""
    return json.dumps(np.lib.format.dtype_to_descr(dtype))


def dtype_from_json(text: str) -> np.dtype:
    """Inverse of :func:`dtype_to_json`; raises ValueError/TypeError on text that is not a dtype."""
    return dtype_from_descr(_json.loads(text, MAX_DTYPE_DEPTH))


def check_metadata_dtype(dtype: np.dtype) -> None:
    """Raise ValueError unless every member of ``dtype`` is a plain little-endian number (no objects, strings,
    datetimes or big-endian values: the data table is read as raw little-endian bytes, and numpy cannot view
    bytes as objects)."""
    if dtype.names is not None:
        for name in dtype.names:
            check_metadata_dtype(dtype.fields[name][0])
        return
    if dtype.subdtype is not None:
        check_metadata_dtype(dtype.subdtype[0])
        return
    if dtype.kind not in METADATA_KINDS or dtype.byteorder == ">":
        raise ValueError(f"metadata members must be little-endian numbers, got {dtype.str}")


def dtype_from_descr(descr: Any) -> np.dtype:
    """A dtype from its numpy descr, also when JSON has turned the descr's tuples into lists."""
    return np.lib.format.descr_to_dtype(_descr_from_json(descr))


def _descr_from_json(descr: Any) -> Any:
    # JSON turns the (name, format[, shape]) tuples of a descr into lists; numpy wants tuples back.
    if isinstance(descr, str):
        return descr
    if not isinstance(descr, list):
        raise TypeError(f"not a dtype description: {descr!r}")
    items = []
    for name, fmt, *shape in descr:
        item = (name, _descr_from_json(fmt))
        items.append(item + (tuple(shape[0]),) if shape else item)
    return items


def page_count(heap_size: int, page_size: int) -> int:
    """Number of pages a heap of ``heap_size`` bytes occupies (the last page may be short)."""
    return -(-heap_size // page_size)


def is_valid_page_size(page_size: int) -> bool:
    return MIN_PAGE_SIZE <= page_size <= MAX_PAGE_SIZE and page_size & (page_size - 1) == 0
