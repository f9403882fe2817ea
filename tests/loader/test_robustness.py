"""Failures reach the training loop fast and intact; threads and memory never leak."""

from __future__ import annotations

import gc
import subprocess
import sys
import resource
import threading
import time

import pytest
import torch

import beton
from beton import Loader, OrderOption
from beton.decoders import CenterCropRGBImageDecoder, IntDecoder, NDArrayDecoder
from beton.errors import DecodeError
from beton.fields import IntField, RGBImageField
from beton.transforms import ToTensor

from conftest import write
from golden_files import photos
from jit_ops import FailOnSample, PythonFailOnSample, TorchFailOnSample
from resume_conformance import where


@pytest.mark.parametrize("num_workers", [1, 2])
def test_a_compiled_operation_raising_reaches_the_loop_with_its_sample(image_file, num_workers):
    pipelines = {"image": [NDArrayDecoder(), FailOnSample(bad_sample=77), ToTensor()]}
    with Loader(image_file, batch_size=16, num_workers=num_workers, pipelines=pipelines,
                order=OrderOption.RANDOM, seed=0) as loader:
        start = time.monotonic()
        with pytest.raises(ValueError, match="cursed") as caught:
            for _ in loader:
                pass
        assert time.monotonic() - start < 1.0
    notes = "\n".join(caught.value.__notes__)
    assert "sample 77" in notes and "FailOnSample" in notes and "'image'" in notes


def test_a_per_sample_python_operation_raising_names_its_sample(image_file):
    pipelines = {"image": [NDArrayDecoder(), PythonFailOnSample(bad_sample=21), ToTensor()]}
    with Loader(image_file, batch_size=16, num_workers=1, pipelines=pipelines) as loader:
        delivered = 0
        with pytest.raises(LookupError, match="sample 21 has no row") as caught:
            for images, _ in loader:
                delivered += len(images)
    assert delivered == 16
    notes = "\n".join(caught.value.__notes__)
    assert "on sample 21 (batch 1 of epoch 0)" in notes and "PythonFailOnSample" in notes and "'image'" in notes


def test_a_torch_operation_raising_reaches_the_loop(image_file):
    pipelines = {"label": [IntDecoder(), ToTensor(), TorchFailOnSample(bad_sample=150, max_sleep=0.01)]}
    with Loader(image_file, batch_size=16, num_workers=2, pipelines=pipelines) as loader:
        delivered = []
        with pytest.raises(KeyError, match="150 rejected") as caught:
            for _, labels in loader:
                delivered += labels.tolist()
    assert delivered == list(range(144))  # every batch before the failing one, in order
    assert "TorchFailOnSample" in "\n".join(caught.value.__notes__)


def beton_threads():
    return sum(thread.name.startswith("beton-") for thread in threading.enumerate())


def rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@pytest.mark.parametrize("os_cache", [True, False])
def test_abandoned_iterators_leave_no_threads_or_memory(image_file, os_cache):
    baseline = threading.active_count()
    pipelines = {"label": [IntDecoder(), ToTensor(), TorchFailOnSample(bad_sample=-1, max_sleep=0.002)]}
    loader = Loader(image_file, batch_size=8, num_workers=2, os_cache=os_cache, pipelines=pipelines,
                    order=OrderOption.RANDOM, seed=1)
    for _ in range(20):  # warm up allocators before measuring
        next(iter(loader))
    rss_before = rss_mib()
    for round_number in range(200):
        iterator = iter(loader)
        for _ in range(round_number % 4):
            next(iterator)
        if round_number % 3 == 0:
            for _ in iterator:  # some run to the end, some are broken off
                break
        del iterator
    gc.collect()
    # the page reader of the live epoch (process cache), or the watcher of the file's read lease (OS cache)
    assert threading.active_count() <= baseline + 1
    assert rss_mib() - rss_before < 50
    loader.close()
    assert beton_threads() == 0 and threading.active_count() <= baseline


def test_garbage_collecting_a_loader_mid_epoch_stops_its_threads(image_file):
    baseline = threading.active_count()
    loader = Loader(image_file, batch_size=8, num_workers=2)
    iterator = iter(loader)
    next(iterator)
    del loader, iterator
    gc.collect()
    deadline = time.monotonic() + 5
    while beton_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert beton_threads() == 0 and threading.active_count() <= baseline


def test_break_then_reiterate_starts_the_next_epoch(image_file):
    with Loader(image_file, batch_size=8, num_workers=2, order=OrderOption.RANDOM, seed=4) as loader:
        for _ in loader:
            assert where(loader.state_dict()) == (4, 0, 1)  # checkpoint inside the loop
            break
        assert where(loader.state_dict()) == (4, 0, 1)  # a checkpoint resumes epoch 0
        labels = [batch[1] for batch in loader]  # iterating again starts epoch 1
        assert torch.cat(labels).sort().values.tolist() == list(range(203))
        assert where(loader.state_dict()) == (4, 2, 0)


def test_a_forged_payload_size_is_an_error_not_an_overflow(image_file, tmp_path):
    """Checksums can be recomputed by a buggy tool: the kernels still must not write past a buffer."""
    import zlib

    import numpy as np

    from beton.storage import format as fmt
    from beton.storage.file_builder import header_bytes

    content = bytearray(image_file.read_bytes())
    header = np.frombuffer(bytes(content[: fmt.HEADER_SIZE]), fmt.HEADER_DTYPE).copy()[0]
    start, size = int(header["allocation_table"]["offset"]), int(header["allocation_table"]["size"])
    table = np.frombuffer(bytes(content[start : start + size]), fmt.ALLOCATION_DTYPE).copy()
    table[5]["size"] = 4000  # larger than the 192-byte image buffer, still inside the heap
    content[start : start + size] = table.tobytes()
    header["allocation_table"]["crc32"] = zlib.crc32(table.tobytes())
    content[: fmt.HEADER_SIZE] = header_bytes(header)
    forged = tmp_path / "forged.beton"
    forged.write_bytes(bytes(content))
    for os_cache in (True, False):
        with Loader(forged, batch_size=8, num_workers=2, os_cache=os_cache) as loader:
            with pytest.raises(ValueError, match="payload size does not match") as caught:
                for _ in loader:
                    pass
        assert "sample 5" in "\n".join(caught.value.__notes__)


@pytest.mark.parametrize(("environment", "expected"), [(None, "threadsafe"), ("omp", "omp")])
def test_the_threading_layer_is_chosen_explicitly(image_file, environment, expected):
    """In a fresh process (the layer is process-wide state): the Loader picks "threadsafe" unless the user chose."""
    import os
    import subprocess
    import sys

    script = (f"import numba, beton\nbefore = numba.config.THREADING_LAYER\n"
              f"beton.Loader({str(image_file)!r}, batch_size=8, num_workers=1).close()\n"
              f"print(before, numba.config.THREADING_LAYER)")
    env = {key: value for key, value in os.environ.items() if key != "NUMBA_THREADING_LAYER"}
    if environment:
        env["NUMBA_THREADING_LAYER"] = environment
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [environment or "default", expected]


@pytest.mark.parametrize("ending", ["close", "another epoch"])
def test_an_epoch_ended_from_another_thread_while_the_loop_waits_raises_why(image_file, ending):
    """The loop waits in next() for a page read slowly; another thread closes the Loader or starts an epoch."""
    from beton.errors import LoaderError
    from beton.memory import ProcessCache

    loader = Loader(image_file, batch_size=8, num_workers=1, memory=ProcessCache(read_bandwidth=2000))  # 1 KiB pages
    iterator = iter(loader)
    raised: list[BaseException] = []

    def loop() -> None:
        try:
            next(iterator)
        except BaseException as error:  # noqa: BLE001 - what the loop saw is the test's result
            raised.append(error)

    waiting = threading.Thread(target=loop)
    waiting.start()
    time.sleep(0.2)  # the first pages take about half a second to arrive
    if ending == "close":
        loader.close()
    else:
        iter(loader)
    waiting.join(10)
    assert not waiting.is_alive()
    assert len(raised) == 1 and isinstance(raised[0], LoaderError), raised
    assert ("the Loader was closed" if ending == "close" else "started another epoch") in str(raised[0])
    loader.close()


@pytest.mark.parametrize("os_cache", [True, False])
def test_the_process_exits_whatever_locks_its_stopped_threads_held(image_file, os_cache):
    """At the interpreter's exit the other threads are stopped wherever they are, possibly inside a lock of the
    loader's (the OS cache's lease watcher, a worker in the epoch's lock); the loader's finalisers then run and
    must not wait for those locks. Threads stand in for them here, holding the locks as the exit comes."""
    script = f"""
import threading, time
import beton
loader = beton.Loader({str(image_file)!r}, batch_size=8, num_workers=2, os_cache={os_cache})
batches = iter(loader)
next(batches)
locks = [batches._state.condition] + ([loader.memory.lease._condition] if {os_cache} else [])
def hold(lock, held):
    lock.acquire()
    held.set()
    time.sleep(3600)
for lock in locks:
    held = threading.Event()
    threading.Thread(target=hold, args=(lock, held), daemon=True).start()
    held.wait()
print("exiting")
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout == "exiting\n"


def damage_jpeg(path, sample: int) -> None:
    """Overwrite the start of ``sample``'s JPEG in place (its page checksum is left wrong: the loader does not
    check it, ``verify`` would)."""
    with beton.Reader(path) as reader:
        offset = int(reader.allocation_table[sample, 0]["offset"])
    with open(path, "r+b") as file:
        file.seek(offset)
        file.write(bytes(16))


@pytest.mark.parametrize("num_workers", [0, 1])
def test_a_sample_that_cannot_be_decoded_names_its_file(tmp_path, num_workers):
    fields = {"image": RGBImageField(write_mode="jpg"), "label": IntField()}
    shards = [write(tmp_path / f"part-{k}.beton", fields, [(photo, i) for i, photo in enumerate(photos(6))])
              for k in range(2)]
    damage_jpeg(shards[1], 4)
    pipelines = {"image": [CenterCropRGBImageDecoder((16, 16)), ToTensor()]}
    for dataset, sample, file in [(shards[1], 4, str(shards[1])), (str(tmp_path / "part-*.beton"), 10, None)]:
        with pytest.raises(DecodeError) as caught:
            for _ in Loader(dataset, batch_size=4, num_workers=num_workers, pipelines=pipelines):
                pass
        error = caught.value
        assert (error.path, error.field, error.sample) == (str(dataset), "image", sample)
        assert f"file {str(dataset)!r}, field 'image', sample {sample}:" in str(error)
        shard_notes = [note for note in getattr(error, "__notes__", []) if "of the shard" in note]
        if file is None:  # a union: the note names the shard and the sample's index in it
            assert shard_notes == [f"beton: sample 10 of the dataset is sample 4 of the shard {str(shards[1])!r}"]
        else:
            assert shard_notes == []
