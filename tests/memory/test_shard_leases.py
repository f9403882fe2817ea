"""The OS cache over several files holds a shard's read lease while it copies out of the shard's map: a truncation
attempted meanwhile waits for the copy, and the Loader raises a FormatError naming the shard, never SIGBUS."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

from beton.fields import IntField, NDArrayField

from conftest import TESTS, write

FIELDS = {"blob": NDArrayField(np.uint8, (4096,)), "label": IntField()}
PER_SHARD = 16
PAGE = 1 << 16  # a shard's heap: one page

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="read leases (F_SETLEASE) and /proc/locks are Linux's")


def lease_lines(path: str) -> list[str]:
    inode = os.stat(path).st_ino
    with open("/proc/locks") as locks:
        return [line for line in locks if "LEASE" in line and f":{inode} " in line]


def truncate_while_copying(first: str, second: str) -> None:
    """Subprocess side: read both shards through the OS cache, content checked; when the second shard's first page
    is hashed (in its map, during the copy), a shell truncates that shard. Print what was seen (a SIGBUS would end
    this process instead)."""
    import beton.storage.digests as digests
    from beton import Loader
    from beton.errors import BetonError
    from beton.memory import OSCache

    honest, seen = digests.digest, {"breaking": False, "size_while_hashing": None, "error": None, "batches": 0}
    truncators = []

    def digest_then_truncate(data):
        if not truncators and _in_second(data):
            truncators.append(subprocess.Popen(["sh", "-c", f": > '{second}'"]))
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and not seen["breaking"]:
                seen["breaking"] = any("BREAKING" in line for line in lease_lines(second))
                time.sleep(0.01)
            seen["size_while_hashing"] = os.path.getsize(second)
        return honest(data)

    with open(second, "rb") as file:
        second_bytes = file.read()

    def _in_second(data):  # the second shard's heap page (not a table: the shards' blobs hold other values)
        return memoryview(data).nbytes == PAGE and bytes(data) in second_bytes

    digests.digest = digest_then_truncate
    try:
        with Loader([first, second], batch_size=4, num_workers=1, memory=OSCache(), verify_content=True) as loader:
            for _ in loader:
                seen["batches"] += 1
    except BetonError as error:
        seen["error"] = [type(error).__name__, str(error)]
    for truncator in truncators:
        truncator.wait(timeout=60)
    print(json.dumps(seen))


def test_a_shard_truncated_during_a_copy_waits_for_it_and_is_a_format_error(tmp_path):
    shards = [str(write(tmp_path / f"part-{k}.beton", FIELDS, [(np.full(4096, 16 * k + i, np.uint8), 16 * k + i)
                                                               for i in range(PER_SHARD)], page_size=PAGE))
              for k in range(2)]
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.dirname(__file__), str(TESTS),
                                                                os.environ.get("PYTHONPATH", "")])}
    process = subprocess.run(
        [sys.executable, "-c", "import sys, test_shard_leases; test_shard_leases.truncate_while_copying(*sys.argv[1:])",
         *shards], capture_output=True, text=True, env=environment, timeout=120)
    assert process.returncode == 0, f"the loader process died ({process.returncode}): {process.stderr[-2000:]}"
    seen = json.loads(process.stdout.strip().splitlines()[-1])
    assert seen["breaking"] and seen["size_while_hashing"] == os.path.getsize(shards[0]), seen  # it waited
    assert seen["error"] is not None and seen["error"][0] == "FormatError" and "part-1.beton" in seen["error"][1], seen
    assert os.path.getsize(shards[1]) == 0  # the truncation went through once the copy was over


def test_shards_that_get_no_lease_are_still_read_and_leases_end_with_each_copy(tmp_path):
    """A shard open for writing elsewhere gets no lease (nor would another user's file, or one on NFS): it is read
    with the per-batch checks only. No lease outlives the copy that took it."""
    from beton import Loader
    from beton.memory import OSCache

    shards = [str(write(tmp_path / f"part-{k}.beton", FIELDS, [(np.full(4096, i, np.uint8), i) for i in range(8)],
                        page_size=PAGE)) for k in range(2)]
    with open(shards[1], "r+b"):
        with Loader(shards, batch_size=4, num_workers=2, memory=OSCache()) as loader:
            assert sum(len(label) for _, label in loader) == 16
            assert not lease_lines(shards[0]) and not lease_lines(shards[1])


def test_a_lease_granted_once_and_refused_later_means_the_file_is_being_changed(tmp_path):
    """Once a copy had the lease, a later copy that cannot have it (the file is open for writing) raises a
    FormatError naming the file rather than reading the map unprotected, on the descriptor that had it and on one
    opened since (a shard closed and opened again); another file is another matter."""
    from beton.errors import FormatError
    from beton.memory.file_lease import CopyLeases

    path, other = tmp_path / "shard.beton", tmp_path / "other.beton"
    path.write_bytes(b"x" * 4096)
    other.write_bytes(b"y" * 4096)
    leases, checks = CopyLeases(), []
    fd = os.open(path, os.O_RDONLY)
    try:
        with leases.copying(fd, str(path), lambda: checks.append(1)) as held:
            assert held and lease_lines(str(path))
        assert not lease_lines(str(path)) and checks == [1]  # let go once the copy is over
    finally:
        os.close(fd)
    with open(path, "r+b"):
        for _ in range(2):  # a new descriptor each time: the file is the same
            fd = os.open(path, os.O_RDONLY)
            try:
                with pytest.raises(FormatError, match="opened for writing") as caught:
                    with leases.copying(fd, str(path), lambda: checks.append(2)):
                        pass
            finally:
                os.close(fd)
            assert caught.value.path == str(path) and checks == [1]
        fd = os.open(other, os.O_RDONLY)  # may well get the number the shard's descriptor had
        try:
            with leases.copying(fd, str(other), lambda: None) as held:
                assert held
        finally:
            os.close(fd)


def test_a_shard_closed_and_opened_again_keeps_refusing_to_be_read_unprotected(tmp_path):
    """With more shards than the OS cache keeps open, each epoch closes the first shards and opens them again on
    new descriptors; a shard leased in the first epoch and open for writing in the second is being changed there
    too: a FormatError naming it, not a read of its map with no lease holding off a truncation."""
    from beton import Loader
    from beton.dataset.union import DEFAULT_OPEN_SHARDS
    from beton.errors import FormatError
    from beton.loader import OrderOption
    from beton.memory import OSCache

    first = str(write(tmp_path / "part-0.beton", FIELDS, [(np.full(4096, 1, np.uint8), 1)], page_size=PAGE))
    shards = [first] + [shutil.copyfile(first, tmp_path / f"part-{k}.beton") for k in range(1, DEFAULT_OPEN_SHARDS + 1)]
    with Loader(shards, batch_size=1, num_workers=1, order=OrderOption.SEQUENTIAL, memory=OSCache()) as loader:
        assert sum(len(label) for _, label in loader) == len(shards)  # shard 0 leased, closed at the end
        with open(first, "r+b"):
            with pytest.raises(FormatError, match="opened for writing") as caught:
                for _ in loader:
                    pass
    assert caught.value.path == first
