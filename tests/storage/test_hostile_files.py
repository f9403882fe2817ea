"""Hostile files: every value of a re-signed file (all CRC32s valid) is checked before it is used.

An attacker who edits a file can recompute its checksums, so checksums prove nothing here. Each test below
forges one kind of lie - a record value out of range for its field, a count the file cannot hold, JSON built
to exhaust the stack or the memory, an image that decodes to gigabytes, lossless tiles that do not fit their
record, a crafted FFCV file - and expects a BetonError naming where the lie is, from opening, reading,
verifying, describing or loading, never a crash, a foreign exception or a runaway allocation.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import pathlib
import subprocess
import sys
import textwrap
import time
import tracemalloc
import zlib

import numpy as np
import pytest
import simplejpeg

import beton
from beton import Loader
from beton import dtypes
from beton.storage import format as fmt
from beton.storage.file_builder import header_bytes
from beton.tools.cli import describe
from beton.errors import BetonError, DecodeError, FormatError
from beton.fields import (Encoded, Field, IntField, JSONField, NDArrayField, RaggedArrayField, RGBImageField,
                          TorchTensorField)
from beton.decoders import (CenterCropRGBImageDecoder, JSONDecoder, RaggedDecoder, RandomResizedCropRGBImageDecoder,
                                   SimpleRGBImageDecoder)
from beton.transforms import ToTensor

from conftest import DATA, TESTS, write
from forgery import resign_digests

FFCV_FIXTURES = DATA / "ffcv"


class Forged:
    """A valid beton file taken apart into editable arrays; ``save`` lays it out again in format order and
    recomputes every CRC32 (header, tables and pages) and content digest, as an attacker would."""

    def __init__(self, path: pathlib.Path) -> None:
        content = pathlib.Path(path).read_bytes()
        with beton.Reader(path) as reader:
            data_dtype = reader.data_table.dtype
        self.header = np.frombuffer(content[: fmt.HEADER_SIZE], fmt.HEADER_DTYPE).copy()[0]
        table = {name: content[int(self.header[name]["offset"]) :][: int(self.header[name]["size"])]
                 for name in ("field_table", "data_table", "allocation_table")}
        records_size = int(self.header["num_fields"]) * fmt.FIELD_RECORD_DTYPE.itemsize
        self.records = np.frombuffer(table["field_table"][:records_size], fmt.FIELD_RECORD_DTYPE).copy()
        self.strings = bytearray(table["field_table"][records_size:])
        self.data = np.frombuffer(table["data_table"], data_dtype).copy() if data_dtype.itemsize else \
            np.zeros(int(self.header["num_samples"]), data_dtype)
        self.allocations = np.frombuffer(table["allocation_table"], fmt.ALLOCATION_DTYPE).copy().reshape(
            int(self.header["num_samples"]), int(self.header["num_payload_fields"]))
        self.heap = bytearray(content[fmt.HEAP_OFFSET :][: int(self.header["heap_size"])])
        self.data_bytes: bytes | None = None  # set to store other data-table bytes than ``data``
        self.metadata = content[int(self.header["metadata"]["offset"]) :][: int(self.header["metadata"]["size"])]

    def add_string(self, text: str | bytes) -> tuple[int, int]:
        raw = text.encode() if isinstance(text, str) else text
        self.strings += raw
        return len(self.strings) - len(raw), len(raw)

    def add_payload(self, payload: bytes) -> tuple[int, int]:
        """Append a payload on fresh pages of the heap; its (offset, size) for the allocation table."""
        page_size = int(self.header["page_size"])
        self.heap += bytes(-len(self.heap) % page_size)
        offset = fmt.HEAP_OFFSET + len(self.heap)
        self.heap += payload
        return offset, len(payload)

    def save(self, path: pathlib.Path) -> pathlib.Path:
        page_size = int(self.header["page_size"])
        heap = bytes(self.heap)
        checksums = [zlib.crc32(heap[start : start + page_size]) for start in range(0, len(heap), page_size)]
        tables = {"field_table": self.records.tobytes() + bytes(self.strings),
                  "data_table": self.data.tobytes() if self.data_bytes is None else self.data_bytes,
                  "allocation_table": self.allocations.tobytes(),
                  "page_checksums": np.array(checksums, "<u4").tobytes(), "metadata": self.metadata}
        out = bytearray(fmt.HEAP_OFFSET) + heap
        self.header["heap_size"], self.header["num_pages"] = len(heap), len(checksums)
        for name, blob in tables.items():
            out += bytes(-len(out) % 64)
            self.header[name]["offset"], self.header[name]["size"] = len(out), len(blob)
            self.header[name]["crc32"] = zlib.crc32(blob)
            out += blob
        resign_digests(out, self.header)
        out[: fmt.HEADER_SIZE] = header_bytes(self.header)
        path.write_bytes(bytes(out))
        return path


@dataclasses.dataclass(frozen=True)
class Empty(Field):
    """A field that stores nothing: no metadata, no payload (stored under an unregistered type name)."""

    type_name = "tests.Empty"

    def encode(self, value, context):
        return Encoded()

    def to_python(self, metadata, payload):
        return None


def pixels(i: int, height: int = 24, width: int = 40, channels: int = 3, dtype=np.uint8) -> np.ndarray:
    ramp = np.arange(height * width * channels, dtype=np.int64).reshape(height, width, channels)
    return ((ramp * 7 + i * 13) % 251).astype(dtype)


IMAGE_FIELDS = {
    "jpg": RGBImageField(write_mode="jpg"),
    "raw": RGBImageField(write_mode="raw"),
    "lossless": RGBImageField(write_mode="lossless"),
    "lossless16": RGBImageField(write_mode="lossless", dtype="uint16"),
    "progressive": RGBImageField(write_mode="progressive"),
    "grouped": RGBImageField(write_mode="progressive", scan_grouped=True),
}


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, pathlib.Path]:
    """One small valid file per field kind (4 KiB pages), plus a file of samples that store nothing."""
    folder = tmp_path_factory.mktemp("valid")
    made = {}
    for kind, field in IMAGE_FIELDS.items():
        dtype = np.uint16 if field.dtype == "uint16" else np.uint8
        made[kind] = write(folder / f"{kind}.beton", {"image": field, "label": IntField()},
                           [(pixels(i, dtype=dtype), i) for i in range(6)], page_size=4096)
    made["arrays"] = write(folder / "arrays.beton", {"arr": NDArrayField(np.float32, (3, 4)),
                                                     "tensor": TorchTensorField("float32", (2, 2)),
                                                     "meta": JSONField()},
                           [(np.full((3, 4), i, np.float32), _tensor(i), {"i": i}) for i in range(6)],
                           page_size=4096)
    made["empty"] = write(folder / "empty.beton", {"nothing": Empty()}, [(None,)] * 3)
    return made


def _tensor(i: int):
    import torch

    return torch.full((2, 2), float(i))


def forge(files, tmp_path, kind: str, edit) -> pathlib.Path:
    forged = Forged(files[kind])
    edit(forged)
    return forged.save(tmp_path / f"forged_{kind}.beton")


def refused_on_open(path: pathlib.Path, *words: str) -> FormatError:
    """Opening (hence reading, verify, info and the Loader) refuses the file with a message holding ``words``."""
    with pytest.raises(FormatError) as caught:
        beton.Reader(path)
    for word in words:
        assert word in str(caught.value)
    with pytest.raises(FormatError):
        beton.verify(path)
    with pytest.raises(FormatError):
        Loader(path, batch_size=2, num_workers=1)
    return caught.value


def run_isolated(code: str) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter, so that a crash fails the test instead of ending the session."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=300, cwd=TESTS)


# ---- out-of-range record values, every field kind ---------------------------------------------------------


def set_record(column: str, value, sample: int = 2, field: str = "image"):
    def edit(forged: Forged) -> None:
        forged.data[field][column][sample] = value
    return edit


@pytest.mark.parametrize("kind, column, value, words", [
    ("jpg", "channels", 2, ["channels 2"]),  # was KeyError in reader[i]
    ("jpg", "channels", 1, ["channels 1"]),  # does not match the field: the loader's buffers have 3
    ("raw", "channels", 4, ["channels 4"]),
    ("jpg", "mode", 2, ["mode 2"]),  # progressive in a non-progressive field: was ValueError
    ("raw", "mode", 7, ["mode 7"]),
    ("lossless16", "mode", 1, ["mode 1"]),  # JPEG cannot hold uint16 pixels
    ("raw", "height", 0, ["height 0"]),  # was ZeroDivisionError in RandomResizedCrop
    ("jpg", "width", 0, ["width 0"]),
    ("jpg", "height", 1 << 24, ["pixels"]),  # was MemoryError in the crop decoders
    ("progressive", "num_scans", 17, ["scans"]),  # was IndexError in reader[i] and beton info
    ("progressive", "num_scans", 0, ["scans"]),
    ("progressive", "scan_ends", np.arange(16, dtype=np.uint32)[::-1] * 9, ["scan"]),
    ("progressive", "scan_ends", np.full(16, 1 << 30, np.uint32), ["scan"]),  # past the payload
    ("jpg", "reserved", 1, ["reserved bytes are not zero"]),  # zero in every record this version writes
    ("progressive", "reserved2", np.array([0, 0, 7], np.uint8), ["reserved bytes are not zero"]),
])
def test_image_record_values_are_checked_on_open(files, tmp_path, kind, column, value, words):
    path = forge(files, tmp_path, kind, set_record(column, value))
    error = refused_on_open(path, *words)
    assert error.field == "image" and error.sample == 2


def test_crafted_scan_starts_are_refused_before_the_process_cache_sees_them(files, tmp_path):
    """Scan starts pointing outside the sample's allocation were a KeyError in the process cache."""
    def edit(forged: Forged) -> None:
        forged.data["image"]["scan_starts"][1, 3] = 1 << 24
    path = forge(files, tmp_path, "grouped", edit)
    error = refused_on_open(path, "scan")
    assert error.sample == 1


def test_a_zero_height_image_does_not_divide_by_zero_in_a_crop(files, tmp_path):
    path = forge(files, tmp_path, "raw", set_record("height", 0))
    with pytest.raises(BetonError):
        with Loader(path, batch_size=2, num_workers=1,
                    pipelines={"image": [RandomResizedCropRGBImageDecoder((8, 8)), ToTensor()]}) as loader:
            for _ in loader:
                pass


@pytest.mark.parametrize("height, width", [(24, 41), (30, 40), (20, 40)])
def test_a_jpeg_whose_record_claims_another_size_is_an_error_in_every_decoder(files, tmp_path, height, width):
    """The default image pipeline decoded a smaller JPEG into the front of the slot's buffer and returned the
    rest as whatever the slot held (stale batches, or uninitialised memory)."""

    def edit(forged: Forged) -> None:
        forged.data["image"]["height"][:] = height
        forged.data["image"]["width"][:] = width
    path = forge(files, tmp_path, "jpg", edit)
    for pipeline in ([SimpleRGBImageDecoder(), ToTensor()], [RandomResizedCropRGBImageDecoder((8, 8)), ToTensor()],
                     [CenterCropRGBImageDecoder((8, 8)), ToTensor()]):
        with pytest.raises(DecodeError, match="the data table says|metadata says|cannot be decoded"):
            with Loader(path, batch_size=3, num_workers=1, pipelines={"image": pipeline}) as loader:
                for _ in loader:
                    pass


@pytest.mark.parametrize("field, size", [("arr", 40), ("tensor", 20), ("arr", 0)])
def test_array_payloads_must_match_shape_and_dtype(files, tmp_path, field, size):
    """An array payload whose size disagrees with the field's shape was a numpy ValueError in reader[i]."""
    column = 0 if field == "arr" else 1

    def edit(forged: Forged) -> None:
        forged.allocations[3, column]["size"] = size
    path = forge(files, tmp_path, "arrays", edit)
    with beton.Reader(path) as reader:
        reader[2]  # other samples stay readable
        with pytest.raises(DecodeError) as caught:
            reader[3]
    assert caught.value.field == field and caught.value.sample == 3
    with pytest.raises(FormatError) as caught:
        beton.verify(path)
    assert caught.value.field == field and caught.value.sample == 3


def deep_json(depth: int) -> str:
    return "[" * depth + "]" * depth


def test_deeply_nested_json_payloads_are_decode_errors(files, tmp_path):
    """A JSON payload nested 100,000 deep was a RecursionError in reader[i] and in the JSONDecoder."""
    def edit(forged: Forged) -> None:
        forged.allocations[4, 2] = forged.add_payload(deep_json(100_000).encode())
    path = forge(files, tmp_path, "arrays", edit)
    with beton.Reader(path) as reader:
        with pytest.raises(DecodeError, match="nests") as caught:
            reader[4]
        assert caught.value.field == "meta" and caught.value.sample == 4
    with Loader(path, batch_size=2, num_workers=1, pipelines={"meta": [JSONDecoder()], "arr": None,
                                                              "tensor": None}) as loader:
        with pytest.raises(DecodeError, match="nests"):
            for _ in loader:
                pass


def test_json_as_deep_as_the_limit_still_reads(tmp_path):
    value = json.loads(deep_json(150))
    path = write(tmp_path / "deep.beton", {"meta": JSONField()}, [(value,)])
    with beton.Reader(path) as reader:
        assert reader[0] == (value,)


# ---- header counts against the file's size ----------------------------------------------------------------


def test_a_sample_count_the_file_cannot_hold_is_refused(files, tmp_path):
    """Samples that store nothing cost no bytes: 2^31 of them in a 5 KB file made Loader() build index
    arrays until the machine ran out of memory."""
    for count in (1 << 31, (1 << 64) - 1):
        def edit(forged: Forged) -> None:
            forged.header["num_samples"] = count
            forged.allocations = forged.allocations[:0]
        path = forge(files, tmp_path, "empty", edit)
        refused_on_open(path, "samples")


def test_a_payload_column_count_larger_than_the_field_count_is_refused_at_once(files, tmp_path):
    """num_payload_fields = 2^26 built a 2.9 GB list before any check."""
    def edit(forged: Forged) -> None:
        forged.header["num_payload_fields"] = 1 << 26
    path = forge(files, tmp_path, "arrays", edit)
    tracemalloc.start()
    try:
        start = time.perf_counter()
        refused_on_open(path, "payload")
        elapsed = time.perf_counter() - start
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 50 << 20 and elapsed < 5


# ---- JSON in the field table: depth, size, aliasing, dtypes ------------------------------------------------


def set_string(part: str, text: str | bytes, record: int = 0):
    def edit(forged: Forged) -> None:
        forged.records[record][part] = forged.add_string(text)
    return edit


@pytest.mark.parametrize("part, text", [
    ("arguments", "{\"a\": " + deep_json(100_000) + "}"),  # was RecursionError
    ("metadata_dtype", deep_json(100_000)),  # was RecursionError
    ("metadata_dtype", json.dumps([["a", "|O"]])),  # an object dtype: was TypeError
    ("metadata_dtype", json.dumps("|O")),
    ("metadata_dtype", json.dumps([["a", "<M8[s]"]])),  # datetimes are no plain numbers
    ("metadata_dtype", json.dumps([["a", ">i4"]])),  # big-endian: the format is little-endian
    ("metadata_dtype", json.dumps([["a", [["b", [["c", "|O"]]]]]])),
])
def test_field_table_json_is_parsed_with_limits(files, tmp_path, part, text):
    def edit(forged: Forged) -> None:
        set_string(part, text)(forged)
        if part == "metadata_dtype" and text.count("[") < 100:  # a data table that fits the forged dtype
            forged.data_bytes = bytes(3 * dtypes.dtype_from_descr(json.loads(text)).itemsize)
    refused_on_open(forge(files, tmp_path, "empty", edit))


def many_records(forged: Forged, count: int, arguments: tuple[int, int]) -> None:
    """Turn the file's one field into ``count`` fields that share every string but their names."""
    record = forged.records[0].copy()
    forged.records = np.repeat(record[None], count)
    for index in range(count):
        forged.records[index]["name"] = forged.add_string(f"f{index}")
        forged.records[index]["arguments"] = arguments
    forged.header["num_fields"] = count


def test_strings_shared_by_many_records_are_parsed_once(files, tmp_path):
    """400 field records pointing at one 1 MB JSON string cost 1.8 GB and 8 s."""
    big = json.dumps({"a": [0] * 500_000})

    def edit(forged: Forged) -> None:
        many_records(forged, 400, forged.add_string(big))
        forged.data_bytes = b""
    path = forge(files, tmp_path, "empty", edit)
    tracemalloc.start()
    try:
        start = time.perf_counter()
        with beton.Reader(path) as reader:
            assert len(reader.fields) == 400 and len(reader.fields["f399"].arguments()["a"]) == 500_000
        elapsed = time.perf_counter() - start
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 100 << 20 and elapsed < 5


def test_overlapping_strings_larger_in_total_than_the_field_table_are_refused(files, tmp_path):
    def edit(forged: Forged) -> None:
        offset, size = forged.add_string(json.dumps({"a": "x" * 100_000}))
        records = forged.records[0].copy()
        forged.records = np.repeat(records[None], 300)
        for index in range(300):  # each a different suffix of the same text: 300 distinct strings of ~100 KB
            forged.records[index]["name"] = forged.add_string(f"f{index}")
            forged.records[index]["arguments"] = (offset, size)
            forged.records[index]["type_name"] = (offset + 10 + index, 100 - index % 50)
        forged.header["num_fields"] = 300
        forged.data_bytes = b""
    refused_on_open(forge(files, tmp_path, "empty", edit), "string")


# ---- pixel bombs ---------------------------------------------------------------------------------------------


def jpeg_claiming(height: int, width: int) -> bytes:
    """A small JPEG whose frame header claims ``height`` x ``width`` (the entropy data is that of 16x16)."""
    data = bytearray(simplejpeg.encode_jpeg(pixels(0, 16, 16), quality=90))
    sof = data.index(b"\xff\xc0")
    data[sof + 5 : sof + 9] = height.to_bytes(2, "big") + width.to_bytes(2, "big")
    return bytes(data)


def test_an_image_record_beyond_the_pixel_cap_is_refused_before_any_allocation(files, tmp_path):
    """A JPEG record and header claiming 30000x30000 cost 2.9 GB in reader[i]."""
    def edit(forged: Forged) -> None:
        forged.allocations[1, 0] = forged.add_payload(jpeg_claiming(30000, 30000))
        forged.data["image"]["height"][1] = forged.data["image"]["width"][1] = 30000
    path = forge(files, tmp_path, "jpg", edit)
    error = refused_on_open(path, "pixels", "max_image_pixels")
    assert error.field == "image" and error.sample == 1
    with beton.Reader(path, max_image_pixels=None) as reader:  # the cap is the reader's to lift
        assert reader.data_table["image"]["height"][1] == 30000


def test_slots_for_huge_records_are_refused_not_allocated(files, tmp_path):
    """JPEG records within the pixel cap (11000x11000 each) made Loader() ask numpy for over 20 GiB per slot
    for the default (whole-image) decoder: a foreign MemoryError, or an out-of-memory kill. Slots beyond the
    machine's memory are now refused with a LoaderError naming the pipeline."""
    def edit(forged: Forged) -> None:
        forged.data["image"]["height"][:] = forged.data["image"]["width"][:] = 11000
    path = forge(files, tmp_path, "jpg", edit)
    with pytest.raises(beton.LoaderError, match=r"batch slots would need .* GiB .*pipeline 'image'"):
        Loader(path, batch_size=64, num_workers=1)
    with Loader(path, batch_size=64, num_workers=1,  # a crop decoder's slots do not depend on the records
                pipelines={"image": [CenterCropRGBImageDecoder((8, 8)), ToTensor()]}) as loader:
        with pytest.raises(DecodeError):  # the JPEGs are 24x40, not what the records say
            next(iter(loader))


def test_a_jpeg_larger_than_its_record_is_refused_before_decoding(files, tmp_path):
    def edit(forged: Forged) -> None:
        forged.allocations[1, 0] = forged.add_payload(jpeg_claiming(30000, 30000))
    path = forge(files, tmp_path, "jpg", edit)
    with beton.Reader(path) as reader:
        tracemalloc.start()
        try:
            with pytest.raises(DecodeError, match="30000") as caught:
                reader[1]
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert caught.value.sample == 1 and peak < 50 << 20
    with Loader(path, batch_size=2, num_workers=1,
                pipelines={"image": [CenterCropRGBImageDecoder((8, 8), ratio=1.0), ToTensor()]}) as loader:
        with pytest.raises(DecodeError):
            for _ in loader:
                pass


def test_the_pixel_cap_is_configurable(files, tmp_path, monkeypatch):
    path = files["raw"]  # 24 x 40 images
    with pytest.raises(FormatError, match="max_image_pixels"):
        beton.Reader(path, max_image_pixels=24 * 40 - 1)
    beton.Reader(path, max_image_pixels=24 * 40).close()
    with pytest.raises(FormatError, match="max_image_pixels"):
        Loader(path, batch_size=2, num_workers=1, max_image_pixels=100)
    monkeypatch.setenv("BETON_MAX_IMAGE_PIXELS", "100")  # what the Loader and the CLI open files with by default
    with pytest.raises(FormatError, match="BETON_MAX_IMAGE_PIXELS"):
        Loader(path, batch_size=2, num_workers=1)
    Loader(path, batch_size=2, num_workers=1, max_image_pixels=None).close()  # the caller's choice wins


# ---- lossless geometry -----------------------------------------------------------------------------------


@pytest.mark.parametrize("channels", [0, 2, 4])
def test_lossless_records_must_match_their_field(files, tmp_path, channels):
    """Channels 0 or 2 passed verify and made the tile decoder read and write outside its buffers (SIGSEGV in
    the Loader, silent corruption in reader[i]); 4 channels in a 3-channel field overran the loader's slots."""
    path = forge(files, tmp_path, "lossless", set_record("channels", channels))
    result = run_isolated(f"""
        import beton
        from beton.errors import FormatError
        try:
            beton.Reader({str(path)!r})
        except FormatError as error:
            print("refused:", error)
        else:
            print("opened")
            with beton.Loader({str(path)!r}, batch_size=2, num_workers=1) as loader:
                for _ in loader:
                    pass
    """)
    assert result.returncode == 0 and "refused:" in result.stdout, (result.returncode, result.stdout,
                                                                    result.stderr[-2000:])
    assert f"channels {channels}" in result.stdout


def test_the_tile_decoder_checks_its_arguments_itself(files):
    """The numba kernels trust nothing their caller computed from a file: bad channels, a region outside the
    image or a sample depth other than the field's are DecodeErrors, not out-of-bounds accesses."""
    result = run_isolated(f"""
        import numpy as np
        import beton
        from beton.errors import DecodeError
        from beton.codecs.lossless import decode_lossless, decode_lossless_region
        reader = beton.Reader({str(files["lossless"])!r})
        payload = reader.payload(0, "image")
        scratch = lambda nbytes, purpose="": np.empty(nbytes, np.uint8)
        cases = [lambda: decode_lossless(payload, 24, 40, 2),
                 lambda: decode_lossless(payload, 24, 40, 0),
                 lambda: decode_lossless_region(payload, 24, 40, 3, 20, 0, 10, 10, scratch),
                 lambda: decode_lossless_region(payload, 24, 40, 3, -1, 0, 10, 10, scratch),
                 lambda: decode_lossless(payload, 24, 40, 3, dtype=np.dtype("<u2"))]
        for case in cases:
            try:
                case()
                print("accepted")
            except DecodeError:
                print("refused")
    """)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["refused"] * 5


def test_the_compiled_tile_decoder_refuses_geometry_that_does_not_fit(files):
    """The guards inside the numba kernel itself (the Python checks above stop every case before it)."""
    result = run_isolated(f"""
        import numpy as np
        import beton
        from beton.codecs.lossless import check_header, decode_tiles
        reader = beton.Reader({str(files["lossless"])!r})
        payload = np.array(reader.payload(0, "image"))
        tile_log2, bits = check_header(payload, 24, 40)
        side = 1 << tile_log2
        tiles_y, tiles_x = -(-24 // side), -(-40 // side)

        def run(channels=3, plane_rows=side, residual_count=side * side, out_shape=(24, 40, 3),
                ty=(0, tiles_y), tx=(0, tiles_x)):
            planes = np.zeros((channels, plane_rows, side), np.uint8)
            residuals = np.zeros(residual_count, np.int32)
            out = np.zeros(out_shape, np.uint8)
            return decode_tiles(payload, 24, 40, tile_log2, ty[0], ty[1], tx[0], tx[1], planes, residuals, out, bits)

        print(run())  # the intact call decodes: -1
        for bad in (dict(channels=2, out_shape=(24, 40, 2)), dict(plane_rows=1), dict(residual_count=8),
                    dict(out_shape=(10, 40, 3)), dict(ty=(0, tiles_y + 1)), dict(tx=(-1, tiles_x))):
            print(run(**bad))
    """)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["-1"] + ["-2"] * 6


def test_a_lossless_payload_of_another_depth_than_its_field_is_refused(files, tmp_path):
    def edit(forged: Forged) -> None:
        with beton.Reader(files["lossless16"]) as other:
            forged.allocations[0, 0] = forged.add_payload(other.payload(0, "image").tobytes())
    path = forge(files, tmp_path, "lossless", edit)
    with beton.Reader(path) as reader:
        with pytest.raises(DecodeError, match="16-bit"):
            reader[0]
    with Loader(path, batch_size=2, num_workers=1,
                pipelines={"image": [CenterCropRGBImageDecoder((8, 8)), ToTensor()]}) as loader:
        with pytest.raises(DecodeError, match="16-bit"):
            for _ in loader:
                pass


def test_lossless_records_claiming_more_pixels_than_their_payload_can_hold_are_refused(files, tmp_path):
    """Every 8 pixels of a plane cost at least half a byte: a record cannot decode to more than 16 bytes of
    pixels per stored byte, so a small payload cannot ask for a large buffer."""
    def edit(forged: Forged) -> None:
        forged.data["image"]["height"][5] = forged.data["image"]["width"][5] = 8000
    refused_on_open(forge(files, tmp_path, "lossless", edit), "lossless")


# ---- FFCV files ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ffcv_raw(tmp_path_factory) -> bytes:
    return gzip.decompress((FFCV_FIXTURES / "ffcv_v2_raw.beton.gz").read_bytes())


FFCV_HEADER = np.dtype([("version", "<u2"), ("num_fields", "<u2"), ("page_size", "<u4"), ("num_samples", "<u8"),
                        ("alloc_table_ptr", "<u8")], align=True)
FFCV_ALLOCATION = np.dtype([("sample_id", "<u8"), ("ptr", "<u8"), ("size", "<u8")])


def ffcv_tables(content: bytes) -> tuple[np.ndarray, int, np.dtype]:
    """The FFCV header, where its metadata table starts and that table's dtype (fields label, score, arr,
    blob, meta, image as in tests/data/ffcv)."""
    header = np.frombuffer(content[: FFCV_HEADER.itemsize], FFCV_HEADER).copy()
    pointer_and_size = [("ptr", "<u8"), ("size", "<u8")]
    image = np.dtype([("mode", "<u1"), ("width", "<u2"), ("height", "<u2"), ("data_ptr", "<u8")])  # packed
    dtype = np.dtype([("label", "<i8"), ("score", "<f8"), ("arr", "<u8"), ("blob", pointer_and_size),
                      ("meta", pointer_and_size), ("image", image)], align=True)
    return header, FFCV_HEADER.itemsize + 1041 * int(header["num_fields"][0]), dtype


def edited_ffcv(content: bytes, sample: int, field: str, column: str | None, value) -> bytes:
    header, start, dtype = ffcv_tables(content)
    table = np.frombuffer(content[start:][: int(header["num_samples"][0]) * dtype.itemsize], dtype).copy()
    target = table[field] if column is None else table[field][column]
    target[sample] = value
    return content[:start] + table.tobytes() + content[start + table.nbytes :]


@pytest.mark.parametrize("field, column, value, words", [
    ("image", "height", 0, ["height 0"]),
    ("image", "mode", 5, ["mode"]),
    ("image", "width", 0, ["width 0"]),
])
def test_ffcv_records_are_checked_on_open(ffcv_raw, tmp_path, field, column, value, words):
    path = tmp_path / "ffcv.beton"
    path.write_bytes(edited_ffcv(ffcv_raw, 3, field, column, value))
    error = refused_on_open(path, *words)
    assert error.sample == 3


def test_an_ffcv_allocation_reaching_past_the_file_is_refused_before_reading_json(ffcv_raw, tmp_path):
    """A JSON payload's size reaching past the end of the file was an IndexError on open: the check for FFCV's
    NUL separator read the byte before the allocation checks ran."""
    header, _, _ = ffcv_tables(ffcv_raw)
    start = int(header["alloc_table_ptr"][0])
    allocations = np.frombuffer(ffcv_raw[start:], FFCV_ALLOCATION).copy()
    allocations["size"] = 1 << 40
    path = tmp_path / "ffcv.beton"
    path.write_bytes(ffcv_raw[:start] + allocations.tobytes())
    refused_on_open(path, "outside")


def test_a_random_file_starting_like_ffcv_is_not_taken_for_one(tmp_path):
    for seed in range(5):
        noise = bytearray(np.random.default_rng(seed).integers(0, 256, 20_000, dtype=np.uint8).tobytes())
        noise[:8] = b"\x02\x00\x01\x00\x00\x10\x00\x00"  # version 2, one field, 4 KiB pages
        noise[16:24] = (10_000).to_bytes(8, "little")
        path = tmp_path / f"noise{seed}.bin"
        path.write_bytes(bytes(noise))
        refused_on_open(path, "not a beton or FFCV file")


def test_describe_works_on_every_valid_kind(files):
    """The checks refuse nothing the writer makes."""
    for path in files.values():
        with beton.Reader(path, custom_fields={"nothing": Empty}) as reader:
            describe(reader)
            for index in range(len(reader)):
                reader[index]
        beton.verify(path)


# ---- ragged arrays: stored lengths against payload sizes ------------------------------------------------


@pytest.fixture(scope="module")
def ragged_file(tmp_path_factory):
    values = [np.arange(n, dtype=np.float32).reshape(-1, 2) for n in (4, 0, 6, 2)]
    return write(tmp_path_factory.mktemp("valid") / "r.beton", {"r": RaggedArrayField(np.float32, (None, 2))},
                 [(v,) for v in values], page_size=4096)


@pytest.mark.parametrize("length, words", [
    (-1, "negative"), (4, "does not match"), (2, "does not match"), (2**62, "does not match"),
    (2**63 - 1, "does not match"),
])
def test_stored_lengths_that_do_not_match_the_payload_are_refused_on_open(ragged_file, tmp_path, length, words):
    forged = Forged(ragged_file)
    forged.data["r"]["length"][2] = length  # sample 2 holds 3 rows of 8 bytes
    path = forged.save(tmp_path / "forged.beton")
    with pytest.raises(FormatError, match=words) as caught:
        beton.Reader(path)
    assert caught.value.sample == 2 and caught.value.field == "r"
    with pytest.raises(FormatError):
        Loader(path, batch_size=2, pipelines={"r": [RaggedDecoder(4)]})


def test_a_length_against_a_forged_payload_size_is_refused_too(ragged_file, tmp_path):
    forged = Forged(ragged_file)
    forged.allocations[0, 0]["size"] = 8  # sample 0: 2 rows stored, the data table says 2... of 8 bytes each
    path = forged.save(tmp_path / "forged.beton")
    with pytest.raises(FormatError, match="does not match"):
        beton.Reader(path)


def test_stored_rows_larger_than_the_file_are_refused(ragged_file, tmp_path):
    forged = Forged(ragged_file)
    record = forged.records[0]
    start, size = int(record["arguments"]["offset"]), int(record["arguments"]["size"])
    text = bytes(forged.strings[start : start + size]).decode()
    assert "[null, 2]" in text
    offset, length = forged.add_string(text.replace("[null, 2]", "[null, 9999999999]"))
    forged.records[0]["arguments"]["offset"], forged.records[0]["arguments"]["size"] = offset, length
    path = forged.save(tmp_path / "forged.beton")
    with pytest.raises(FormatError, match="rows of"):
        beton.Reader(path)
