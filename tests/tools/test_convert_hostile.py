"""Hostile inputs to the converters (issue #25): each is refused, naming it, before it costs what it declares."""

from __future__ import annotations

import io
import json
import os
import struct
import subprocess
import sys
import tarfile
import textwrap
import zlib

import numpy as np
import pytest
from PIL import Image

import beton
import beton.convert
from beton.errors import BetonError, EncodeError
from beton.tools.convert import ConversionError, ImageFileField, ImageFolder
from beton.tools.convert.image_headers import image_size
from beton.tools.sample_photos import photo_crop

from cli_runs import run_cli

HUGE = (16000, 12000)  # 1.9e8 pixels (WebP holds at most 16383 a side): more than the default cap of 2^27


def encoded(format_name: str, size=(8, 6), **options) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(photo_crop(1, size[1], size[0])).save(buffer, format_name, **options)
    return buffer.getvalue()


def png_declaring(width: int, height: int, rest: bytes = b"") -> bytes:
    """A small PNG whose IHDR (with a valid CRC) declares ``width`` x ``height``."""
    data = bytearray(encoded("PNG"))
    data[16:24] = struct.pack(">II", width, height)
    data[29:33] = struct.pack(">I", zlib.crc32(bytes(data[12:29])))
    return bytes(data) + rest


def jpeg_declaring(width: int, height: int) -> bytes:
    data = bytearray(encoded("JPEG"))
    sof = data.index(b"\xff\xc0")
    data[sof + 5 : sof + 9] = struct.pack(">HH", height, width)
    return bytes(data)


def gif_declaring(width: int, height: int) -> bytes:
    data = bytearray(encoded("GIF"))
    data[6:10] = struct.pack("<HH", width, height)
    return bytes(data)


def bmp_declaring(width: int, height: int) -> bytes:
    data = bytearray(encoded("BMP"))
    data[18:26] = struct.pack("<ii", width, -height)
    return bytes(data)


def webp_declaring(width: int, height: int) -> bytes:
    data = bytearray(encoded("WEBP", lossless=True))
    assert data[12:16] == b"VP8L"
    data[21:25] = struct.pack("<I", (width - 1) | (height - 1) << 14 | (data[24] >> 4) << 28)
    return bytes(data)


def tiff_declaring(width: int, height: int) -> bytes:
    data = bytearray(encoded("TIFF"))
    (directory,) = struct.unpack_from("<I", data, 4)
    (count,) = struct.unpack_from("<H", data, directory)
    for index in range(count):
        entry = directory + 2 + 12 * index
        tag, kind = struct.unpack_from("<HH", data, entry)
        if tag in (256, 257):
            data[entry + 2 : entry + 12] = struct.pack("<HII", 4, 1, width if tag == 256 else height)
    return bytes(data)


def jpeg2000_declaring(width: int, height: int) -> bytes:
    data = bytearray(encoded("JPEG2000", no_jp2=True))
    data[8:16] = struct.pack(">II", width, height)
    return bytes(data)


FORGED = {"PNG": png_declaring, "JPEG": jpeg_declaring, "GIF": gif_declaring, "BMP": bmp_declaring,
          "WebP": webp_declaring, "TIFF": tiff_declaring, "JPEG 2000": jpeg2000_declaring,
          "PNM": lambda width, height: f"P6\n# forged\n{width} {height}\n255\n".encode() + bytes(64)}


@pytest.mark.parametrize("kind", FORGED)
def test_a_header_declaring_too_many_pixels_is_refused_before_decoding(kind):
    data = FORGED[kind](*HUGE)
    assert image_size(data, kind) == HUGE
    with pytest.raises(EncodeError, match=f"{kind} header declares 16000x12000 pixels, more than "
                                          "max_image_pixels=134217728; it is not decoded"):
        ImageFileField(write_mode="jpg").prepare(data)
    small = FORGED[kind](40, 30)  # the same forgery within the cap: the header parser reads what it says
    assert image_size(small, kind) == (40, 30)


@pytest.mark.parametrize("data, message", [
    (encoded("PNG")[:20], "PNG header cannot be read: it ends at byte 20"),
    (png_declaring(8, 6)[:29] + b"\0\0\0\0", "PNG header cannot be read: the IHDR chunk's CRC does not match"),
    (b"RIFF\x10\x00\x00\x00WEBPVP8 " + bytes(range(40)), "WebP header cannot be read: its VP8 chunk does not start"),
    (b"P6\n" + b"# " * 3000, "PNM header cannot be read: no width and height within its first 4096 bytes"),
    (b"II*\x00\xff\xff\x00\x00", "TIFF header cannot be read: it ends at byte 8, a field lies at 65535"),
    (b"GIF89a\x08\x00\x06\x00\x00\x00\x00\x00", "GIF header cannot be read: byte 13 is 0x00"),
])
def test_a_header_that_cannot_be_parsed_refuses_the_file(data, message):
    with pytest.raises(EncodeError, match=message.replace("(", r"\(")):
        ImageFileField().prepare(data)


def test_the_cap_applies_with_max_resolution_and_can_be_raised_or_lifted():
    data = png_declaring(*HUGE)
    with pytest.raises(EncodeError, match="declares 16000x12000 pixels"):  # shrinking would decode it first
        ImageFileField(max_resolution=64).prepare(data)
    with pytest.raises(EncodeError, match="PNG data cannot be decoded"):  # no cap: decoded, and found short
        ImageFileField(max_resolution=64, max_image_pixels=None).prepare(data)
    pixels = ImageFileField(write_mode="raw", max_image_pixels=48).prepare(encoded("PNG"))
    assert pixels.shape == (6, 8, 3)
    with pytest.raises(EncodeError, match="more than max_image_pixels=47"):
        ImageFileField(max_image_pixels=47).prepare(encoded("PNG"))
    assert "max_image_pixels" not in ImageFileField().arguments()  # the file stores RGBImageField's arguments


GROWTH = textwrap.dedent("""
    def reset_peak():  # Linux: the peak RSS (VmHWM) restarts from the current RSS
        with open("/proc/self/clear_refs", "w") as file:
            file.write("5")
        return status("VmRSS")

    def status(name):
        with open("/proc/self/status") as file:
            return next(int(line.split()[1]) for line in file if line.startswith(name + ":"))
""")

# One conversion per cap in argv[3:], in turn, each measured from its own reset of the peak.
PEAK_SCRIPT = GROWTH + textwrap.dedent("""
    import json, sys
    import beton.convert
    for cap in sys.argv[3:]:
        before = reset_peak()
        try:
            beton.convert.imagefolder(sys.argv[1], sys.argv[2], num_workers=0, progress=False,
                                      max_image_pixels=None if cap == "none" else int(cap), write_mode="raw")
            outcome = "written"
        except beton.BetonError as error:
            outcome = f"{type(error).__name__}: {error}"
        print(json.dumps([(status("VmHWM") - before) // 1024, outcome]))
""")


def test_a_refused_image_costs_no_decode_memory(tmp_path):
    """A valid 5000x4000 PNG of zeros (60 MB decoded, 60 kB on disk): refused with a cap of a million pixels,
    the conversion's peak memory does not grow by the decode; without the cap (the control) it does."""
    (tmp_path / "root" / "a").mkdir(parents=True)
    Image.new("RGB", (5000, 4000)).save(tmp_path / "root" / "a" / "big.png")
    # The refused conversion first, in a fresh process; then the control, whose decode must show in its peak.
    result = subprocess.run([sys.executable, "-c", PEAK_SCRIPT, str(tmp_path / "root"), str(tmp_path / "out.beton"),
                             "1000000", "none"], capture_output=True, text=True, timeout=300,
                            env={**os.environ, "BETON_MAX_IMAGE_PIXELS": "none"})
    assert result.returncode == 0, result.stderr
    (grown, outcome), (control_grown, control) = (json.loads(line) for line in result.stdout.splitlines())
    assert outcome.startswith("ConversionError: ") and "big.png" in outcome and \
        "declares 5000x4000 pixels, more than max_image_pixels=1000000" in outcome
    assert grown < 30, grown  # MiB
    assert control == "written" and control_grown >= 55, (control_grown, control)


def test_the_command_names_the_file_and_takes_the_cap(tmp_path):
    (tmp_path / "root" / "a").mkdir(parents=True)
    (tmp_path / "root" / "a" / "bomb.png").write_bytes(png_declaring(*HUGE))
    (tmp_path / "root" / "a" / "fine.png").write_bytes(encoded("PNG"))
    command = ["convert", "imagefolder", tmp_path / "root", tmp_path / "out.beton", "--num-workers", "0",
               "--no-progress"]
    failed = run_cli(*command)
    assert failed.returncode == 1 and "bomb.png" in failed.stderr and "declares 16000x12000 pixels" in failed.stderr
    skipped = run_cli(*command, "--on-error", "skip", "--max-image-pixels", "48")
    assert skipped.returncode == 0 and "wrote 1 samples" in skipped.stdout and "bomb.png" in skipped.stdout


# --- image folders: regular files only, inside the folder, within the size cap ---------------------------------

def folder_with(tmp_path, make) -> str:
    root = tmp_path / "root"
    for name in ("a", "b"):
        (root / name).mkdir(parents=True)
        (root / name / "fine.png").write_bytes(encoded("PNG"))
    make(root)
    return str(root)


def convert_in_subprocess(root: str, out: str, *runs: dict) -> list[tuple[str, list[str]]]:
    """Converts once per ``runs`` entry (its options), in one child process killed after 60 s (a FIFO that is opened
    hangs it): (outcome, skipped) for each."""
    script = textwrap.dedent(f"""
        import json, beton.convert
        for options in {list(runs)!r}:
            try:
                report = beton.convert.imagefolder({root!r}, {out!r}, num_workers=0, progress=False, **options)
                print(json.dumps(["written", [[s.source, s.reason] for s in report.skipped]]))
            except beton.BetonError as error:
                print(json.dumps([f"{{type(error).__name__}}: {{error}}", []]))
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    lines = result.stdout.strip().splitlines()[-len(runs):]
    assert len(lines) == len(runs), result.stdout + result.stderr
    return [tuple(json.loads(line)) for line in lines]


def test_a_fifo_is_refused_unopened_and_cannot_hang_the_conversion(tmp_path):
    root = folder_with(tmp_path, lambda root: os.mkfifo(root / "a" / "pipe.jpg"))
    (outcome, _), (skipping, skipped) = convert_in_subprocess(root, str(tmp_path / "o.beton"), {}, {"on_error": "skip"})
    assert outcome.startswith("ConversionError: ") and "pipe.jpg: is a named pipe (FIFO), not a regular file" in outcome
    assert skipping == "written" and [os.path.basename(source) for source, _ in skipped] == ["pipe.jpg"]


def test_a_fifo_swapped_in_after_listing_is_not_waited_on(tmp_path):
    root = folder_with(tmp_path, lambda root: None)
    folder = ImageFolder(root)
    os.remove(folder.samples[0][0])
    os.mkfifo(folder.samples[0][0])
    with pytest.raises(OSError, match="is a named pipe"):
        folder[0]


def test_a_link_to_a_device_is_not_followed_nor_read(tmp_path):
    root = folder_with(tmp_path, lambda root: os.symlink("/dev/zero", root / "a" / "zero.png"))
    (outcome, _), (following, _) = convert_in_subprocess(root, str(tmp_path / "o.beton"), {}, {"follow_links": True})
    assert "zero.png: symbolic link out of the image folder (to '/dev/zero'); follow_links=True" in outcome
    assert "zero.png: is a character device, not a regular file; it is not read" in following


def test_links_out_of_the_folder_need_follow_links_and_links_inside_are_followed(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.png").write_bytes(encoded("PNG", size=(5, 5)))
    def make(root):
        os.symlink(outside / "secret.png", root / "a" / "out.png")
        os.symlink(root / "b" / "fine.png", root / "a" / "in.png")  # inside the folder: fine
    root = folder_with(tmp_path, make)
    with pytest.raises(ConversionError, match="out.png: symbolic link out of the image folder"):
        beton.convert.imagefolder(root, tmp_path / "o.beton", num_workers=0, progress=False)
    report = beton.convert.imagefolder(root, tmp_path / "o.beton", num_workers=0, progress=False, on_error="skip")
    assert report.num_samples == 3 and [os.path.basename(s.source) for s in report.skipped] == ["out.png"]
    report = beton.convert.imagefolder(root, tmp_path / "o.beton", num_workers=0, progress=False, follow_links=True)
    assert report.num_samples == 4 and not report.skipped


def test_a_folder_link_to_the_root_is_never_followed(tmp_path):
    root = folder_with(tmp_path, lambda root: os.symlink(root, root / "a" / "everything"))
    for follow_links in (False, True):
        with pytest.raises(ConversionError, match="everything: symbolic link to the image folder or above it"):
            beton.convert.imagefolder(root, tmp_path / "o.beton", num_workers=0, progress=False,
                                      follow_links=follow_links)
    report = beton.convert.imagefolder(root, tmp_path / "o.beton", num_workers=0, progress=False, on_error="skip")
    with beton.Reader(tmp_path / "o.beton") as reader:
        labels = [reader[i][1] for i in range(reader.num_samples)] if hasattr(reader, "num_samples") else None
    assert report.num_samples == 2, report.summary()  # b's image is not relabelled as a's
    assert labels in (None, [0, 1])


def test_a_class_folder_linked_from_outside_needs_follow_links(tmp_path):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "x.png").write_bytes(encoded("PNG"))
    root = folder_with(tmp_path, lambda root: os.symlink(outside, root / "c"))
    with pytest.raises(ConversionError, match="c: symbolic link out of the image folder"):
        beton.convert.imagefolder(root, tmp_path / "o.beton", num_workers=0, progress=False)
    report = beton.convert.imagefolder(root, tmp_path / "o.beton", num_workers=0, progress=False, follow_links=True)
    assert report.num_samples == 3 and report.metadata["classes"]["label"] == ["a", "b", "c"]


def test_a_file_larger_than_max_file_bytes_is_not_read(tmp_path):
    def make(root):
        with open(root / "a" / "sparse.png", "wb") as file:  # 3 GiB, sparse: nothing on disk
            file.truncate(3 << 30)
    root = folder_with(tmp_path, make)
    with pytest.raises(ConversionError, match=r"sparse.png: is 3221225472 bytes, more than max_file_bytes=268435456"):
        beton.convert.imagefolder(root, tmp_path / "o.beton", num_workers=0, progress=False)
    folder = ImageFolder(root, max_file_bytes=100)  # a file that grew past the cap after listing
    assert folder.unreadable and all("max_file_bytes=100" in reason for _, reason in folder.unreadable)
    folder = ImageFolder(root, max_file_bytes=None)
    small = ImageFolder(root, max_file_bytes=1000)
    small.samples = folder.samples[:1]
    with open(small.samples[0][0], "ab") as file:
        file.write(bytes(1000))
    with pytest.raises(OSError, match="more than max_file_bytes=1000"):
        small[0]


# --- WebDataset: members read only within the cap ------------------------------------------------------------

class _Zeros(io.RawIOBase):
    """``size`` zero bytes, produced as read (a 2 GiB member without 2 GiB anywhere)."""

    def __init__(self, size: int) -> None:
        self.left = size

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        count = min(len(buffer), self.left)
        buffer[:count] = bytes(count)
        self.left -= count
        return count


def shard_with_a_huge_member(path, size: int) -> None:
    with tarfile.open(path, "w:gz", compresslevel=1) as archive:
        for key, members in (("s0", {"png": encoded("PNG"), "cls": b"0"}),
                             ("s1", {"png": None, "cls": b"1"}),
                             ("s2", {"png": encoded("PNG"), "cls": b"2"})):
            for extension, data in members.items():
                info = tarfile.TarInfo(f"{key}.{extension}")
                info.size = size if data is None else len(data)
                archive.addfile(info, _Zeros(size) if data is None else io.BytesIO(data))


WEBDATASET_PEAK = GROWTH + textwrap.dedent("""
    import sys
    import numpy as np, simplejpeg
    import beton.convert
    from beton.codecs.jpeg_restarts import with_restart_markers
    # numba's runtime and the compiled JPEG transcode load before the peak is reset: the peak is the conversion's
    with_restart_markers(simplejpeg.encode_jpeg(np.zeros((16, 32, 3), np.uint8)))
    before = reset_peak()
    report = beton.convert.webdataset(sys.argv[1], sys.argv[2], num_workers=0, progress=False, on_error="skip",
                                      max_file_bytes=int(sys.argv[3]))
    print((status("VmHWM") - before) // 1024)
    print(report.num_samples, [item.reason for item in report.skipped])
""")


def test_a_compressed_member_larger_than_the_cap_is_skipped_unread(tmp_path):
    shard = tmp_path / "s.tar.gz"
    shard_with_a_huge_member(shard, 256 << 20)  # 256 MiB of zeros: 250 kB compressed
    assert os.path.getsize(shard) < 2 << 20
    def run(cap: int) -> tuple[int, str]:
        result = subprocess.run([sys.executable, "-c", WEBDATASET_PEAK, str(shard), str(tmp_path / "o.beton"),
                                 str(cap)], capture_output=True, text=True, timeout=300)
        grown, outcome = result.stdout.split("\n", 1)
        return int(grown), outcome.strip()
    grown, outcome = run(64 << 20)
    assert outcome == ("2 [\"member 's1.png' is 268435456 bytes, more than max_file_bytes=67108864 "
                       "(--max-file-bytes); it was not read\"]"), outcome
    assert grown < 40, grown  # MiB; read, the member alone would be 256
    with pytest.raises(ConversionError, match=r"s.tar.gz s1: member 's1.png' is 268435456 bytes"):
        beton.convert.webdataset(str(shard), tmp_path / "o.beton", num_workers=0, progress=False,
                                 max_file_bytes=1 << 20)


def test_an_oversized_tar_header_is_refused_before_tarfile_reads_it(tmp_path):
    shard = tmp_path / "pax.tar"
    with tarfile.open(shard, "w", format=tarfile.PAX_FORMAT) as archive:
        for key in ("s0", "s1"):
            info = tarfile.TarInfo(f"{key}.cls")
            info.size = 1
            archive.addfile(info, io.BytesIO(b"0"))
        info = tarfile.TarInfo("s2.cls")
        info.pax_headers = {"comment": "x" * (2 << 20)}  # 2 MiB of pax header data
        info.size = 1
        archive.addfile(info, io.BytesIO(b"1"))
    report = beton.convert.webdataset(str(shard), tmp_path / "o.beton", num_workers=0, progress=False,
                                      on_error="skip")
    assert report.num_samples == 1
    assert "header data, more than 1048576" in report.skipped[0].reason, report.skipped


# --- Parquet: values must fit the dtype a Hugging Face feature declares ---------------------------------------

def parquet_with(tmp_path, column, feature) -> str:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    table = pa.table({"x": column}).replace_schema_metadata(
        {b"huggingface": json.dumps({"info": {"features": {"x": feature}}}).encode()})
    path = str(tmp_path / "t.parquet")
    pq.write_table(table, path)
    return path


@pytest.mark.parametrize("dtype, values, bad_row, bad", [
    ("uint8", [[[1, 2]], [[258, 3]]], 1, "258"),
    ("uint8", [[[1, 2]], [[-1, 3]]], 1, "-1"),
    ("bool", [[[0, 1]], [[1, 2]]], 1, "2"),
    ("int32", [[[1.0, 2.0]], [[1.5, 3.0]]], 1, "1.5"),
    ("int8", [[[1.0, float("nan")]]], 0, "nan"),
])
def test_array_values_that_do_not_fit_the_declared_dtype_are_bad_rows(tmp_path, dtype, values, bad_row, bad):
    pa = pytest.importorskip("pyarrow")
    leaf = pa.float64() if isinstance(values[0][0][0], float) else pa.int32()
    path = parquet_with(tmp_path, pa.array(values, pa.list_(pa.list_(leaf))),
                        {"_type": "Array2D", "shape": [None, 2], "dtype": dtype})
    with pytest.raises(ConversionError, match=rf"t.parquet row {bad_row}: column 'x': item \[0\]\[\d\] holds {bad}, "
                                              f"which the declared dtype {dtype} cannot hold"):
        beton.convert.parquet(path, tmp_path / "o.beton", num_workers=0, progress=False)
    if bad_row:  # the rows that fit are stored in the declared dtype, exactly
        report = beton.convert.parquet(path, tmp_path / "o.beton", num_workers=0, progress=False, on_error="skip")
        assert report.num_samples == 1
        with beton.Reader(tmp_path / "o.beton") as reader:
            stored = reader[0][0]
        assert stored.dtype == np.dtype(dtype) and stored.tolist() == [[int(v) for v in values[0][0]]]


@pytest.mark.parametrize("dtype, arrow, values, bad", [
    ("uint8", "int32", [1, 258, 3], "258"), ("bool", "int32", [0, 2, 1], "2"), ("int8", "int64", [1, -129, 2], "-129"),
    ("float16", "float64", [1.0, 1e6, 2.0], "1000000.0"),
])
def test_values_that_do_not_fit_a_declared_value_dtype_are_bad_rows(tmp_path, dtype, arrow, values, bad):
    pa = pytest.importorskip("pyarrow")
    path = parquet_with(tmp_path, pa.array(values, getattr(pa, arrow)()), {"_type": "Value", "dtype": dtype})
    with pytest.raises(ConversionError, match=f"t.parquet row 1: column 'x': holds {bad}, which the declared dtype "
                                              f"{dtype} cannot hold"):
        beton.convert.parquet(path, tmp_path / "o.beton", num_workers=0, progress=False)


def test_every_refusal_is_a_beton_error():
    assert issubclass(ConversionError, BetonError) and issubclass(EncodeError, BetonError)
