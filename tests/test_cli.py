"""The `beton` command, run as a user runs it: in a subprocess."""

from __future__ import annotations

import subprocess
import sys


def run(*arguments):
    return subprocess.run([sys.executable, "-m", "beton.cli", *map(str, arguments)], capture_output=True,
                          text=True, timeout=120)


def test_info_describes_fields_and_arguments(mixed_file):
    result = run("info", mixed_file)
    assert result.returncode == 0, result.stderr
    assert "samples:     60" in result.stdout
    assert "'arr': beton.NDArrayField {\"dtype\": \"<f4\", \"shape\": [3, 4]}" in result.stdout
    assert "payload bytes" in result.stdout


def test_verify_ok_and_corrupt(mixed_file, tmp_path):
    assert run("verify", mixed_file).returncode == 0
    data = bytearray(mixed_file.read_bytes())
    data[5000] ^= 1
    bad = tmp_path / "bad.beton"
    bad.write_bytes(bytes(data))
    result = run("verify", bad)
    assert result.returncode == 1
    assert "page 0" in result.stderr and "sample 0" in result.stderr


def test_bad_input(tmp_path):
    assert run("info", tmp_path / "missing.beton").returncode == 1
    assert run("frobnicate").returncode == 2
    assert run().returncode == 2
    not_beton = tmp_path / "x.txt"
    not_beton.write_text("hello" * 1000)
    result = run("info", not_beton)
    assert result.returncode == 1 and "not a beton file" in result.stderr
