"""A file truncated by another process while an OS-cache Loader reads its memory map: a FormatError naming the file,
never SIGBUS (the read lease of beton.memory.file_lease)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from beton import Loader
from beton.errors import BetonError
from beton.fields import IntField, NDArrayField
from beton.memory import OSCache

from conftest import TESTS, write

SIDE = 2048  # 4 MiB payloads: a batch's decoders read the map most of the time, so a truncation lands during reads
FIELDS = {"big": NDArrayField(np.uint8, (SIDE, SIDE)), "label": IntField()}
SAMPLES = 12
RUNS = 4


def read_while_truncated(path: str, delay: str) -> None:
    """Subprocess side: read epochs through the OS cache while another process truncates the file after ``delay``
    seconds; print what the loop saw (a SIGBUS would end this process instead)."""
    outcome = {"batches": 0, "error": None, "lease": None}
    truncator = None
    with Loader(path, batch_size=2, num_workers=2, memory=OSCache(), batches_ahead=2) as loader:
        outcome["lease"] = loader.memory.lease.held
        try:
            for _ in range(50):
                for big, label in loader:
                    outcome["batches"] += 1
                    if truncator is None:
                        truncator = subprocess.Popen([sys.executable, "-c", f"import os, time; time.sleep({delay});"
                                                      f"os.truncate({path!r}, 8192)"])
        except BetonError as error:
            outcome["error"] = [type(error).__name__, str(error)]
    truncator.wait(timeout=60)
    print(json.dumps(outcome))


@pytest.fixture(scope="module")
def big_file(tmp_path_factory):
    return write(tmp_path_factory.mktemp("lease") / "big.beton", FIELDS,
                 [(np.full((SIDE, SIDE), i, np.uint8), i) for i in range(SAMPLES)], page_size=1 << 22)


def test_a_truncation_under_a_reading_loader_is_a_format_error_never_sigbus(big_file, tmp_path):
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.dirname(__file__), str(TESTS),
                                                                os.environ.get("PYTHONPATH", "")])}
    runs = []
    for run in range(RUNS):
        copy = tmp_path / f"run{run}.beton"
        copy.write_bytes(big_file.read_bytes())
        delay = f"{0.05 + 0.1 * run:.2f}"  # a spread of moments, during reads and between them
        runs.append(subprocess.Popen(
            [sys.executable, "-c", "import sys, test_file_lease; test_file_lease.read_while_truncated(*sys.argv[1:])",
             str(copy), delay], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment))
        time.sleep(0.1)
    for run, process in enumerate(runs):
        stdout, stderr = process.communicate(timeout=300)
        assert process.returncode == 0, f"run {run}: the loader process died ({process.returncode}): {stderr[-2000:]}"
        outcome = json.loads(stdout.strip().splitlines()[-1])
        assert outcome["lease"] is True
        assert outcome["error"] is not None and outcome["error"][0] == "FormatError", outcome
        assert f"run{run}.beton" in outcome["error"][1]
        assert Path(tmp_path / f"run{run}.beton").stat().st_size == 8192  # the truncation went through


def test_a_loader_that_gets_no_lease_still_reads(big_file, tmp_path):
    """A file open for writing elsewhere gets no lease (nor would another user's file, or one on NFS): the OS cache
    reads it as before, with its per-batch checks."""
    with open(big_file, "r+b"):
        with Loader(big_file, batch_size=4, num_workers=1, memory=OSCache()) as loader:
            assert loader.memory.lease.held is False
            assert sum(len(label) for _, label in loader) == SAMPLES
    with Loader(big_file, batch_size=4, num_workers=1, memory=OSCache()) as loader:
        assert loader.memory.lease.held is True
        assert [int(label) for _, labels in loader for label in labels] == list(range(SAMPLES))
