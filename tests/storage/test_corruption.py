"""Bad files: every kind of damage ends in a BetonError from open or verify, never a crash or garbage."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import beton
from beton.storage import format as fmt
from beton.storage.file_builder import header_bytes
from beton.errors import BetonError, CorruptDataError, FormatError


def damaged_copy(source, directory, change):
    """Copy ``source`` into ``directory`` and apply ``change(bytearray) -> bytes`` to its content."""
    data = bytearray(open(source, "rb").read())
    path = directory / "damaged.beton"
    path.write_bytes(bytes(change(data)))
    return path


def open_and_verify(path):
    with beton.Reader(path) as reader:
        for index in range(len(reader)):
            reader[index]
    beton.verify(path)


def region_bounds(path):
    """name -> (start, end) for the header and every region of a valid file."""
    with beton.Reader(path) as reader:
        header = reader.header
        regions = {"header": (0, fmt.HEADER_SIZE), "heap": (fmt.HEAP_OFFSET, fmt.HEAP_OFFSET + reader.heap_size)}
        for name in ("field_table", "data_table", "allocation_table", "page_checksums"):
            offset = int(header[name]["offset"])
            regions[name] = (offset, offset + int(header[name]["size"]))
        page_size = reader.page_size
    return regions, page_size


def test_wrong_magic(mixed_file, tmp_path):
    path = damaged_copy(mixed_file, tmp_path, lambda data: b"NOTBETON" + data[8:])
    with pytest.raises(FormatError, match="not a beton file"):
        beton.Reader(path)


def test_future_version_is_refused_by_name(mixed_file, tmp_path):
    def bump_version(data):
        header = np.frombuffer(bytes(data[: fmt.HEADER_SIZE]), fmt.HEADER_DTYPE).copy()
        header["version"] = fmt.FORMAT_VERSION + 1
        return header_bytes(header[0]) + data[fmt.HEADER_SIZE :]

    with pytest.raises(FormatError, match="format version 4 is not 3, the one this beton reads"):
        beton.Reader(damaged_copy(mixed_file, tmp_path, bump_version))


def test_empty_and_tiny_files(tmp_path):
    for content in (b"", b"\x89BETON\r\n"):
        path = tmp_path / "tiny.beton"
        path.write_bytes(content)
        with pytest.raises(FormatError):
            beton.Reader(path)


def test_a_directory_is_a_format_error_naming_it(tmp_path):
    for open_it in (beton.Reader, lambda path: beton.Loader(path, batch_size=2)):
        with pytest.raises(FormatError, match="is a directory, not a beton file") as raised:
            open_it(tmp_path)
        assert raised.value.path == str(tmp_path)


def truncation_points(path):
    regions, page_size = region_bounds(path)
    points = {0, 7, fmt.HEADER_SIZE - 1, fmt.HEADER_SIZE, fmt.HEAP_OFFSET}
    for start, end in regions.values():
        points |= {start, end - 1, (start + end) // 2}
    heap_start = regions["heap"][0]
    points |= {heap_start + page_size // 2, heap_start + 3 * page_size + 17}  # mid-page
    file_size = regions["page_checksums"][1]
    return sorted(point for point in points if 0 <= point < file_size)


def test_truncation_at_every_boundary_and_mid_page(mixed_file, tmp_path):
    for length in truncation_points(mixed_file):
        path = damaged_copy(mixed_file, tmp_path, lambda data: data[:length])
        with pytest.raises(FormatError):
            beton.Reader(path)


def test_extra_bytes_after_the_end_are_refused(mixed_file, tmp_path):
    with pytest.raises(FormatError, match="header says it ends"):
        beton.Reader(damaged_copy(mixed_file, tmp_path, lambda data: data + b"\0"))


REGIONS = ("header", "heap", "field_table", "data_table", "allocation_table", "page_checksums", "padding")


@pytest.mark.parametrize("region", REGIONS)
@given(data=st.data())
def test_a_bit_flip_anywhere_is_detected(mixed_file, tmp_path, region, data):
    regions, _ = region_bounds(mixed_file)
    start, end = (fmt.HEADER_SIZE, fmt.HEAP_OFFSET) if region == "padding" else regions[region]
    position = data.draw(st.integers(start, end - 1), label="byte")
    bit = data.draw(st.integers(0, 7), label="bit")

    def flip(content):
        content[position] ^= 1 << bit
        return content

    path = damaged_copy(mixed_file, tmp_path, flip)
    with pytest.raises(BetonError):
        open_and_verify(path)


def samples_on_page(reader, page):
    """The samples with a payload byte on heap page ``page``, in order."""
    start, end = reader.page_bounds(page)
    table = reader.allocation_table
    return sorted({sample for sample in range(len(reader)) for column in range(table.shape[1])
                   if table[sample, column]["size"] and int(table[sample, column]["offset"]) < end
                   and int(table[sample, column]["offset"]) + int(table[sample, column]["size"]) > start})


def test_verify_names_every_sample_on_the_bad_page(mixed_file, tmp_path):
    with beton.Reader(mixed_file) as reader:
        offset = int(reader.allocation_table[40, 1]["offset"]) + 3  # inside sample 40's bytes payload
        page = (offset - reader.heap_offset) // reader.page_size
        on_page = samples_on_page(reader, page)
    assert 40 in on_page and on_page[0] != 40 and 1 < len(on_page) <= 8  # naming only the first misses sample 40

    def flip(content):
        content[offset] ^= 0x10
        return content

    path = damaged_copy(mixed_file, tmp_path, flip)
    beton.Reader(path).close()  # opening checks tables, not pages
    with pytest.raises(CorruptDataError) as caught:
        beton.verify(path)
    assert caught.value.page == page
    assert caught.value.sample is None  # one checksum for the page: no single sample is known to be the bad one
    message = str(caught.value)
    listed = f"samples {', '.join(map(str, on_page[:-1]))} and {on_page[-1]}"
    assert f"page {page}" in message and str(path) in message and listed in message


def test_verify_names_the_runs_of_samples_on_a_page_of_many(tmp_path):
    from conftest import write

    fields = {"label": beton.fields.IntField(), "blob": beton.fields.BytesField()}
    path = write(tmp_path / "small.beton", fields, [(i, bytes([i % 256]) * 10) for i in range(300)], page_size=1024)
    with beton.Reader(path) as reader:
        offset = int(reader.allocation_table[150, 0]["offset"])
        page = (offset - reader.heap_offset) // reader.page_size
        on_page = samples_on_page(reader, page)
    assert on_page == list(range(on_page[0], on_page[-1] + 1)) and on_page[0] < 150 and len(on_page) > 8

    def flip(content):
        content[offset] ^= 0x10
        return content

    with pytest.raises(CorruptDataError) as caught:
        beton.verify(damaged_copy(path, tmp_path, flip))
    assert f"samples {on_page[0]}..{on_page[-1]} ({len(on_page)} samples) in field 'blob'" in str(caught.value)
    assert caught.value.field == "blob" and caught.value.sample is None


def test_allocation_outside_the_heap_is_refused_even_with_a_valid_checksum(mixed_file, tmp_path):
    """A file written by a buggy tool, checksums consistent, must still not hand out a bad pointer."""
    import zlib

    def corrupt(content):
        header = np.frombuffer(bytes(content[: fmt.HEADER_SIZE]), fmt.HEADER_DTYPE).copy()[0]
        ref = header["allocation_table"]
        start, size = int(ref["offset"]), int(ref["size"])
        table = np.frombuffer(bytes(content[start : start + size]), fmt.ALLOCATION_DTYPE).copy()
        table[7]["size"] = 2**63  # an (offset, size) whose sum would overflow
        content[start : start + size] = table.tobytes()
        header["allocation_table"]["crc32"] = zlib.crc32(table.tobytes())
        content[: fmt.HEADER_SIZE] = header_bytes(header)
        return content

    with pytest.raises(FormatError, match="outside the heap"):
        beton.Reader(damaged_copy(mixed_file, tmp_path, corrupt))


def test_the_original_file_is_untouched_by_reading(mixed_file, tmp_path):
    copy = tmp_path / "copy.beton"
    shutil.copy(mixed_file, copy)
    open_and_verify(copy)
    assert copy.read_bytes() == open(mixed_file, "rb").read()
