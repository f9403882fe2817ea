"""Fuzz the reading side with hostile files: seeded mutations of valid files, re-signed so they reach the parsers.

    python benchmarks/fuzz.py --cases 10000 [--jobs 2] [--first 0] [--keep DIR] [--timeout 60]
    python benchmarks/fuzz.py --replay CASE [--keep DIR]       # one case again, in this process

Seed files cover every built-in field kind (int, float, ndarray, torch tensor, bytes, JSON, and images stored
raw, JPEG, lossless 8/16-bit, progressive and scan-grouped progressive), a field of an unregistered type, a
file with file-level metadata, and the two FFCV files of tests/data/ffcv. Case n picks a
seed file and a mutation from a generator seeded with n: structure-aware changes of every table (header counts
and table references, field records, their strings - hostile JSON and dtypes -, any member of any data-table
record, allocations, page checksums, the metadata table; for FFCV files its header, descriptors, metadata and
allocation table), or byte-level flips, writes, splices, truncations and extensions. Beton files are then re-signed (every CRC32 recomputed wherever the header's references lie
inside the file): checksums protect against accidents, not against whoever edits a file. Half of the byte-level
damage to beton files is left unsigned instead - an accident (a bad disk, a broken copy) - and must be flagged:
``beton.verify`` raises, or every sample still reads as in the intact file. Re-signing recomputes the content
digests too (page and table digests, the header's content digest), as whoever edits a file can: only a pin of
the header (a manifest's hash) tells such a file from the original.

Two hostile cases beyond mutations (issue #25):

* **forged** (5% of the cases of beton seeds): bytes of one heap page changed and 4 other bytes of the page
  chosen so that its CRC32 is kept (``tests/forgery.py``), nothing else touched: every CRC32 and the header match,
  so only the content digests can tell. It must be flagged as an accident must (``beton.verify`` raises, or every
  sample reads as in the intact file), and a Loader epoch with ``verify_content=True`` must raise or read every
  sample intact.
* **truncated under a Loader** (5% of the cases): an intact seed read through the OS cache (a memory map) for
  several epochs while a thread truncates the file at a random byte after a random delay. A SIGBUS is a crash;
  the only acceptable outcomes are ok (the truncation came after the reads) and a BetonError.

Each case runs in a worker process (several cases per process, a fresh process after any crash): open,
``reader[i]`` for every sample, ``beton.verify``, ``beton info``'s description, and a Loader epoch with the
default pipelines (plus a RandomResizedCrop epoch through the process cache for image fields). Outcomes:

    ok          every step succeeded
    BetonError  a step raised a BetonError (the file was refused or a sample could not be decoded)
    other       a step raised any other exception: a bug
    crash       the worker died (a signal, or an exit the file caused): a bug
    hang        no answer within --timeout seconds: a bug
    memory      the worker went over --kill-rss (default 2 GiB) and was killed: a bug
    unflagged   accidental (unsigned) damage or a forgery that verify (or a verify_content epoch) passed and that
                changed what a sample reads: a bug

plus the number of cases whose peak RSS (the worker's VmHWM, reset before every case) exceeded 1 GiB, the worst
peak and the slowest case. Exit status 1 when any case is a bug or went over 1 GiB.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import gzip
import json
import os
import pathlib
import queue
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import zlib
from typing import Any, Callable

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
FFCV_FIXTURES = ROOT / "tests" / "data" / "ffcv"
sys.path.insert(0, str(ROOT / "tests"))
from forgery import forge_keeping_crc32  # noqa: E402
BUGS = ("other", "crash", "hang", "memory", "unflagged")
UNSIGNED = " (unsigned)"
FORGED = " (forged, CRC32s kept)"
RSS_GOAL = 1 << 30
MAX_SAMPLES_READ = 64

# Values that sit on the edges of the types the tables use.
INTERESTING = (0, 1, 2, 3, 4, 5, 7, 8, 15, 16, 17, 31, 32, 63, 64, 127, 128, 255, 256, 1023, 1024, 4095, 4096,
               65535, 65536, (1 << 24), (1 << 31) - 1, 1 << 31, (1 << 32) - 1, 1 << 32, (1 << 63) - 1, 1 << 63,
               (1 << 64) - 1)


# ---- seed files --------------------------------------------------------------------------------------------


def _image(i: int, height: int, width: int, channels: int, dtype: Any = np.uint8) -> np.ndarray:
    ramp = np.add.outer(np.arange(height) * 3, np.arange(width) * 5)[:, :, None] + np.arange(channels) * 40 + i
    return (ramp % (251 if dtype == np.uint8 else 65521)).astype(dtype)


def make_seed_files(folder: pathlib.Path) -> dict[str, pathlib.Path]:
    """The valid files every case starts from: name -> path."""
    import torch

    import beton
    from beton.fields import (BytesField, Encoded, Field, FloatField, IntField, JSONField, NDArrayField,
                              RGBImageField, TorchTensorField)

    class Opaque(Field):  # stored under a type name no reader has registered
        type_name = "fuzz.Opaque"
        metadata_dtype = np.dtype([("a", "<u4"), ("b", "<f4", (2,))])
        has_payload = True

        def encode(self, value: Any, context: Any) -> Encoded:
            return Encoded((value, (0.5, 1.5)), bytes(value % 7))

        def to_python(self, metadata: Any, payload: Any) -> Any:
            return None

    def write(name: str, fields: dict, samples: list, page_size: int = 4096, metadata: dict | None = None) -> None:
        path = folder / f"{name}.beton"
        writer = beton.DatasetWriter(path, fields, num_workers=0, page_size=page_size, progress=False,
                                     metadata=metadata)
        writer.from_indexed_dataset(_Samples(samples))
        made[name] = path

    made: dict[str, pathlib.Path] = {}
    write("mixed", {"label": IntField(), "score": FloatField(), "arr": NDArrayField(np.float32, (3, 4)),
                    "blob": BytesField(), "meta": JSONField()},
          [(i, i / 3, np.full((3, 4), i, np.float32), bytes(range(i % 50)), {"i": i, "tags": ["a"] * (i % 3)})
           for i in range(24)], page_size=1024)
    write("tensor", {"t": TorchTensorField("bfloat16", (2, 3)), "u": TorchTensorField(torch.int16, (4,)),
                     "label": IntField()},
          [(torch.full((2, 3), float(i), dtype=torch.bfloat16), torch.arange(4, dtype=torch.int16) * i, i)
           for i in range(10)], page_size=1024)
    for name, field, channels, dtype in (("jpg", RGBImageField(write_mode="jpg"), 3, np.uint8),
                                         ("raw", RGBImageField(write_mode="raw", channels=1), 1, np.uint8),
                                         ("lossless", RGBImageField(write_mode="lossless"), 3, np.uint8),
                                         ("lossless16", RGBImageField(write_mode="lossless", channels=4,
                                                                      dtype="uint16"), 4, np.uint16),
                                         ("progressive", RGBImageField(write_mode="progressive"), 3, np.uint8),
                                         ("grouped", RGBImageField(write_mode="progressive", scan_grouped=True),
                                          3, np.uint8)):
        write(name, {"image": field, "label": IntField()},
              [(_image(i, 24, 32, channels, dtype), i) for i in range(8)])  # one size: default pipelines load it
    write("opaque", {"x": Opaque(), "label": IntField()}, [(i, i) for i in range(6)], page_size=256)
    write("metadata", {"label": IntField(), "meta": JSONField()}, [(i, {"i": i}) for i in range(6)], page_size=256,
          metadata={"classes": {"label": [f"class {i}" for i in range(6)]}, "source": {"format": "fuzz"}})
    for mode in ("raw", "jpg"):
        path = folder / f"ffcv_{mode}.beton"
        path.write_bytes(gzip.decompress((FFCV_FIXTURES / f"ffcv_v2_{mode}.beton.gz").read_bytes()))
        made[f"ffcv_{mode}"] = path
    return made


class _Samples:
    def __init__(self, samples: list) -> None:
        self.samples = samples

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple:
        return self.samples[index]


# ---- beton files as editable parts -------------------------------------------------------------------------


@dataclasses.dataclass
class Parts:
    """A valid beton file taken apart; :meth:`assemble` lays it out again and re-signs it."""

    header: np.ndarray  # one HEADER_DTYPE record
    heap: bytearray
    records: np.ndarray  # FIELD_RECORD_DTYPE
    strings: bytearray
    data: bytearray
    data_dtype: np.dtype
    allocations: np.ndarray  # ALLOCATION_DTYPE, flat
    checksums: bytearray | None = None  # None: recomputed from the heap
    metadata: bytes = b"{}"  # the metadata table

    @classmethod
    def of(cls, content: bytes, data_dtype: np.dtype) -> Parts:
        from beton.storage import format as fmt

        header = np.frombuffer(content[: fmt.HEADER_SIZE], fmt.HEADER_DTYPE).copy()
        table = {name: content[int(header[0][name]["offset"]) :][: int(header[0][name]["size"])]
                 for name in ("field_table", "data_table", "allocation_table")}
        records_size = int(header[0]["num_fields"]) * fmt.FIELD_RECORD_DTYPE.itemsize
        metadata = content[int(header[0]["metadata"]["offset"]) :][: int(header[0]["metadata"]["size"])]
        return cls(header, bytearray(content[fmt.HEAP_OFFSET :][: int(header[0]["heap_size"])]),
                   np.frombuffer(table["field_table"][:records_size], fmt.FIELD_RECORD_DTYPE).copy(),
                   bytearray(table["field_table"][records_size:]), bytearray(table["data_table"]), data_dtype,
                   np.frombuffer(table["allocation_table"], fmt.ALLOCATION_DTYPE).copy(), metadata=metadata)

    def assemble(self) -> bytes:
        from beton.storage import format as fmt

        header = self.header[0]
        page_size = max(int(header["page_size"]), 1)
        heap = bytes(self.heap)
        checksums = bytes(self.checksums) if self.checksums is not None else np.array(
            [zlib.crc32(heap[at : at + page_size]) for at in range(0, len(heap), page_size)], "<u4").tobytes()
        out = bytearray(fmt.HEAP_OFFSET) + heap
        header["heap_size"] = len(heap)
        tables = {"field_table": self.records.tobytes() + bytes(self.strings), "data_table": bytes(self.data),
                  "allocation_table": self.allocations.tobytes(), "page_checksums": checksums,
                  "metadata": self.metadata,  # the digest table's size here; its digests are resign()'s
                  "digest_table": bytes((len(checksums) // 4 + len(fmt.DIGESTED_TABLES)) * fmt.DIGEST_SIZE)}
        for name, blob in tables.items():
            out += bytes(-len(out) % 64)
            header[name]["offset"], header[name]["size"], header[name]["crc32"] = len(out), len(blob), zlib.crc32(blob)
            out += blob
        out[: fmt.HEADER_SIZE] = self.header.tobytes()
        return resign(bytes(out))


def resign(content: bytes) -> bytes:
    """Recompute the page checksums, every table's CRC32 and the header's, wherever the header's references
    lie inside the file (an attacker's re-signing; the file's other bytes stay as they are)."""
    from beton.storage import format as fmt

    if len(content) < fmt.HEADER_SIZE or content[:8] != fmt.MAGIC:
        return content
    out = bytearray(content)
    header = np.frombuffer(bytes(out[: fmt.HEADER_SIZE]), fmt.HEADER_DTYPE).copy()
    record = header[0]

    def span(name: str) -> tuple[int, int] | None:
        offset, size = int(record[name]["offset"]), int(record[name]["size"])
        return (offset, offset + size) if offset + size <= len(out) else None

    pages, page_size = span("page_checksums"), int(record["page_size"])
    heap_end = fmt.HEAP_OFFSET + int(record["heap_size"])
    if pages and 0 < page_size and heap_end <= len(out) and (pages[1] - pages[0]) % 4 == 0:
        count = (pages[1] - pages[0]) // 4
        crcs = [zlib.crc32(out[at : min(at + page_size, heap_end)])
                for at in range(fmt.HEAP_OFFSET, fmt.HEAP_OFFSET + count * page_size, page_size)]
        out[pages[0] : pages[1]] = np.array(crcs, "<u4").tobytes()
    digests = span("digest_table")
    if digests and pages and (digests[1] - digests[0]) == ((pages[1] - pages[0]) // 4 + 5) * fmt.DIGEST_SIZE:
        from beton.storage.digests import digest

        count = (pages[1] - pages[0]) // 4
        table = [digest(out[at : min(at + page_size, heap_end)])
                 for at in range(fmt.HEAP_OFFSET, fmt.HEAP_OFFSET + count * page_size, page_size)]
        table += [digest(out[where[0] : where[1]]) if (where := span(name)) else bytes(fmt.DIGEST_SIZE)
                  for name in fmt.DIGESTED_TABLES]
        out[digests[0] : digests[1]] = b"".join(table)
        record["content_digest"] = digest(out[digests[0] : digests[1]])
    for name in ("field_table", "data_table", "allocation_table", "page_checksums", "metadata", "digest_table"):
        where = span(name)
        if where:
            record[name]["crc32"] = zlib.crc32(out[where[0] : where[1]])
    record["header_crc32"] = zlib.crc32(header.tobytes()[: fmt.HEADER_SIZE - 4])
    out[: fmt.HEADER_SIZE] = header.tobytes()
    return bytes(out)


# ---- mutations ---------------------------------------------------------------------------------------------


def interesting(rng: np.random.Generator, dtype: np.dtype, current: int | float = 0) -> Any:
    """An edge value for a member of ``dtype``: a boundary, a small step from the current value, or noise."""
    kind = rng.integers(4)
    if dtype.kind == "f":
        return [0.0, -1.0, float("nan"), float("inf"), 1e300, float(current) * 2][rng.integers(6)]
    bits = 8 * dtype.itemsize
    if kind == 0:
        value = int(INTERESTING[rng.integers(len(INTERESTING))])
    elif kind == 1:
        value = int(current) + int(rng.integers(-3, 4))
    elif kind == 2:
        value = int(current) * int(rng.choice([2, 16, 256, 1 << 16]))
    else:
        value = int(rng.integers(0, 1 << min(bits, 63)))
    return value % (1 << bits)  # wraps like the bytes would


def set_member(array: np.ndarray, index: int, path: tuple[str, ...], rng: np.random.Generator) -> None:
    """Set one member (a leaf of a possibly nested or sub-array record) of ``array[index]`` to an edge value."""
    target = array[index : index + 1]
    for name in path:
        target = target[name]
    flat = target.reshape(-1).view(target.dtype.base) if target.dtype.subdtype is None else \
        target.reshape(-1).view(target.dtype.subdtype[0])
    position = int(rng.integers(flat.size))
    base = flat.dtype
    if base.kind in "SV":  # bytes (a digest, reserved bytes): one byte set, or all of them noise
        raw = bytearray(flat[position : position + 1].view(np.uint8).tobytes())
        if rng.integers(2):
            raw[int(rng.integers(len(raw)))] = int(rng.integers(1, 256))
        else:
            raw[:] = rng.integers(0, 256, len(raw), dtype=np.uint8).tobytes()
        flat[position : position + 1].view(np.uint8)[:] = np.frombuffer(bytes(raw), np.uint8)
        return
    raw = interesting(rng, base, flat[position].item() if base.kind != "b" else 0)
    with np.errstate(over="ignore"):  # 1e300 in a float32 is infinity, as intended
        flat[position] = raw if base.kind == "f" else \
            np.array(raw, np.uint64).astype(base.str.replace("i", "u"), copy=False).view(base)


def leaves(dtype: np.dtype, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    if dtype.names is None:
        return [prefix]
    return [leaf for name in dtype.names for leaf in leaves(dtype.fields[name][0], prefix + (name,))]


HOSTILE_STRINGS = (
    lambda rng: "[" * int(rng.integers(150, 300_000)) + "]" * 3,
    lambda rng: "{\"a\": " * int(rng.integers(100, 50_000)) + "1" + "}" * 5,
    lambda rng: json.dumps([["a", "|O"]]),
    lambda rng: json.dumps([["a", "<M8[s]"]]),
    lambda rng: json.dumps([["a", ">i8"]]),
    lambda rng: json.dumps([["a", "<u1", [int(rng.choice([1 << 20, 1 << 40, 1 << 62]))]]]),
    lambda rng: json.dumps([["a", "<u4"], ["b", [["c", "|O"]]]]),
    lambda rng: json.dumps({"dtype": "<f4", "shape": [int(v) for v in rng.integers(0, 1 << 40, 3)]}),
    lambda rng: json.dumps({"dtype": "|O", "shape": [1]}),
    lambda rng: json.dumps({"write_mode": "lossless", "channels": int(rng.choice([0, 2, 5]))}),
    lambda rng: json.dumps({"shape": [1e400]}).replace("Infinity", "1e400"),
    lambda rng: json.dumps("x" * int(rng.integers(0, 5000))),
    lambda rng: "beton." + ["IntField", "FloatField", "NDArrayField", "TorchTensorField", "BytesField",
                            "JSONField", "RGBImageField", "Nope"][rng.integers(8)],
    lambda rng: bytes(rng.integers(0, 256, int(rng.integers(1, 40)), dtype=np.uint8)).decode("latin-1"),
    lambda rng: "",
)


def mutate_beton(content: bytes, data_dtype: np.dtype, rng: np.random.Generator) -> tuple[str, bytes]:
    """One structure-aware change of a table of a beton file, re-signed; returns (what, bytes)."""
    from beton.storage import format as fmt

    parts = Parts.of(content, data_dtype)
    kinds = ["header", "record", "string", "alias", "data", "data", "allocation", "checksums", "heap",
             *["metadata"] * 3]
    what = kinds[rng.integers(len(kinds))]
    if what == "header":
        member = leaves(fmt.HEADER_DTYPE)[rng.integers(len(leaves(fmt.HEADER_DTYPE)))]
        if member[0] in ("magic", "reserved", "header_crc32", "version", "header_size"):
            member = ("num_samples",)
        set_member(parts.header, 0, member, rng)
        if rng.random() < 0.5:  # keep the mutated header: no relayout
            return f"header {'.'.join(member)}", resign(parts.header.tobytes() + content[fmt.HEADER_SIZE :])
    elif what == "record" and len(parts.records):
        set_member(parts.records, int(rng.integers(len(parts.records))),
                   leaves(fmt.FIELD_RECORD_DTYPE)[rng.integers(len(leaves(fmt.FIELD_RECORD_DTYPE)))], rng)
    elif what == "string" and len(parts.records):
        part = ("type_name", "name", "arguments", "metadata_dtype")[rng.integers(4)]
        raw = HOSTILE_STRINGS[rng.integers(len(HOSTILE_STRINGS))](rng).encode("utf-8", "surrogatepass")
        parts.records[int(rng.integers(len(parts.records)))][part] = (len(parts.strings), len(raw))
        parts.strings += raw
        what = f"string {part}"
    elif what == "alias" and len(parts.records):  # many records sharing one large string
        big = json.dumps({"a": [0] * int(rng.integers(1000, 200_000))}).encode()
        count = int(rng.integers(2, 600))
        records = np.repeat(parts.records[:1], count)
        offset = len(parts.strings)
        parts.strings += big
        for index in range(count):
            name = f"f{index}".encode()
            records[index]["name"] = (len(parts.strings), len(name))
            parts.strings += name
            records[index]["arguments"] = (offset + int(rng.integers(0, 3)) * (rng.random() < 0.3), len(big) // 2
                                           if rng.random() < 0.2 else len(big))
        parts.records = records
        parts.header[0]["num_fields"] = count
    elif what == "data" and data_dtype.itemsize and len(parts.data) >= data_dtype.itemsize:
        table = np.frombuffer(bytes(parts.data), data_dtype).copy()
        member = leaves(data_dtype)[rng.integers(len(leaves(data_dtype)))]
        for _ in range(int(rng.integers(1, 4))):
            set_member(table, int(rng.integers(len(table))), member, rng)
        parts.data = bytearray(table.tobytes())
        what = f"data {'.'.join(member)}"
    elif what == "allocation" and len(parts.allocations):
        for _ in range(int(rng.integers(1, 4))):
            set_member(parts.allocations, int(rng.integers(len(parts.allocations))),
                       (("offset",), ("size",))[rng.integers(2)], rng)
    elif what == "checksums":
        parts.checksums = bytearray(rng.integers(0, 256, int(rng.integers(0, 64)) * 4, dtype=np.uint8).tobytes())
    elif what == "metadata":
        parts.metadata = HOSTILE_STRINGS[rng.integers(len(HOSTILE_STRINGS))](rng).encode("utf-8", "surrogatepass")
    else:
        what = "heap"
        for _ in range(int(rng.integers(1, 16))):
            if parts.heap:
                parts.heap[int(rng.integers(len(parts.heap)))] = int(rng.integers(256))
    return what, parts.assemble()


def mutate_ffcv(content: bytes, rng: np.random.Generator) -> tuple[str, bytes]:
    """One structure-aware change of an FFCV file (no checksums to re-sign)."""
    from beton.storage import ffcv_format

    out = bytearray(content)
    header = np.frombuffer(content[: ffcv_format.HEADER_DTYPE.itemsize], ffcv_format.HEADER_DTYPE).copy()
    what = ["header", "descriptor", "metadata", "metadata", "allocation"][rng.integers(5)]
    if what == "header":
        member = leaves(ffcv_format.HEADER_DTYPE)[rng.integers(5)]
        set_member(header, 0, member, rng)
        out[: header.nbytes] = header.tobytes()
        return f"ffcv header {member[0]}", bytes(out)
    num_fields = int(header[0]["num_fields"])
    descriptors_at = ffcv_format.HEADER_DTYPE.itemsize
    if what == "descriptor":
        field = int(rng.integers(num_fields))
        at = descriptors_at + field * ffcv_format.FIELD_DTYPE.itemsize + int(rng.choice([0, 1, 17, 17 + 256, 17 + 264]))
        for offset in range(int(rng.integers(1, 9))):
            out[at + offset] = int(rng.integers(256))
        return "ffcv descriptor", bytes(out)
    if what == "metadata":
        descriptors = np.frombuffer(content[descriptors_at :][: num_fields * ffcv_format.FIELD_DTYPE.itemsize],
                                    ffcv_format.FIELD_DTYPE)
        dtype = ffcv_format.metadata_table_dtype([int(t) for t in descriptors["type_id"]])
        start = descriptors_at + descriptors.nbytes
        table = np.frombuffer(content[start:][: int(header[0]["num_samples"]) * dtype.itemsize], dtype).copy()
        member = leaves(dtype)[rng.integers(len(leaves(dtype)))]
        set_member(table, int(rng.integers(len(table))), member, rng)
        out[start : start + table.nbytes] = table.tobytes()
        return f"ffcv metadata {'.'.join(member)}", bytes(out)
    at = int(header[0]["alloc_table_ptr"])
    table = np.frombuffer(content[at:], ffcv_format.ALLOCATION_DTYPE).copy()
    set_member(table, int(rng.integers(len(table))), leaves(ffcv_format.ALLOCATION_DTYPE)[rng.integers(3)], rng)
    out[at:] = table.tobytes()
    return "ffcv allocation", bytes(out)


def mutate_bytes(content: bytes, rng: np.random.Generator) -> tuple[str, bytes]:
    """Byte-level damage anywhere: flips, writes, a splice, a truncation or an extension."""
    out = bytearray(content)
    what = ["flips", "writes", "splice", "truncate", "extend"][rng.integers(5)]
    if what == "flips":
        for _ in range(int(rng.integers(1, 9))):
            at = int(rng.integers(len(out)))
            out[at] ^= 1 << int(rng.integers(8))
    elif what == "writes":
        for _ in range(int(rng.integers(1, 5))):
            at, size = int(rng.integers(len(out))), int(rng.choice([1, 2, 4, 8]))
            out[at : at + size] = int(INTERESTING[rng.integers(len(INTERESTING))] % (1 << 64)).to_bytes(
                8, "little")[:size]
    elif what == "splice":
        size = int(rng.integers(1, 512))
        source, target = int(rng.integers(len(out))), int(rng.integers(len(out)))
        out[target : target + size] = out[source : source + size]
    elif what == "truncate":
        del out[int(rng.integers(len(out))) :]
    else:
        out += rng.integers(0, 256, int(rng.integers(1, 4096)), dtype=np.uint8).tobytes()
    return f"bytes {what}", bytes(out)


def forge_page(content: bytes, rng: np.random.Generator) -> tuple[str, bytes] | None:
    """Bytes of one heap page changed, and 4 more chosen so that the page's CRC32 is kept (None: no page of 8
    bytes or more)."""
    from beton.storage import format as fmt

    header = np.frombuffer(content[: fmt.HEADER_SIZE], fmt.HEADER_DTYPE)[0]
    page_size, heap_size = int(header["page_size"]), int(header["heap_size"])
    page = int(rng.integers(fmt.page_count(heap_size, page_size)))
    start = fmt.HEAP_OFFSET + page * page_size
    end = min(start + page_size, fmt.HEAP_OFFSET + heap_size)
    if end - start < 8:
        return None
    out = bytearray(content)
    free = start + int(rng.integers(end - start - 3))
    places = [at for at in rng.integers(start, end, int(rng.integers(1, 9))).tolist() if not free <= at < free + 4]
    forge_keeping_crc32(out, start, end, {at: bytes([out[at] ^ int(rng.integers(1, 256))]) for at in places}, free)
    return f"forge: {len(places)} bytes of heap page {page} changed, 4 at {free - start} keep its CRC32", bytes(out)


def truncation_of(case: int) -> tuple[int, float] | None:
    """For a truncated-under-a-Loader case: (fraction of the file kept in thousandths, delay in seconds)."""
    rng = np.random.default_rng([20261127, case])
    if rng.random() >= 0.05:
        return None
    return int(rng.integers(0, 1000)), float(rng.uniform(0, 0.05))


def make_case(case: int, seeds: dict[str, pathlib.Path], dtypes: dict[str, np.dtype]) -> tuple[str, bytes]:
    """Case ``case``'s description and file content: a pure function of the case number and the seed files."""
    rng = np.random.default_rng([20261123, case])
    names = sorted(seeds)
    name = names[case % len(names)]
    content = seeds[name].read_bytes()
    truncation = truncation_of(case)
    if truncation is not None:
        return (f"{name}: intact, truncated to {truncation[0] / 10:.1f}% under an OS-cache Loader after "
                f"{truncation[1] * 1000:.0f} ms"), content
    if not name.startswith("ffcv") and rng.random() < 0.05:
        forged = forge_page(content, rng)
        if forged is not None:
            return f"{name}: {forged[0]}{FORGED}", forged[1]
    if rng.random() < 0.2:
        what, mutated = mutate_bytes(content, rng)
        if not name.startswith("ffcv") and rng.random() < 0.5:
            return f"{name}: {what}{UNSIGNED}", mutated  # an accident: the checksums must catch it
        return f"{name}: {what}", resign(mutated)
    if name.startswith("ffcv"):
        what, mutated = mutate_ffcv(content, rng)
    else:
        what, mutated = mutate_beton(content, dtypes[name], rng)
    return f"{name}: {what}", mutated


# ---- running a case ----------------------------------------------------------------------------------------


class UnflaggedWrongData(Exception):
    """Accidental damage that ``beton.verify`` passed and that changed what a sample reads."""


def original_of(what: str, seeds: dict[str, pathlib.Path]) -> str | None:
    """The intact seed file of an unsigned (accidental) or forged case, else None."""
    return str(seeds[what.split(":", 1)[0]]) if what.endswith((UNSIGNED, FORGED)) else None


def exercise(path: str, case: int, original: str | None = None, forged: bool = False) -> list[Callable[[], None]]:
    """Everything a user does with a downloaded file, as independent steps: open and read every sample, describe
    it (``beton info``), verify it, load an epoch with default pipelines and one with image crops; for accidental
    damage and forgeries, also that whatever verify passes reads as the intact ``original`` (for forgeries, also
    whatever a ``verify_content`` epoch passes). A truncated-under-a-Loader case is that one step."""
    import beton
    from beton.tools.cli import describe
    from beton.fields import RGBImageField, UnknownField
    from beton.decoders import RandomResizedCropRGBImageDecoder
    from beton.transforms import ToTensor

    def read() -> None:
        with beton.Reader(path) as reader:
            describe(reader)
            known = all(not isinstance(field, UnknownField) for field in reader.fields.values())
            failure = None
            for index in range(min(len(reader), MAX_SAMPLES_READ)):
                try:
                    if known:
                        reader[index]
                    else:  # unknown fields cannot decode (by design): their raw payloads still read
                        for name in reader.fields:
                            reader.payload(index, name)
                except beton.errors.BetonError as error:  # the other samples still get read
                    failure = failure or error
            if failure is not None:
                raise failure

    def epochs() -> None:
        with beton.Reader(path) as reader:
            fields = dict(reader.fields)
        dropped = {name: None for name, field in fields.items() if isinstance(field, UnknownField)}
        if len(dropped) < len(fields):
            _epoch(path, dropped, os_cache=case % 2 == 0)
        crops = {name: [RandomResizedCropRGBImageDecoder((16, 16)), ToTensor()] for name, field in fields.items()
                 if isinstance(field, RGBImageField)}
        if crops:
            _epoch(path, {**{name: None for name in fields}, **crops}, os_cache=case % 2 == 1)

    def flagged_or_unchanged(verify_content: bool = False) -> None:
        try:
            if verify_content:  # a forgery: reads that check content must flag it too
                with beton.Reader(path) as reader:
                    dropped = {name: None for name, field in reader.fields.items() if isinstance(field, UnknownField)}
                _epoch(path, dropped, os_cache=case % 2 == 0, verify_content=True)
            else:
                beton.verify(path)
            with beton.Reader(path) as damaged, beton.Reader(original) as intact:
                if len(damaged) != len(intact):
                    raise UnflaggedWrongData(f"{len(damaged)} samples instead of {len(intact)}")
                for index in range(len(intact)):
                    if not _same(damaged[index], intact[index]):
                        raise UnflaggedWrongData(f"sample {index} reads differently and verify passed")
        except beton.errors.BetonError:
            pass  # flagged: on open, by verify, or when the sample is read

    def truncated_under_loader() -> None:
        kept, delay = truncation_of(case)
        cut = os.path.getsize(path) * kept // 1000
        with beton.Reader(path) as reader:
            dropped = {name: None for name, field in reader.fields.items() if isinstance(field, UnknownField)}
        if reader.format.startswith("FFCV") or len(dropped) == len(reader.fields):
            return
        timer = threading.Timer(delay, os.truncate, (path, cut))
        with beton.Loader(path, batch_size=2, num_workers=2, order=beton.OrderOption.RANDOM, seed=0,
                          os_cache=True, pipelines=dropped) as loader:
            timer.start()
            try:
                deadline = time.monotonic() + delay + 0.05
                while time.monotonic() < deadline:  # epochs until the truncation has happened, and one more
                    for _ in loader:
                        pass
            finally:
                timer.join()

    if truncation_of(case) is not None:
        return [truncated_under_loader]
    checks = [flagged_or_unchanged] if original else []
    if forged:
        checks.append(lambda: flagged_or_unchanged(verify_content=True))
    return [read, lambda: beton.verify(path), epochs] + checks


def _same(first: Any, second: Any) -> bool:
    if isinstance(first, tuple) and isinstance(second, tuple):
        return len(first) == len(second) and all(_same(a, b) for a, b in zip(first, second))
    if isinstance(first, np.ndarray) or isinstance(second, np.ndarray):
        return (isinstance(first, np.ndarray) and isinstance(second, np.ndarray) and first.dtype == second.dtype
                and np.array_equal(first, second))
    if hasattr(first, "equal") and hasattr(second, "equal"):  # torch tensors (bfloat16 has no numpy view)
        return first.dtype == second.dtype and first.shape == second.shape and bool(first.equal(second))
    return type(first) is type(second) and first == second


def _epoch(path: str, pipelines: dict, os_cache: bool, verify_content: bool = False) -> None:
    import beton

    with beton.Loader(path, batch_size=4, num_workers=1, order=beton.OrderOption.RANDOM, seed=0,
                      os_cache=os_cache, pipelines=pipelines, verify_content=verify_content) as loader:
        for _ in loader:
            pass


def classify(steps: list[Callable[[], None]]) -> tuple[str, str]:
    """The worst outcome of the steps (other > BetonError > ok) and what it said."""
    from beton.errors import BetonError

    outcome, detail = "ok", ""
    for step in steps:
        try:
            step()
        except UnflaggedWrongData as error:
            return "unflagged", str(error)
        except BetonError as error:
            if outcome == "ok":
                outcome, detail = "BetonError", f"{type(error).__name__}: {str(error)[:300]}"
        except Exception as error:  # noqa: BLE001 - what the fuzzer looks for
            return "other", "".join(traceback.format_exception(error)[-6:])[-1500:]
    return outcome, detail


def worker() -> None:
    """Serve cases read from stdin (one JSON line each), answering on the original stdout."""
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # anything else printed goes to stderr, not into the answers
    import beton  # noqa: F401 - imported before the first case so it does not count towards its time

    for line in sys.stdin:
        request = json.loads(line)
        _reset_peak_rss()
        start = time.perf_counter()
        outcome, detail = classify(exercise(request["path"], request["case"], request.get("original"),
                                            request.get("forged", False)))
        answers.write(json.dumps({"outcome": outcome, "detail": detail, "seconds": time.perf_counter() - start,
                                  "rss": _peak_rss()}) + "\n")
        answers.flush()


def _reset_peak_rss() -> None:
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")  # resets VmHWM (Linux)
    except OSError:
        pass


def _peak_rss() -> int:
    return _status_kib("VmHWM") * 1024


def _status_kib(key: str, pid: str = "self") -> int:
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


class Worker:
    """A worker process, restarted after it crashes, hangs or is killed for its memory."""

    def __init__(self, log: pathlib.Path, timeout: float, kill_rss: int) -> None:
        self.log, self.timeout, self.kill_rss = log, timeout, kill_rss
        self.process: subprocess.Popen | None = None

    def _start(self) -> subprocess.Popen:
        if self.process is None or self.process.poll() is not None:
            with open(self.log, "ab") as log:
                self.process = subprocess.Popen([sys.executable, __file__, "--worker"], stdin=subprocess.PIPE,
                                                stdout=subprocess.PIPE, stderr=log, cwd=ROOT)
        return self.process

    def run(self, path: str, case: int, original: str | None = None, forged: bool = False) -> dict:
        process = self._start()
        # the first case of a fresh worker also waits for its imports
        request = {"path": path, "case": case, "original": original, "forged": forged}
        process.stdin.write((json.dumps(request) + "\n").encode())
        process.stdin.flush()
        start, peak = time.monotonic(), 0
        while True:
            ready, _, _ = select.select([process.stdout], [], [], 0.05)
            if ready:
                line = process.stdout.readline()
                if line:
                    return json.loads(line)
                code = process.wait()
                self.process = None
                return {"outcome": "crash", "detail": f"exit status {code}" + (
                    f" ({signal.Signals(-code).name})" if code < 0 else ""), "seconds": time.monotonic() - start,
                        "rss": peak}
            peak = max(peak, _status_kib("VmRSS", str(process.pid)) * 1024)
            if peak > self.kill_rss or time.monotonic() - start > self.timeout:
                self.stop()
                outcome = "memory" if peak > self.kill_rss else "hang"
                return {"outcome": outcome, "detail": f"RSS {peak >> 20} MiB after {time.monotonic() - start:.0f} s",
                        "seconds": time.monotonic() - start, "rss": peak}

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None


@dataclasses.dataclass
class Summary:
    counts: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    examples: dict = dataclasses.field(default_factory=lambda: collections.defaultdict(list))
    messages: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    over_rss_goal: int = 0
    worst_rss: tuple = (0, -1, "")
    slowest: tuple = (0.0, -1, "")

    def add(self, case: int, what: str, result: dict) -> None:
        outcome = result["outcome"]
        self.counts[outcome] += 1
        if outcome == "BetonError":  # what refused the file: the start of the message, locations left out
            self.messages[result["detail"].split(": ")[-1][:60]] += 1
        if len(self.examples[outcome]) < 10:
            self.examples[outcome].append((case, what, result["detail"]))
        self.over_rss_goal += result["rss"] > RSS_GOAL
        self.worst_rss = max(self.worst_rss, (result["rss"], case, what))
        self.slowest = max(self.slowest, (result["seconds"], case, what))

    @property
    def bugs(self) -> int:
        return sum(self.counts[outcome] for outcome in BUGS) + self.over_rss_goal

    def report(self, messages: int = 0) -> str:
        lines = [", ".join(f"{outcome}: {self.counts[outcome]}" for outcome in ("ok", "BetonError", *BUGS)),
                 f"peak RSS over 1 GiB: {self.over_rss_goal}; worst {self.worst_rss[0] / 2**20:.0f} MiB "
                 f"(case {self.worst_rss[1]}, {self.worst_rss[2]}); slowest {self.slowest[0]:.2f} s "
                 f"(case {self.slowest[1]}, {self.slowest[2]})"]
        for message, count in self.messages.most_common(messages):
            lines.append(f"  {count:6d} x BetonError {message}")
        for outcome in BUGS:
            for case, what, detail in self.examples.get(outcome, []):
                lines.append(f"  {outcome} case {case} ({what}):\n    " + detail.replace("\n", "\n    "))
        return "\n".join(lines)


def fuzz(cases: range, jobs: int = 2, timeout: float = 60.0, kill_rss: int = 2 << 30,
         keep: pathlib.Path | None = None, progress: bool = False) -> Summary:
    """Run ``cases`` over ``jobs`` worker processes; counts per outcome."""
    summary, lock = Summary(), threading.Lock()
    with tempfile.TemporaryDirectory(prefix="beton-fuzz-") as scratch:
        folder = pathlib.Path(scratch)
        seeds, dtypes = _seeds(folder)
        pending: queue.Queue[int] = queue.Queue()
        for case in cases:
            pending.put(case)
        start = time.monotonic()

        def serve(slot: int) -> None:
            runner = Worker(folder / f"worker{slot}.log", timeout, kill_rss)
            try:
                while True:
                    try:
                        case = pending.get_nowait()
                    except queue.Empty:
                        return
                    what, content = make_case(case, seeds, dtypes)
                    path = folder / f"case{slot}.beton"
                    path.write_bytes(content)
                    result = runner.run(str(path), case, original_of(what, seeds), what.endswith(FORGED))
                    with lock:
                        summary.add(case, what, result)
                        done = sum(summary.counts.values())
                        if progress and done % 100 == 0:
                            print(f"{done} cases, {time.monotonic() - start:.0f} s: {dict(summary.counts)}",
                                  flush=True)
                    if keep is not None and result["outcome"] in BUGS:
                        keep.mkdir(parents=True, exist_ok=True)
                        (keep / f"case{case}.beton").write_bytes(content)
            finally:
                runner.stop()

        threads = [threading.Thread(target=serve, args=(slot,)) for slot in range(jobs)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    ran = sum(summary.counts.values())
    if ran != len(cases):  # a case the harness itself could not make (its thread printed why): not a clean run
        raise SystemExit(f"the fuzz ran {ran} of {len(cases)} cases: the harness failed (see above)")
    return summary


def _seeds(folder: pathlib.Path) -> tuple[dict[str, pathlib.Path], dict[str, np.dtype]]:
    import beton

    seeds = make_seed_files(folder)
    dtypes = {}
    for name, path in seeds.items():
        with beton.Reader(path) as reader:
            dtypes[name] = reader.data_table.dtype
    return seeds, dtypes


def replay(case: int, keep: pathlib.Path | None) -> None:
    with tempfile.TemporaryDirectory(prefix="beton-fuzz-") as scratch:
        seeds, dtypes = _seeds(pathlib.Path(scratch))
        what, content = make_case(case, seeds, dtypes)
        path = pathlib.Path(keep or scratch) / f"case{case}.beton"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
        print(f"case {case}: {what} -> {path}")
        print(classify(exercise(str(path), case, original_of(what, seeds), what.endswith(FORGED))))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", type=int, default=1000)
    parser.add_argument("--first", type=int, default=0, help="number of the first case")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds before a case counts as a hang")
    parser.add_argument("--kill-rss", type=int, default=2048, help="MiB of RSS at which a worker is killed")
    parser.add_argument("--keep", type=pathlib.Path, help="save the files of cases that found a bug here")
    parser.add_argument("--messages", type=int, default=0, help="show the N most common BetonError messages")
    parser.add_argument("--replay", type=int, help="run one case in this process, with its traceback")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    arguments = parser.parse_args(argv)
    if arguments.worker:
        worker()
        return 0
    if arguments.replay is not None:
        replay(arguments.replay, arguments.keep)
        return 0
    start = time.monotonic()
    summary = fuzz(range(arguments.first, arguments.first + arguments.cases), arguments.jobs, arguments.timeout,
                   arguments.kill_rss << 20, arguments.keep, progress=True)
    print(f"{arguments.cases} cases in {time.monotonic() - start:.0f} s with {arguments.jobs} workers")
    print(summary.report(arguments.messages))
    return 1 if summary.bugs else 0


if __name__ == "__main__":
    sys.exit(main())
