"""Races found by force, and each race found pinned by a deterministic test.

The harness is ``tests/epoch_stress.py`` (``python benchmarks/stress.py --epochs 20000`` for the long run): random
delays at every hand-off of the epoch engine, short epochs of every kind, each batch checked exactly, no thread
left behind. Here a fixed number of its epochs run (seed 0, or ``$BETON_STRESS_SEED``): the same work on any machine, so
the test never depends on how fast the machine is.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

import epoch_stress

EPOCHS = 150


@pytest.fixture(scope="module")
def stress_file(tmp_path_factory):
    return epoch_stress.write_file(str(tmp_path_factory.mktemp("stress") / "stress.beton"))


def beton_threads():
    return [thread for thread in threading.enumerate() if thread.name.startswith("beton-")]


def test_short_epochs_under_random_delays_yield_exactly_their_batches(stress_file):
    seed = int(os.environ.get("BETON_STRESS_SEED", "0"))
    summary = epoch_stress.run(stress_file, EPOCHS, seed)
    assert summary.failed == 0, (f"rerun with BETON_STRESS_SEED={seed}, or python benchmarks/stress.py --seed {seed}"
                                 f":\n{summary.report()}")
    assert summary.epochs == EPOCHS
    assert set(summary.actions) == set(epoch_stress.ACTIONS)
    assert not [thread for thread in beton_threads() if thread.name.startswith("beton-worker")]


def test_a_helper_returns_when_its_epoch_is_closed_by_a_finaliser_in_its_own_thread():
    assert epoch_stress.helper_returns_when_its_epoch_closes_inside_its_own_wait()


# Run in a process of its own: on a deadlock the lock threads take as they start and exit stays held, and every
# later thread of the process would hang with it.
FINALISERS = """
import os, sys, threading, time
import beton

def check(ok, message):
    if not ok:  # leave at once: the stuck thread holds a lock the interpreter's exit takes too
        print(message, file=sys.stderr, flush=True)
        os._exit(1)

def holding_exit_lock(action):
    # a collection inside threading.enumerate() or Thread.start() holds this lock; so does this thread
    thread = threading.Thread(target=lambda: [threading._active_limbo_lock.acquire(), action(),
                                              threading._active_limbo_lock.release()], daemon=True)
    thread.start()
    thread.join(10)
    return not thread.is_alive()

path = sys.argv[1]
for memory in (beton.memory.OSCache(), beton.memory.ProcessCache()):
    loader = beton.Loader(path, batch_size=2, num_workers=2, memory=memory)
    iterator = iter(loader)
    next(iterator)
    start = time.monotonic()
    check(holding_exit_lock(iterator.__del__), f"the iterator's finaliser deadlocked ({memory})")
    check(time.monotonic() - start < 2, f"the iterator's finaliser took {time.monotonic() - start:.1f} s")
    loader.close()
    print("iterator finaliser ok", memory, flush=True)

loader = beton.Loader(path, batch_size=1, num_workers=1, memory=beton.memory.ProcessCache())
iterator = iter(loader)
next(iterator)  # the reader walks on until the gate holds it back a few batches ahead: alive
reader = loader.memory._reader
assert reader._thread.is_alive()
check(holding_exit_lock(reader.stop), "stopping the page reader deadlocked")
loader.close()
print("page reader ok", flush=True)
"""


def test_finalisers_never_deadlock_on_the_lock_threads_take_as_they_exit(stress_file):
    # An iterator in a reference cycle is finalised by whichever thread the collector runs in, at any
    # allocation: inside threading.enumerate() or Thread.start() that thread holds the lock every thread takes
    # as it exits. The iterator's finaliser joined its workers, whose exit waited for that lock: a deadlock,
    # found by the harness's "cycle" epochs. The Loader's finaliser stopped the page reader the same way.
    done = subprocess.run([sys.executable, "-c", FINALISERS, stress_file], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count(" ok") == 3
