"""Faults from outside: a full disk and SIGTERM during a write, a file changed under a running Loader, and the
permissions of written files."""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import beton
from beton import Loader, OrderOption
from beton.errors import BetonError, WriterError
from beton.fields import BytesField, IntField

from conftest import IMAGE_FIELDS, TESTS, ListDataset, small_image, write
from processes import alive, wait_for



def files_in(directory: Path) -> list[str]:
    return sorted(entry.name for entry in directory.iterdir())


def python_calling(function: str, *arguments: str) -> tuple[list[str], dict[str, str]]:
    """Command line and environment of a fresh Python that runs ``function(*arguments)`` of this module: a
    crash (SIGBUS) or a signal there ends that process, not the test run."""
    code = f"import sys, test_faults; test_faults.{function}(*sys.argv[1:])"
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.dirname(__file__), str(TESTS),
                                                                os.environ.get("PYTHONPATH", "")])}
    return [sys.executable, "-c", code, *arguments], environment


def run_in_subprocess(function: str, *arguments: str, timeout: float = 120) -> subprocess.CompletedProcess:
    command, environment = python_calling(function, *arguments)
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=environment)


# ---- permissions ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_written_files_get_the_mode_open_would_give(tmp_path, umask, mode):
    previous = os.umask(umask)
    try:
        path = write(tmp_path / "modes.beton", {"i": IntField()}, [(1,), (2,)])
    finally:
        os.umask(previous)
    assert os.stat(path).st_mode & 0o777 == mode


# ---- a full disk ------------------------------------------------------------------------------------------


class _FullDisk(io.FileIO):
    """A file whose writes fail with ENOSPC once ``room`` bytes have been written, as on a full disk."""

    room = 0

    def write(self, data) -> int:
        if self.room < len(data):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.room -= len(data)
        return super().write(data)


def _disk_with_room(monkeypatch, room: int) -> None:
    """Make the writer's file fail like a full disk after ``room`` bytes, at the lowest level: its buffer
    above is the real one, so closing it flushes and fails again, as it does on a real full disk."""
    real_fdopen = os.fdopen

    def fdopen(fd, mode="r", buffering=-1, *args, **kwargs):
        if mode != "wb":
            return real_fdopen(fd, mode, buffering, *args, **kwargs)
        raw = _FullDisk(fd, "wb")
        raw.room = room
        return io.BufferedWriter(raw, buffering if buffering > 0 else io.DEFAULT_BUFFER_SIZE)

    monkeypatch.setattr(os, "fdopen", fdopen)


BIG_FIELDS = {"blob": BytesField(), "i": IntField()}


def big_samples(count: int = 64, size: int = 64 * 1024) -> list[tuple]:
    return [(bytes([i % 251]) * size, i) for i in range(count)]  # 4 MiB by default


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_missing_folder_is_named(tmp_path, num_workers, monkeypatch):
    """"writing failed: No such file or directory" did not say which: the folder to write in is missing."""
    monkeypatch.chdir(tmp_path)
    for path, folder in ((tmp_path / "absent" / "data.beton", tmp_path / "absent"),
                         (Path("relative") / "data.beton", tmp_path / "relative")):
        with pytest.raises(WriterError, match=f"No such file or directory \\(the folder {folder} does not exist"):
            beton.DatasetWriter(path, {"i": IntField()}, num_workers=num_workers,
                                progress=False).from_indexed_dataset([(1,), (2,)])
    assert files_in(tmp_path) == []


def _old_target(directory: Path) -> tuple[Path, bytes]:
    path = write(directory / "data.beton", {"i": IntField()}, [(7,), (8,)])
    return path, path.read_bytes()


@pytest.mark.parametrize("where", ["add", "commit"])
def test_a_full_disk_gives_a_writer_error_and_leaves_nothing(tmp_path, monkeypatch, where):
    full_size = write(tmp_path / "full.beton", BIG_FIELDS, big_samples(), chunksize=8).stat().st_size
    os.unlink(tmp_path / "full.beton")
    path, before = _old_target(tmp_path)
    _disk_with_room(monkeypatch, 100_000 if where == "add" else full_size - 100)  # heap, or last table bytes
    with pytest.raises(WriterError, match="No space left on device.*full") as caught:
        write(path, BIG_FIELDS, big_samples(), chunksize=8)
    cause = caught.value.__cause__
    assert isinstance(cause, OSError) and cause.errno == errno.ENOSPC
    assert where in [frame.name for frame in traceback.extract_tb(cause.__traceback__)]  # filled up as intended
    assert caught.value.path == str(path) and str(path) in str(caught.value)
    assert files_in(tmp_path) == ["data.beton"]
    assert path.read_bytes() == before


@pytest.fixture
def small_disk(tmp_path):
    """A 2 MiB tmpfs mounted for the test (needs root, or CAP_SYS_ADMIN)."""
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    try:
        result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount_point)],
                                capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        pytest.skip("no mount command to make a small tmpfs; the injected-ENOSPC test covers the writer")
    if result.returncode != 0:
        pytest.skip(f"cannot mount a 2 MiB tmpfs (needs root or CAP_SYS_ADMIN): {result.stderr.strip()}; "
                    "the injected-ENOSPC test covers the writer")
    try:
        yield mount_point
    finally:
        if subprocess.run(["umount", str(mount_point)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(mount_point)], capture_output=True)


def free_bytes(directory: Path) -> int:
    status = os.statvfs(directory)
    return status.f_bavail * status.f_frsize


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_full_tmpfs_gives_a_writer_error_frees_the_space_and_keeps_the_old_file(small_disk, num_workers):
    path, before = _old_target(small_disk)
    free = free_bytes(small_disk)
    with pytest.raises(WriterError, match="No space left on device") as caught:
        write(path, BIG_FIELDS, big_samples(), chunksize=8, num_workers=num_workers)
    assert str(path) in str(caught.value)
    assert files_in(small_disk) == ["data.beton"]
    assert path.read_bytes() == before
    assert free_bytes(small_disk) == free  # the disk does not stay full
    write(path, BIG_FIELDS, big_samples(count=4), num_workers=num_workers)  # and has room for a smaller file
    assert len(beton.Reader(path)) == 4


# ---- SIGTERM during a write -------------------------------------------------------------------------------


class SlowDataset:
    """2,000 slow samples; records which processes read them, and says when the write is well under way."""

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def __len__(self) -> int:
        return 2000

    def __getitem__(self, index: int) -> tuple:
        Path(self.directory, "pids", str(os.getpid())).touch()
        if index == 40:
            Path(self.directory, "started").touch()
        time.sleep(0.01)
        return (index,)


def write_slowly(directory: str, num_workers: str, start_method: str = "fork", target: str = "") -> None:
    """Subprocess side of the signal tests: a long write with ``num_workers`` encoding processes, to ``target``
    (default: data.beton in ``directory``, where the dataset leaves its marks)."""
    signal.signal(signal.SIGHUP, signal.SIG_DFL)  # as in a terminal, also if the tests run under nohup
    Path(directory, "pids").mkdir()
    writer = beton.DatasetWriter(target or Path(directory, "data.beton"), {"i": IntField()},
                                 num_workers=int(num_workers), progress=False, start_method=start_method)
    writer.from_indexed_dataset(SlowDataset(directory), chunksize=10)


def worker_pids(directory: Path, parent: int) -> list[int]:
    return [int(name) for name in files_in(directory / "pids") if int(name) != parent]


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="checks processes through /proc")
@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_sigterm_or_sighup_during_a_write_cleans_up_then_ends_the_process_by_that_signal(tmp_path, num_workers,
                                                                                          signum):
    directory = tmp_path / "out"
    directory.mkdir()
    path, before = _old_target(directory)
    command, environment = python_calling("write_slowly", str(directory), str(num_workers))
    with open(tmp_path / "stderr", "w+") as stderr:  # a file, not a pipe: orphans would hold a pipe open
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr, env=environment)
        try:
            started = wait_for(lambda: (directory / "started").exists() or process.poll() is not None, 120)
            assert started and process.poll() is None, (stderr.seek(0), stderr.read())
            assert any(name.startswith("data.beton.tmp-") for name in files_in(directory))  # mid-write
            process.send_signal(signum)
            process.wait(timeout=60)
            stderr.seek(0)
            assert process.returncode == -signum, stderr.read()
            assert files_in(directory) == ["data.beton", "pids", "started"]
            assert path.read_bytes() == before
            workers = worker_pids(directory, process.pid)
            assert len(workers) == num_workers
            assert wait_for(lambda: not any(alive(pid) for pid in workers), 10), "orphaned worker processes"
        finally:
            if process.poll() is None:
                process.kill()
            for pid in worker_pids(directory, process.pid):  # this test's own processes, if a check failed
                if alive(pid):
                    os.kill(pid, signal.SIGKILL)


def start_slow_write(tmp_path: Path, marks: str, num_workers: int, start_method: str = "fork",
                     target: str = "") -> tuple[subprocess.Popen, list[int]]:
    """A subprocess running ``write_slowly``, once the write is under way in all of its workers; and their pids."""
    directory = tmp_path / marks
    directory.mkdir()
    command, environment = python_calling("write_slowly", str(directory), str(num_workers), start_method, target)
    with open(tmp_path / f"{marks}.stderr", "w+") as stderr:  # a file, not a pipe: orphans would hold a pipe open
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr, env=environment)
        under_way = wait_for(lambda: process.poll() is not None or (directory / "started").exists()
                             and len(worker_pids(directory, process.pid)) == num_workers, 60)
        if not under_way or process.poll() is not None:
            process.kill()
            stderr.seek(0)
            pytest.fail(f"the write did not get under way: {stderr.read()}")
    return process, worker_pids(directory, process.pid)


@contextlib.contextmanager
def reaped(processes: list[subprocess.Popen], directories: list[Path]) -> Iterator[None]:
    """Whatever a check says, end the processes a test started: the writers, then their workers (their pids)."""
    try:
        yield
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
            process.wait()
        writers = {process.pid for process in processes}
        for directory in directories:
            for pid in set(worker_pids(directory, -1)) - writers if (directory / "pids").exists() else []:
                if alive(pid):
                    os.kill(pid, signal.SIGKILL)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="checks processes through /proc")
@pytest.mark.parametrize("start_method", ["fork", "spawn", "forkserver"])
def test_workers_end_when_the_writing_process_is_killed(tmp_path, start_method):
    writer, workers = start_slow_write(tmp_path, "marks", 2, start_method)
    with reaped([writer], [tmp_path / "marks"]):
        assert len(workers) == 2 and all(alive(pid) for pid in workers)
        writer.kill()  # SIGKILL, as the OOM killer sends: nothing runs in the writer any more
        writer.wait()
        started = time.monotonic()
        assert wait_for(lambda: not any(alive(pid) for pid in workers), 10), "orphaned worker processes"
        print(f"{start_method}: both workers gone {time.monotonic() - started:.2f} s after the SIGKILL")


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="checks processes through /proc")
def test_a_later_write_removes_a_killed_writers_temporary_file_and_keeps_a_running_writers(tmp_path):
    output = tmp_path / "out"
    output.mkdir()
    target = output / "data.beton"
    killed, killed_workers = start_slow_write(tmp_path, "killed", 2, target=str(target))
    with reaped([killed], [tmp_path / "killed"]):
        killed.kill()
        killed.wait()
        assert wait_for(lambda: not any(alive(pid) for pid in killed_workers), 10), "orphaned worker processes"
    [stale] = files_in(output)
    assert stale.startswith(f"data.beton.tmp-{killed.pid}-")  # SIGKILL: nothing could remove it
    running, _ = start_slow_write(tmp_path, "running", 0, target=str(target))
    with reaped([running], [tmp_path / "running"]):
        [live] = set(files_in(output)) - {stale}
        assert live.startswith(f"data.beton.tmp-{running.pid}-")
        write(target, {"i": IntField()}, [(7,), (8,)])  # a third write to the same target, while one runs
        assert files_in(output) == sorted(["data.beton", live])  # the dead writer's file removed, the live one's not
        with beton.Reader(target) as reader:
            assert len(reader) == 2
        assert running.poll() is None
        running.send_signal(signal.SIGTERM)  # the running write still owns its file: its clean-up removes it
        assert running.wait(timeout=60) == -signal.SIGTERM
        assert files_in(output) == ["data.beton"]


def test_temporary_files_are_left_alone_unless_their_name_is_ours_and_nobody_locks_them(tmp_path):
    from beton.storage.file_builder import create_temporary, remove_stale_temporaries

    target = str(tmp_path / "data.beton")
    handle, live = create_temporary(target)  # locked while open
    try:
        dead = f"{target}.tmp-1-0123abcd"
        Path(dead).write_bytes(b"left by a killed writer")
        # an older beton's name (it took no lock), a longer name, another target's file
        others = [f"{target}.tmp-0123abcd", f"{target}.tmp-1-0123abcd.x", str(tmp_path / "other.beton.tmp-1-00")]
        for name in others:
            Path(name).write_bytes(b"")
        os.mkfifo(f"{target}.tmp-2-0123abcd")  # not a regular file: not opened for long, not removed
        assert remove_stale_temporaries(target) == [dead]
        assert sorted(files_in(tmp_path)) == sorted(os.path.basename(name) for name in
                                                    [live, *others, f"{target}.tmp-2-0123abcd"])
    finally:
        os.close(handle)
    # its descriptor closed, but named by this very process: never taken for a dead writer's (where flock is
    # emulated by POSIX locks, another thread of this process would get the lock of a live write at once)
    assert remove_stale_temporaries(target) == []
    orphan = live.replace(f".tmp-{os.getpid()}-", ".tmp-1-")
    os.rename(live, orphan)  # as a writer of another process would have left it
    assert remove_stale_temporaries(target) == [orphan]


def test_the_sigterm_handler_exists_only_during_a_write_and_only_when_sigterm_would_kill(tmp_path):
    seen = []

    class Recording(ListDataset):
        def __getitem__(self, index):
            seen.append(signal.getsignal(signal.SIGTERM))
            return super().__getitem__(index)

    def own_handler(signum, frame):
        pass

    samples = Recording([(1,)])
    previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        beton.DatasetWriter(tmp_path / "b.beton", {"i": IntField()}, num_workers=0,
                            progress=False).from_indexed_dataset(samples)
        assert callable(seen[-1]) and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # installed, restored
        signal.signal(signal.SIGTERM, own_handler)
        beton.DatasetWriter(tmp_path / "c.beton", {"i": IntField()}, num_workers=0,
                            progress=False).from_indexed_dataset(samples)
        assert seen[-1] is own_handler and signal.getsignal(signal.SIGTERM) is own_handler  # the program's own
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        thread = threading.Thread(target=lambda: beton.DatasetWriter(
            tmp_path / "d.beton", {"i": IntField()}, num_workers=0, progress=False).from_indexed_dataset(samples))
        thread.start()
        thread.join()
        assert seen[-1] is signal.SIG_DFL  # signal handlers belong to the main thread: none installed
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert files_in(tmp_path) == ["b.beton", "c.beton", "d.beton"]


def test_a_worker_sent_sigterm_dies_and_the_write_fails_as_for_any_dead_worker(tmp_path):
    parent = os.getpid()

    class TerminatingWorker(ListDataset):
        def __getitem__(self, index):
            if index == 17 and os.getpid() != parent:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(5)  # the default action ends the worker before this ends
            return super().__getitem__(index)

    writer = beton.DatasetWriter(tmp_path / "w.beton", {"i": IntField()}, num_workers=2, progress=False)
    with pytest.raises(WriterError, match="worker process died"):
        writer.from_indexed_dataset(TerminatingWorker([(i,) for i in range(40)]), chunksize=4)
    assert files_in(tmp_path) == []
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


# ---- a file changed under a running Loader ----------------------------------------------------------------

NUM_SAMPLES = 400  # 8x8x3 images on 1 KiB pages: 80 pages


def _truncate(path: Path) -> None:
    os.truncate(path, 4096 + 10 * 1024)  # keeps the header and the first 10 pages


def _rewrite_in_place(path: Path) -> None:
    with open(path, "r+b") as file:  # same size, other bytes: as `cp other.beton path` leaves it
        file.seek(4096 + 20 * 1024)
        file.write(bytes(1024))


def _replace(path: Path) -> None:
    other = write(path.with_name("other.beton"), IMAGE_FIELDS,
                  [(small_image(i + 1), i + 1) for i in range(NUM_SAMPLES)], page_size=1024)
    os.replace(other, path)


CHANGES = {"truncate": _truncate, "rewrite": _rewrite_in_place, "replace": _replace, "remove": os.unlink}


def change_under_loader(directory: str, os_cache: bool, change: str) -> dict:
    """Read an epoch, changing the file after its first batch; what the loop saw, then at the next epoch."""
    path = write(Path(directory, "data.beton"), IMAGE_FIELDS,
                 [(small_image(i), i) for i in range(NUM_SAMPLES)], page_size=1024)
    outcome = {"delivered": 0, "wrong": 0, "error": None, "next_epoch_error": None}
    with Loader(path, batch_size=10, num_workers=2, os_cache=os_cache, order=OrderOption.RANDOM, seed=0) as loader:
        try:
            for number, (images, labels) in enumerate(loader):
                outcome["delivered"] += len(labels)
                outcome["wrong"] += sum(not np.array_equal(image, small_image(label))
                                        for image, label in zip(images.numpy(), labels.tolist()))
                if number == 0:
                    time.sleep(0.5)  # the workers fill the slots ahead and wait: no batch is being decoded
                    CHANGES[change](path)
        except BetonError as error:
            outcome["error"] = [type(error).__name__, str(error)]
        try:
            iter(loader)
        except BetonError as error:
            outcome["next_epoch_error"] = [type(error).__name__, str(error)]
    return outcome


def print_change_under_loader(directory: str, os_cache: str, change: str) -> None:
    """Subprocess side: a SIGBUS ends this process, not the test run."""
    print(json.dumps(change_under_loader(directory, os_cache == "True", change)))


def assert_names_the_file(error: list[str] | None, path: Path, words: str) -> None:
    assert error is not None and error[0] == "FormatError", error
    assert repr(str(path)) in error[1] and words in error[1], error


@pytest.mark.parametrize("os_cache", [True, False], ids=["memory-map", "process-cache"])
@pytest.mark.parametrize("change", ["truncate", "rewrite"])
def test_a_file_truncated_or_rewritten_under_a_loader_raises_naming_it(tmp_path, os_cache, change):
    result = run_in_subprocess("print_change_under_loader", str(tmp_path), str(os_cache), change)
    assert result.returncode == 0, f"the loader process died ({result.returncode}): {result.stderr[-2000:]}"
    outcome = json.loads(result.stdout.strip().splitlines()[-1])
    assert outcome["wrong"] == 0  # every batch before the error is the opened file's
    assert 0 < outcome["delivered"] < NUM_SAMPLES
    assert_names_the_file(outcome["error"], tmp_path / "data.beton",
                          "truncated" if change == "truncate" else "modified")
    assert_names_the_file(outcome["next_epoch_error"], tmp_path / "data.beton", "")


@pytest.mark.parametrize("os_cache", [True, False], ids=["memory-map", "process-cache"])
@pytest.mark.parametrize("change, words", [("replace", "another file"), ("remove", "removed")])
def test_a_file_replaced_under_a_loader_ends_the_epoch_with_the_opened_file_then_raises(tmp_path, os_cache,
                                                                                        change, words):
    # A rename or unlink leaves the opened file intact (the Loader holds it open, so nothing here can crash): the
    # running epoch reads it to its end, consistently; the next epoch would read another dataset than the one
    # the run started with (and that a resumed run would get), so it raises.
    outcome = change_under_loader(str(tmp_path), os_cache, change)
    assert outcome["delivered"] == NUM_SAMPLES and outcome["wrong"] == 0 and outcome["error"] is None
    assert_names_the_file(outcome["next_epoch_error"], tmp_path / "data.beton", words)
