"""The layout is pinned: itemsizes and offsets of every record, and docs/format.md agrees with format.py."""

from __future__ import annotations

import pathlib
import re

import numpy as np
import pytest

from beton import dtypes
from beton.storage import format as fmt

DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs" / "format.md"

EXPECTED_LAYOUT = {
    "HEADER_DTYPE": (256, {"magic": 0, "version": 8, "header_size": 12, "page_size": 16, "num_samples": 24,
                           "num_fields": 32, "num_payload_fields": 36, "heap_offset": 40, "heap_size": 48,
                           "num_pages": 56, "field_table": 64, "data_table": 88, "allocation_table": 112,
                           "page_checksums": 136, "metadata": 160, "digest_table": 184,
                           "content_digest": 208, "reserved": 240, "header_crc32": 252}),
    "TABLE_REF_DTYPE": (24, {"offset": 0, "size": 8, "crc32": 16, "reserved": 20}),
    "STRING_REF_DTYPE": (8, {"offset": 0, "size": 4}),
    "FIELD_RECORD_DTYPE": (40, {"type_name": 0, "name": 8, "arguments": 16, "metadata_dtype": 24,
                                "payload_column": 32, "reserved": 36}),
    "ALLOCATION_DTYPE": (16, {"offset": 0, "size": 8}),
}


@pytest.mark.parametrize("name", EXPECTED_LAYOUT)
def test_record_layout_is_pinned(name):
    dtype = getattr(fmt, name)
    itemsize, offsets = EXPECTED_LAYOUT[name]
    assert dtype.itemsize == itemsize
    assert {field: dtype.fields[field][1] for field in dtype.names} == offsets
    assert all(dtype.fields[field][0].str[0] in "<|" for field in dtype.names)


def test_constants():
    assert fmt.MAGIC == b"\x89BETON\r\n" and len(fmt.MAGIC) == 8
    assert fmt.FORMAT_VERSION == 3 and fmt.DIGEST_SIZE == 32
    assert fmt.DIGESTED_TABLES == ("field_table", "data_table", "allocation_table", "page_checksums", "metadata")
    assert fmt.HEADER_SIZE == 256 and fmt.HEAP_OFFSET == 4096 and fmt.MAX_METADATA_BYTES == 16 << 20
    assert fmt.DEFAULT_PAGE_SIZE == 8 * 1024 * 1024
    assert fmt.PAGE_CHECKSUM_DTYPE == np.dtype("<u4")


def test_docs_state_the_same_offsets():
    """Every `| offset | size | name |` row in docs/format.md matches the dtypes."""
    text = DOCS.read_text(encoding="utf-8")
    rows = re.findall(r"^\| (\d+) \| (\d+) \| `(\w+)`", text, flags=re.MULTILINE)
    documented = {}
    section = None
    for line in text.splitlines():
        heading = re.match(r"#+ .*`(\w+_DTYPE)`", line)
        if heading:
            section = heading.group(1)
        row = re.match(r"^\| (\d+) \| (\d+) \| `(\w+)`", line)
        if row and section:
            documented.setdefault(section, {})[row.group(3)] = (int(row.group(1)), int(row.group(2)))
    assert rows and set(documented) == set(EXPECTED_LAYOUT)
    for name, fields in documented.items():
        dtype = getattr(fmt, name)
        assert set(fields) == set(dtype.names), name
        for field, (offset, size) in fields.items():
            assert (offset, size) == (dtype.fields[field][1], dtype.fields[field][0].itemsize), (name, field)


@pytest.mark.parametrize("dtype", [np.dtype("<f4"), np.dtype([("a", "<i8"), ("b", [("c", "<u2", (2, 3))])]),
                                   np.dtype([]), np.dtype([("é ü", "<f8")])])
def test_dtype_json_round_trip(dtype):
    assert dtypes.dtype_from_json(dtypes.dtype_to_json(dtype)) == dtype
