"""A file truncated by another process while an OS-cache Loader reads its memory map: a FormatError naming the file,
never SIGBUS (the read lease of beton.memory.file_lease)."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import time
import types

import numpy as np
import pytest

from beton import Loader
from beton.errors import BetonError, FormatError
from beton.fields import IntField, NDArrayField
from beton.memory import OSCache, file_lease

from conftest import TESTS, write

SIDE = 2048  # 4 MiB payloads: a batch's decoders read the map most of the time, so a truncation lands during reads
FIELDS = {"big": NDArrayField(np.uint8, (SIDE, SIDE)), "label": IntField()}
SAMPLES = 12
RUNS = 4

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="read leases (F_SETLEASE) and /proc/locks are Linux's")


def read_while_truncated(*paths: str) -> None:
    """Subprocess side: for each file, read epochs through the OS cache while another process (a shell) truncates
    it, at a moment that differs from file to file; print what the loop saw (a SIGBUS would end this
    process instead)."""
    outcomes = []
    for run, path in enumerate(paths):
        outcome = {"batches": 0, "error": None, "lease": None}
        truncator = None
        with Loader(path, batch_size=2, num_workers=2, memory=OSCache(), batches_ahead=2) as loader:
            outcome["lease"] = loader.memory.lease.held
            try:
                for _ in range(50):
                    for big, label in loader:
                        outcome["batches"] += 1
                        if truncator is None:  # during reads and between them
                            # (coreutils' truncate opens without waiting, so it would fail on the lease instead)
                            truncator = subprocess.Popen(["sh", "-c", f"sleep {0.02 + 0.05 * run:.2f}; : > '{path}'"])
            except BetonError as error:
                outcome["error"] = [type(error).__name__, str(error)]
        truncator.wait(timeout=60)
        outcomes.append(outcome)
    print(json.dumps(outcomes))


@pytest.fixture(scope="module")
def big_file(tmp_path_factory):
    return write(tmp_path_factory.mktemp("lease") / "big.beton", FIELDS,
                 [(np.full((SIDE, SIDE), i, np.uint8), i) for i in range(SAMPLES)], page_size=1 << 22)


def test_a_truncation_under_a_reading_loader_is_a_format_error_never_sigbus(big_file, tmp_path):
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.dirname(__file__), str(TESTS),
                                                                os.environ.get("PYTHONPATH", "")])}
    copies = [tmp_path / f"run{run}.beton" for run in range(RUNS)]
    for copy in copies:
        copy.write_bytes(big_file.read_bytes())
    process = subprocess.run(
        [sys.executable, "-c", "import sys, test_file_lease; test_file_lease.read_while_truncated(*sys.argv[1:])",
         *map(str, copies)], capture_output=True, text=True, env=environment, timeout=300)
    assert process.returncode == 0, f"the loader process died ({process.returncode}): {process.stderr[-2000:]}"
    outcomes = json.loads(process.stdout.strip().splitlines()[-1])
    for copy, outcome in zip(copies, outcomes, strict=True):
        assert outcome["lease"] is True
        assert outcome["error"] is not None and outcome["error"][0] == "FormatError", outcome
        assert copy.name in outcome["error"][1]
        assert copy.stat().st_size == 0  # the truncation went through


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


def leases_on(path: str) -> list[str]:
    """This process's lines of /proc/locks for leases on ``path``'s inode."""
    inode = os.stat(path).st_ino
    with open("/proc/locks") as locks:
        return [line for line in locks if "LEASE" in line and f":{inode} " in line and f" {os.getpid()} " in line]


def test_closing_the_loader_lets_go_of_the_lease_while_views_of_the_map_live_on(big_file):
    """The map keeps a descriptor of its own, and views of it can outlive close(): the lease must not live on with
    them, or whoever writes the file next waits the whole lease-break time (45 s by default)."""
    loader = Loader(big_file, batch_size=2, num_workers=2, memory=OSCache())
    for _ in loader:
        pass
    view = np.frombuffer(loader.memory._memory, np.uint8)  # a view of the map, as a decoder's source holds one
    assert loader.memory.lease.held and leases_on(big_file)
    loader.close()
    assert not leases_on(big_file), "the lease outlived close()"
    del view


def test_a_lease_the_watcher_can_no_longer_ask_about_counts_as_lost(big_file, monkeypatch):
    """F_GETLEASE failing means the lease may be gone, and nothing then holds off a truncation: the next batch
    raises a FormatError naming the file, as when the lease breaks; the batches before it were read."""
    with Loader(big_file, batch_size=2, num_workers=1, memory=OSCache()) as loader:
        assert loader.memory.lease.held
        batches = iter(loader)
        next(batches)

        def failing(fd, command, *rest):
            if command == fcntl.F_GETLEASE:
                raise OSError(9, "Bad file descriptor")
            return fcntl.fcntl(fd, command, *rest)

        monkeypatch.setattr(file_lease, "fcntl", types.SimpleNamespace(**{**vars(fcntl), "fcntl": failing}))
        deadline = time.monotonic() + 10
        while not loader.memory.lease._broken and time.monotonic() < deadline:
            time.sleep(0.01)
        with pytest.raises(FormatError, match="lease could not be checked") as caught:
            for _ in batches:
                pass
        assert caught.value.path == str(big_file)
