"""The `beton` command: what each command prints and returns, run in this process (tests/cli_runs.py); what only a
separate process shows (``python -m beton``, the one-line error message, a kill mid-write) in a subprocess, as users
run it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import numpy as np
import pytest

import beton

from cli_runs import run_cli
from conftest import mixed_sample
from processes import alive, wait_for


def run(*arguments):
    """``beton ARGUMENTS`` in a subprocess, as a user runs it."""
    return subprocess.run([sys.executable, "-m", "beton.tools.cli", *map(str, arguments)], capture_output=True,
                          text=True, timeout=120)


def test_info_describes_fields_and_arguments(mixed_file):
    result = run_cli("info", mixed_file)
    assert result.returncode == 0, result.stderr
    assert "samples:     60" in result.stdout
    assert f"({mixed_file.stat().st_size} bytes)" in result.stdout
    # payload sizes from the samples themselves: 3x4 float32 arrays, and the blobs mixed_sample makes
    assert ("'arr': beton.NDArrayField {\"dtype\": \"<f4\", \"shape\": [3, 4]}\n"
            f"      payload bytes: mean 48.0, min 48, max 48, total {60 * 48 / 1024:.1f} KiB\n") in result.stdout
    blobs = [len(mixed_sample(i)[3]) for i in range(60)]
    assert ("'blob': beton.BytesField {}\n"
            f"      payload bytes: mean {np.mean(blobs):.1f}, min {min(blobs)}, max {max(blobs)}, "
            f"total {sum(blobs) / 1024:.1f} KiB\n") in result.stdout


def test_verify_ok_and_corrupt(mixed_file, tmp_path):
    assert run_cli("verify", mixed_file).returncode == 0
    data = bytearray(mixed_file.read_bytes())
    data[5000] ^= 1
    bad = tmp_path / "bad.beton"
    bad.write_bytes(bytes(data))
    result = run_cli("verify", bad)
    assert result.returncode == 1
    assert "page 0" in result.stderr and "samples 0..11 (12 samples)" in result.stderr


def test_bad_input(tmp_path):
    assert run_cli("info", tmp_path / "missing.beton").returncode == 1
    assert run_cli("frobnicate").returncode == 2
    assert run_cli().returncode == 2
    not_beton = tmp_path / "x.txt"
    not_beton.write_text("hello" * 1000)
    result = run_cli("info", not_beton)
    assert result.returncode == 1 and "not a beton file" in result.stderr


def test_every_remote_setting_has_a_flag_on_every_command_that_reads_urls(capsys):
    import dataclasses

    from beton import RemoteOptions
    from beton.tools.cli import build_parser

    for command in ("info", "verify", "index", "merge"):  # each command's help, in this process
        with pytest.raises(SystemExit):
            build_parser().parse_args([command, "--help"])
        text = capsys.readouterr().out
        missing = [field.name for field in dataclasses.fields(RemoteOptions)
                   if f"--{field.name.replace('_', '-')}" not in text]
        assert not missing, (command, missing)


def test_remote_flags_that_remote_options_refuses_are_bad_arguments(mixed_file):
    result = run_cli("verify", mixed_file, "--timeout", "0")  # RemoteOptions: timeout must be positive
    assert result.returncode == 2 and "timeout must be positive" in result.stderr
    assert run_cli("verify", mixed_file, "--storage-options", "[1]").returncode == 2  # not a JSON object
    assert run_cli("verify", mixed_file, "--cache-limit", "1GiB").returncode == 0  # a local file ignores them


def make_image_folder(root, classes=("cat", "dog"), per_class=3):
    import cv2
    import simplejpeg

    from beton.tools.sample_photos import photo_crop

    for label, name in enumerate(classes):
        folder = root / name
        folder.mkdir(parents=True)
        for k in range(per_class):
            image = photo_crop(label * 10 + k, 40 + k, 50)
            if k == 0:  # one PNG per class: decoded and re-encoded
                cv2.imwrite(str(folder / f"{k}.png"), cv2.cvtColor(image, cv2.COLOR_RGB2BGR))
            else:
                (folder / f"{k}.jpg").write_bytes(simplejpeg.encode_jpeg(image, quality=90))
        (folder / "notes.txt").write_text("not an image")
    return root


def test_convert_imagefolder(tmp_path):
    import beton

    source = make_image_folder(tmp_path / "train")
    output = tmp_path / "train.beton"
    result = run_cli("convert", "imagefolder", source, output, "--max-resolution", "48", "--jpeg-quality", "80",
                 "--num-workers", "1")
    assert result.returncode == 0, result.stderr
    assert "classes of 'label': 0=cat, 1=dog" in result.stdout
    with beton.Reader(output) as reader:
        assert len(reader) == 6
        assert [reader[i][1] for i in range(6)] == [0, 0, 0, 1, 1, 1]
        assert all(max(reader[i][0].shape[:2]) <= 50 for i in range(6))
        assert reader.fields["image"].max_resolution == 48 and reader.fields["image"].jpeg_quality == 80
    info = run_cli("info", output)
    assert "longer side histogram" in info.stdout and "stored as 100% jpg" in info.stdout


def test_convert_numpy_and_torch(tmp_path):
    import numpy as np
    import torch

    import beton

    arrays = {"x": np.arange(24, dtype=np.float32).reshape(6, 2, 2), "y": np.arange(6), "w": np.linspace(0, 1, 6)}
    np.savez(tmp_path / "data.npz", **arrays)
    assert run_cli("convert", "numpy", tmp_path / "data.npz", tmp_path / "np.beton").returncode == 0
    with beton.Reader(tmp_path / "np.beton") as reader:
        x, y, w = reader[4]
        np.testing.assert_array_equal(x, arrays["x"][4])
        assert (y, w) == (4, arrays["w"][4])
    torch.save({"t": torch.ones(5, 3, dtype=torch.bfloat16), "label": torch.arange(5)}, tmp_path / "data.pt")
    assert run_cli("convert", "torch", tmp_path / "data.pt", tmp_path / "t.beton").returncode == 0
    with beton.Reader(tmp_path / "t.beton") as reader:
        tensor, label = reader[2]
        assert tensor.dtype == torch.bfloat16 and tensor.shape == (3,) and label == 2


def test_convert_prints_its_summary_as_lines(tmp_path):
    np.savez(tmp_path / "data.npz", x=np.zeros((4, 2), dtype=np.float32), y=np.arange(4))
    result = run_cli("convert", "numpy", tmp_path / "data.npz", tmp_path / "np.beton", "--no-progress")
    assert result.returncode == 0, result.stderr
    assert "\\n" not in result.stdout  # the summary's line breaks are printed, not escaped
    lines = result.stdout.splitlines()
    assert lines[0].startswith("wrote 4 samples") and lines[1].startswith("fields: x ")


def test_convert_escapes_each_line_of_its_summary(tmp_path):
    source = make_image_folder(tmp_path / "train", per_class=1)
    (source / "cat" / "evil\x1b[2J.jpg").write_bytes(b"\xff\xd8 not a JPEG")
    result = run_cli("convert", "imagefolder", source, tmp_path / "o.beton", "--on-error", "skip", "--num-workers", "0",
                 "--no-progress")
    assert result.returncode == 0, result.stderr
    assert "\x1b" not in result.stdout and "evil\\x1b[2J.jpg" in result.stdout
    assert "\\n" not in result.stdout and "skipped:" in result.stdout.splitlines()


def test_convert_bad_arguments(tmp_path):
    missing = run_cli("convert", "imagefolder", tmp_path / "nope", tmp_path / "o.beton")
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    assert run_cli("convert", "imagefolder", tmp_path, tmp_path / "o.beton", "--write-mode", "png").returncode == 2
    assert run_cli("convert", "imagefolder", tmp_path, tmp_path / "o.beton", "--jpeg-quality", "0").returncode == 2
    assert run_cli("convert", "frobnicate", tmp_path, tmp_path / "o.beton").returncode == 2
    empty = run_cli("convert", "imagefolder", tmp_path, tmp_path / "o.beton")  # exists, but no class folders
    assert empty.returncode == 1 and "no class folders" in empty.stderr
    uneven = tmp_path / "uneven.npz"
    import numpy as np

    np.savez(uneven, a=np.zeros(3), b=np.zeros(4))
    result = run_cli("convert", "numpy", uneven, tmp_path / "u.beton")
    assert result.returncode == 1 and "same length" in result.stderr
    assert not (tmp_path / "u.beton").exists()


def test_bench_rejects_bad_arguments():
    assert run_cli("bench", "--frobnicate").returncode == 2


def test_bench_quick_runs_with_only_beton_installed(tmp_path):
    """The whole suite in quick mode; contenders that are not installed are skipped with their reason."""
    import json

    result = subprocess.run([sys.executable, "-m", "beton.tools.cli", "bench", "--quick", "--output", str(tmp_path)],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads((tmp_path / "results.json").read_text())
    scenarios = report["scenarios"]
    assert len(scenarios) == 7
    first = scenarios["a. RRC-160, ~256 px JPEGs"]
    limits = {"whole": "decode limit (whole image)", "crop rows": "decode limit (crop rows, no restart markers)",
              "crop": "decode limit (crop only)", "crop+resize": "decode (crop only) + resize limit"}
    assert first["images_per_s"]["beton"] > 0 and all(first["images_per_s"][name] > 0 for name in limits.values())
    assert "DALI (CPU)" in first["skipped"] or "DALI (CPU)" in first["images_per_s"]
    for rows, name in limits.items():
        beton_rounds, limit_rounds = first["rounds"]["beton"], first["rounds"][name]
        assert len(beton_rounds) == len(limit_rounds) == 2  # quick mode: 2 rounds, every one kept
        ratios = sorted(b / l for b, l in zip(beton_rounds, limit_rounds))
        assert abs(first["beton_over"][name] - (ratios[0] + ratios[1]) / 2) < 0.02  # paired, not of medians
        assert first["beton_share"][rows] == first["beton_over"][name]
        if rows != "crop+resize":
            work = sorted(w / l for w, l in zip(first["rounds"][limits["crop+resize"]], limit_rounds))
            assert abs(first["work_share"][rows] - (work[0] + work[1]) / 2) < 0.02
    assert set(first["work_share"]) == {"whole", "crop rows", "crop"}
    markdown = (tmp_path / "results.md").read_text()
    assert markdown.count("| beton |") == 4
    assert (f"- a. RRC-160, ~256 px JPEGs: {first['beton_share']['whole']:.2f} of the whole-image limit, "
            f"{first['beton_share']['crop rows']:.2f} of the crop-rows limit (no restart markers), "
            f"{first['beton_share']['crop']:.2f} of the crop-only limit, "
            f"{first['beton_share']['crop+resize']:.2f} of the crop-only + resize limit") in markdown
    assert (f"- a. RRC-160, ~256 px JPEGs: {first['work_share']['whole']:.2f} of the whole-image limit, "
            f"{first['work_share']['crop rows']:.2f} of the crop-rows limit, "
            f"{first['work_share']['crop']:.2f} of the crop-only limit") in markdown


def test_version_and_python_m_beton():
    import beton

    for command in ([sys.executable, "-m", "beton", "--version"], [sys.executable, "-m", "beton.tools.cli", "--version"]):
        result = subprocess.run(command, capture_output=True, text=True, timeout=120)
        assert result.returncode == 0 and result.stdout.strip() == f"beton {beton.__version__}"


def test_errors_are_one_line_and_debug_adds_the_traceback(mixed_file, tmp_path):
    bad = tmp_path / "bad.beton"
    data = bytearray(mixed_file.read_bytes())
    data[5000] ^= 1
    bad.write_bytes(bytes(data))
    plain = run("verify", bad)  # in a process of its own: nothing else (a warning, a log line) reaches stderr
    assert plain.returncode == 1 and len(plain.stderr.strip().splitlines()) == 1
    assert plain.stderr.startswith("beton verify: error: ") and "Traceback" not in plain.stderr
    debug = run_cli("--debug", "verify", bad)
    assert debug.returncode == 1 and "Traceback (most recent call last)" in debug.stderr
    assert debug.stderr.strip().splitlines()[-1] == plain.stderr.strip()


def test_output_to_a_reader_that_left_ends_quietly(mixed_file):
    """`beton info ... | head`: the reader closes the pipe; the command stops without an error message."""
    reader, writer = os.pipe()
    os.close(reader)  # gone before the first line: every write fails with EPIPE
    with os.fdopen(writer, "w") as stdout:
        result = subprocess.run([sys.executable, "-m", "beton.tools.cli", "info", str(mixed_file)], stdout=stdout,
                                stderr=subprocess.PIPE, text=True, timeout=120)
    assert (result.returncode, result.stderr) == (141, "")


def test_info_escapes_control_characters_from_the_file(tmp_path):
    import dataclasses

    from beton.fields import Encoded, Field

    from conftest import write

    hostile = "\x1b]0;pwned\x07\x1b[2J\u202ename"

    @dataclasses.dataclass(frozen=True)
    class Hostile(Field):  # stored under a type name full of terminal escapes, as a crafted file could be
        type_name = "evil." + hostile

        def encode(self, value, context):
            return Encoded()

        def to_python(self, metadata, payload):
            return None

    path = write(tmp_path / "t.beton", {hostile: Hostile()}, [(None,)])
    result = run_cli("info", path)
    assert result.returncode == 0, result.stderr
    assert "\x1b" not in result.stdout and "\x07" not in result.stdout and "\u202e" not in result.stdout
    assert "evil.\\x1b]0;pwned\\x07\\x1b[2J\\u202ename" in result.stdout


# The `beton convert` process of the next test, with encoding slowed down in its workers (each records its pid), so
# that the kill lands mid-write. Everything else is the command as users run it.
SLOW_CONVERT = """
import os, pathlib, sys, time
import beton.storage.writer as writer
from beton.tools.cli import main

marks, encode = pathlib.Path(sys.argv[1]), writer.encode_chunk

def slow_encode(spec, dataset, chunk):
    (marks / str(os.getpid())).touch()
    time.sleep(0.01 * len(chunk))
    return encode(spec, dataset, chunk)

writer.encode_chunk = slow_encode
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="checks processes through /proc")
def test_convert_killed_by_sigkill_leaves_no_worker_processes(tmp_path):
    np.savez(tmp_path / "data.npz", y=np.arange(2000))
    marks = tmp_path / "marks"
    marks.mkdir()
    command = [sys.executable, "-c", SLOW_CONVERT, marks, "convert", "numpy", tmp_path / "data.npz",
               tmp_path / "data.beton", "--num-workers", "2", "--no-progress"]
    with open(tmp_path / "stderr", "w+") as stderr:  # a file, not a pipe: orphans would hold a pipe open
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr)
        workers = []
        try:
            assert wait_for(lambda: len(os.listdir(marks)) == 2 or process.poll() is not None, 60)
            assert process.poll() is None, (stderr.seek(0), stderr.read())
            workers = [int(name) for name in os.listdir(marks)]
            process.kill()  # SIGKILL, as the OOM killer sends
            process.wait()
            assert wait_for(lambda: not any(alive(pid) for pid in workers), 10), "orphaned worker processes"
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
            for pid in workers:  # this test's own processes, if a check failed
                if alive(pid):
                    os.kill(pid, signal.SIGKILL)


def test_info_and_verify_take_globs_and_manifests(tmp_path, capsys):
    from beton import Reader
    from beton.dataset.shards import index
    from beton.tools.cli import main
    from conftest import MIXED_FIELDS, write

    paths = [write(str(tmp_path / f"part-{k}.beton"), MIXED_FIELDS, [mixed_sample(i) for i in range(10 * k, 10 * k + 10)],
                   page_size=1024) for k in range(3)]
    index(tmp_path / "all.json", str(tmp_path / "part-*.beton"))
    for source in (str(tmp_path / "part-*.beton"), str(tmp_path / "all.json")):
        assert main(["info", source]) == 0
        out = capsys.readouterr().out
        assert "shards:      3" in out and "samples:     30" in out and "'blob': beton.BytesField {}" in out
        assert all(f"{k}: {path}: 10 samples" in out for k, path in enumerate(paths))
        assert main(["verify", source]) == 0
        out = capsys.readouterr().out
        assert out.count("OK: shard") == 3 and "OK: 3 shards, 30 samples" in out
    with Reader(paths[1]) as reader:
        heap_offset = reader.heap_offset
    data = bytearray(open(paths[1], "rb").read())
    data[heap_offset + 10] ^= 1  # a damaged page: the header still matches the manifest
    open(paths[1], "wb").write(bytes(data))
    assert main(["verify", str(tmp_path / "all.json")]) == 1
    captured = capsys.readouterr()
    assert "OK: shard 0" in captured.out and "OK: shard 2" in captured.out  # the others are still checked
    assert f"FAILED: shard 1: file {paths[1]!r}" in captured.out and "page 0" in captured.out
    assert "1 of 3 shards failed (shard 1)" in captured.err


def test_convert_writes_to_a_url_with_the_remote_flags(tmp_path, capsys):
    import json

    from beton.tools.cli import main
    from processes import moto_s3

    np.savez(tmp_path / "data.npz", y=np.arange(50))
    with moto_s3() as options:
        import fsspec

        fsspec.filesystem("s3", skip_instance_cache=True, **options).mkdir("converted")
        flags = ["--storage-options", json.dumps(options), "--retries", "1"]
        assert main(["convert", "numpy", str(tmp_path / "data.npz"), "s3://converted/data.beton", "--no-progress",
                     "--num-workers", "0", *flags]) == 0
        assert "50 samples" in capsys.readouterr().out
        assert main(["verify", "s3://converted/data.beton", *flags]) == 0
        assert "OK: s3://converted/data.beton: 50 samples" in capsys.readouterr().out


def test_verify_of_a_manifest_checks_its_tables_file_as_a_loader_opening_it_does(tmp_path):
    """A Loader refuses a manifest whose tables file is not the one it pins, and a shard whose tables differ from
    the tables file's: `beton verify` of the manifest must fail there too, not say OK to every shard."""
    import shutil

    from beton import Loader
    from beton.dataset.shards import index
    from beton.errors import BetonError
    from conftest import MIXED_FIELDS, mixed_sample, write
    from forgery import forge_keeping_crc32

    parts = [str(write(tmp_path / f"part-{k}.beton", MIXED_FIELDS, [mixed_sample(i) for i in range(6)])) for k in range(2)]
    manifest, other = tmp_path / "all.json", tmp_path / "other.json"
    index(manifest, parts)
    result = run_cli("verify", manifest)
    assert result.returncode == 0 and "OK: the tables file" in result.stdout, result.stdout + result.stderr

    index(other, parts[:1])  # another index's tables file where this one's was: the manifest pins another
    shutil.copyfile(tmp_path / "all.tables", tmp_path / "kept.tables")
    shutil.copyfile(tmp_path / "other.tables", tmp_path / "all.tables")
    with pytest.raises(BetonError, match="tables file"):
        Loader(manifest, batch_size=2, num_workers=0)
    result = run_cli("verify", manifest)
    assert result.returncode == 1
    assert "FAILED: the tables file: file" in result.stdout and "OK: shard 1" in result.stdout
    assert f"the tables file {tmp_path / 'all.tables'} failed" in result.stderr

    shutil.copyfile(tmp_path / "kept.tables", tmp_path / "all.tables")
    with beton.Reader(parts[1]) as reader:
        table = int(reader.header["data_table"]["offset"])
        size = int(reader.header["data_table"]["size"])
    data = bytearray(open(parts[1], "rb").read())  # sample 0's label changed, its float keeps the CRC32
    forge_keeping_crc32(data, table, table + size, {table: (99).to_bytes(8, "little")}, table + 8)
    open(parts[1], "wb").write(bytes(data))
    with Loader(manifest, batch_size=6, num_workers=0, pipelines={"label": None}) as loader, \
            pytest.raises(BetonError, match="tables file"):
        list(loader)
    result = run_cli("verify", manifest)
    assert result.returncode == 1
    assert "OK: shard 0" in result.stdout and "FAILED: shard 1: file" in result.stdout
    assert "content digest of the data table" in result.stdout and "1 of 2 shards failed (shard 1)" in result.stderr
