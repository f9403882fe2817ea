"""Hostile inputs against the converters (issue #25): each case is built in a temporary folder and converted in a
child process of its own, which reports the outcome (written, or the error's class and message) and its peak
resident memory (``ru_maxrss``: the child's whole life, imports and building the case included; the ``baseline``
case imports beton and converts one small image, for comparison) and how far the peak grew while converting
(Linux: the peak is reset after the case is built and beton imported). A case still running after ``--timeout`` seconds is killed and
reported as hanging.

    python benchmarks/hostile_converters.py [--only NAME,...] [--timeout 120] [--json results.json]

Cases (what the audit found before the fix, in brackets):

* ``png_30000``: a 2.6 MB PNG declaring 30000x30000 (valid zero rows) [decoded to 5.4 GB before refused]
* ``png_30000_shrunk``: the same with ``max_resolution=256`` [shrinking decodes it first]
* ``jpeg_forged_sof``: a small JPEG whose SOF declares 60000x60000, ``max_resolution=256``
* ``webdataset_2gib_member``: a ~2 MB .tar.gz holding one 2 GiB member of zeros [peak 4.4 GB]
* ``webdataset_pax_1gib``: a .tar.gz whose pax header declares 1 GiB of header data (tarfile reads it whole)
* ``imagefolder_fifo``: a FIFO named ``*.jpg``, ``on_error="skip"`` [hung]
* ``imagefolder_dev_zero`` / ``..._followed``: a link to /dev/zero, and with ``follow_links=True`` [read ~5 GB]
* ``imagefolder_link_out``: a link to a file outside the folder [followed]
* ``imagefolder_link_root``: a folder link to the root inside a class [relabelled another class]
* ``parquet_uint8_wrap`` / ``parquet_bool``: HF features declaring uint8 / bool over int32 data [258 -> 2;
  every value True]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import struct
import subprocess
import sys
import tarfile
import tempfile
import time

from peak_memory import peak_growth_mb, reset_peak
import zlib

import numpy as np


def _png_zero_rows(width: int, height: int) -> bytes:
    """A valid PNG of ``width`` x ``height`` black RGB pixels (rows of zeros compress ~1000:1)."""
    def chunk(name: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + name + data + struct.pack(">I", zlib.crc32(name + data))
    compressor = zlib.compressobj(9)
    row = bytes(1 + 3 * width)
    rows_per_piece = max(1, (64 << 20) // len(row))
    pieces, left = [], height
    while left:
        count = min(left, rows_per_piece)
        pieces.append(compressor.compress(row * count))
        left -= count
    pieces.append(compressor.flush())
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)) +
            chunk(b"IDAT", b"".join(pieces)) + chunk(b"IEND", b""))


def _small_png() -> bytes:
    import cv2

    return cv2.imencode(".png", np.full((6, 8, 3), 128, np.uint8))[1].tobytes()


def _small_jpeg() -> bytes:
    import simplejpeg

    return simplejpeg.encode_jpeg(np.full((16, 16, 3), 128, np.uint8))


def _folder(root: str, files: dict[str, bytes]) -> str:
    for relative, data in files.items():
        path = os.path.join(root, relative)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as file:
            file.write(data)
    return root


class _Zeros(io.RawIOBase):
    def __init__(self, size: int) -> None:
        self.left = size

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # type: ignore[no-untyped-def]
        count = min(len(buffer), self.left)
        buffer[:count] = bytes(count)
        self.left -= count
        return count


def _shard(path: str, huge: int) -> None:
    with tarfile.open(path, "w:gz", compresslevel=1) as archive:
        for key, size in (("s0", None), ("s1", huge), ("s2", None)):
            for extension, data in (("bin", b"small" if size is None else None), ("cls", b"1")):
                info = tarfile.TarInfo(f"{key}.{extension}")
                info.size = len(data) if data is not None else size
                archive.addfile(info, io.BytesIO(data) if data is not None else _Zeros(size))


def _pax_shard(path: str, header_bytes: int) -> None:
    import gzip

    with gzip.open(path, "wb", compresslevel=1) as out:
        for key in ("s0", "s1"):
            info = tarfile.TarInfo(f"{key}.cls")
            info.size = 1
            out.write(info.tobuf(tarfile.USTAR_FORMAT) + b"1".ljust(512, b"\0"))
        pax = tarfile.TarInfo("././@PaxHeader")
        pax.type, pax.size = tarfile.XHDTYPE, header_bytes
        out.write(pax.tobuf(tarfile.USTAR_FORMAT))
        chunk = bytes(1 << 20)
        for _ in range(header_bytes // len(chunk)):
            out.write(chunk)
        info = tarfile.TarInfo("s2.cls")
        info.size = 1
        out.write(info.tobuf(tarfile.USTAR_FORMAT) + b"1".ljust(512, b"\0") + bytes(1024))


def _parquet(path: str, dtype: str, values: list[int]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"x": pa.array([[[value, 0]] for value in values], pa.list_(pa.list_(pa.int32())))})
    feature = {"_type": "Array2D", "shape": [None, 2], "dtype": dtype}
    pq.write_table(table.replace_schema_metadata(
        {b"huggingface": json.dumps({"info": {"features": {"x": feature}}}).encode()}), path)


def build(case: str, where: str) -> tuple[str, list, dict]:
    """Make the case's input under ``where``: (converter, positional arguments, keyword arguments)."""
    root = os.path.join(where, "root")
    common = {"num_workers": 0, "progress": False}
    if case == "baseline":
        return "imagefolder", [_folder(root, {"a/x.png": _small_png()})], common
    if case in ("png_30000", "png_30000_shrunk"):
        options = {**common, "max_resolution": 256} if case.endswith("shrunk") else common
        return "imagefolder", [_folder(root, {"a/bomb.png": _png_zero_rows(30000, 30000)})], options
    if case == "jpeg_forged_sof":
        data = bytearray(_small_jpeg())
        sof = data.index(b"\xff\xc0")
        data[sof + 5 : sof + 9] = struct.pack(">HH", 60000, 60000)
        return "imagefolder", [_folder(root, {"a/forged.jpg": bytes(data)})], {**common, "max_resolution": 256}
    if case == "webdataset_2gib_member":
        path = os.path.join(where, "shard.tar.gz")
        _shard(path, 2 << 30)
        return "webdataset", [path], {**common, "on_error": "skip"}
    if case == "webdataset_pax_1gib":
        path = os.path.join(where, "shard.tar.gz")
        _pax_shard(path, 1 << 30)
        return "webdataset", [path], {**common, "on_error": "skip"}
    if case.startswith("imagefolder_"):
        _folder(root, {"a/fine.png": _small_png(), "b/fine.png": _small_png()})
        outside = _folder(os.path.join(where, "outside"), {"secret.png": _small_png()})
        options = {**common, "on_error": "skip"} if case == "imagefolder_fifo" else common
        if case == "imagefolder_fifo":
            os.mkfifo(os.path.join(root, "a", "pipe.jpg"))
        elif case.startswith("imagefolder_dev_zero"):
            os.symlink("/dev/zero", os.path.join(root, "a", "zero.png"))
            if case.endswith("followed"):
                options = {**options, "follow_links": True}
        elif case == "imagefolder_link_out":
            os.symlink(os.path.join(outside, "secret.png"), os.path.join(root, "a", "out.png"))
        elif case == "imagefolder_link_root":
            os.symlink(root, os.path.join(root, "a", "everything"))
        return "imagefolder", [root], options
    if case in ("parquet_uint8_wrap", "parquet_bool"):
        path = os.path.join(where, "t.parquet")
        _parquet(path, "uint8" if case == "parquet_uint8_wrap" else "bool", [1, 258 if "uint8" in case else 2, 3])
        return "parquet", [path], common
    raise ValueError(f"no case {case!r}")


CASES = ("baseline", "png_30000", "png_30000_shrunk", "jpeg_forged_sof", "webdataset_2gib_member",
         "webdataset_pax_1gib", "imagefolder_fifo", "imagefolder_dev_zero", "imagefolder_dev_zero_followed",
         "imagefolder_link_out", "imagefolder_link_root", "parquet_uint8_wrap", "parquet_bool")


def child(case: str, where: str) -> None:
    """Build and convert one case in this process; print its outcome and peak RSS as JSON."""
    converter, arguments, options = build(case, where)
    input_bytes = sum(os.path.getsize(os.path.join(directory, name)) for directory, _, names in os.walk(where)
                      for name in names if os.path.isfile(os.path.join(directory, name))
                      and not os.path.islink(os.path.join(directory, name)))
    import beton
    import beton.convert

    before = reset_peak()
    started = time.perf_counter()
    try:
        report = getattr(beton.convert, converter)(*arguments, os.path.join(where, "out.beton"), **options)
        outcome = f"written: {report.num_samples} samples" + \
            "".join(f"; skipped {os.path.basename(s.source.split(' ')[0])}{' ' + s.source.split(' ', 1)[1] if ' ' in s.source else ''}: {s.reason}"
                    for s in report.skipped)
        if converter == "parquet":
            with beton.Reader(os.path.join(where, "out.beton")) as reader:
                outcome += f"; stored {[reader[i][0].tolist() for i in range(report.num_samples)]}"
    except beton.BetonError as error:
        outcome = f"{type(error).__name__}: {error}".replace(where + os.sep, "")
    seconds = time.perf_counter() - started
    peak = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
    growth = peak_growth_mb(before)
    print(json.dumps({"case": case, "input_bytes": input_bytes, "outcome": outcome.replace(where, "<tmp>"),
                      "peak_rss_mb": round(peak / 1024, 1), "conversion_peak_growth_mb": growth,
                      "seconds": round(seconds, 2)}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default=None, help="comma-separated case names")
    parser.add_argument("--timeout", type=float, default=120)
    parser.add_argument("--json", default=None, help="also write the rows here")
    parser.add_argument("--child", nargs=2, metavar=("CASE", "DIR"), help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    if arguments.child:
        child(*arguments.child)
        return
    rows = []
    for case in arguments.only.split(",") if arguments.only else CASES:
        with tempfile.TemporaryDirectory() as where:
            try:
                result = subprocess.run([sys.executable, __file__, "--child", case, where], capture_output=True,
                                        text=True, timeout=arguments.timeout)
                lines = result.stdout.strip().splitlines()
                row = json.loads(lines[-1]) if lines else {"case": case, "outcome": f"crashed: {result.stderr[-300:]}"}
            except subprocess.TimeoutExpired:
                row = {"case": case, "outcome": f"HUNG: killed after {arguments.timeout:.0f} s"}
        rows.append(row)
        print(f"{row['case']:<30} {row.get('input_bytes', 0) / 1e6:>8.2f} MB in  {row.get('peak_rss_mb', '-'):>7} MB peak  "
              f"+{row.get('conversion_peak_growth_mb', '-')} MB while converting  "
              f"{row.get('seconds', '-'):>6} s  {row['outcome'][:300]}", flush=True)
    if arguments.json:
        with open(arguments.json, "w") as file:
            json.dump(rows, file, indent=2)


if __name__ == "__main__":
    main()
