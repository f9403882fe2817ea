"""Idle workers help finish the epoch's last batches (beton.pipeline.sample_loop): the same batches, and a failure
named as one thread computing the batch alone would name it."""

from __future__ import annotations

import dataclasses
import signal
import sys
import threading
import time
from typing import Any

import numpy as np
import pytest

from beton import Loader, OrderOption
from beton.decoders import NDArrayDecoder
from beton.pipeline import SampleOperation, State
from beton.pipeline.sample_loop import SampleLoop
from beton.transforms import ToTensor

from conftest import small_image

WAIT = 10.0  # seconds a sample waits for another thread's before going on alone (a failure, then)
_RUNS: dict[str, dict[int, int]] = {}  # per test: sample -> the thread that computed it


@dataclasses.dataclass(frozen=True)
class Copy(SampleOperation):
    """Copies each row, and records the thread that did. Sample ``hold`` waits (at most WAIT seconds) until
    another thread computed a later sample of its batch (``batch_end``: the sample after the batch's last): the
    batch's own thread being held there, only a helper can. Samples in ``fail`` raise, ``hold`` after the
    others did."""

    run: str
    hold: int
    batch_end: int
    fail: range = range(0)

    def output_state(self, previous: Any) -> State:
        return previous

    def apply(self, src: Any, dst: np.ndarray, i: int, sample: int, context: Any) -> None:
        threads = _RUNS[self.run]
        threads[sample] = threading.get_ident()
        if sample == self.hold:
            deadline = time.monotonic() + WAIT
            while time.monotonic() < deadline and not any(
                    thread != threads[sample] for later, thread in list(threads.items())
                    if sample < later < self.batch_end):
                time.sleep(0.001)
        if sample in self.fail:
            raise LookupError(f"sample {sample} refused")
        dst[i] = src[i]


@pytest.mark.parametrize("count", [1, 2])
def test_an_idle_worker_helps_with_the_last_batch_and_the_batch_is_unchanged(image_file, count):
    """Two workers: the one without a batch (of one), or that finishes first (of two), helps the other, held at
    its first sample."""
    _RUNS["help"] = {}
    pipelines = {"image": [NDArrayDecoder(), Copy("help", hold=40, batch_end=56), ToTensor()]}
    with Loader(image_file, batch_size=16, num_workers=2, indices=np.arange(40, 40 + 16 * count),
                order=OrderOption.SEQUENTIAL, pipelines=pipelines) as loader:
        start = time.monotonic()
        batches = list(loader)
        assert time.monotonic() - start < WAIT  # the held sample was released by a helper, not the timeout
    assert [labels.tolist() for _, labels in batches] == [list(range(40, 56)), list(range(56, 72))][:count]
    for images, labels in batches:
        for image, label in zip(images.numpy(), labels.tolist()):
            np.testing.assert_array_equal(image, small_image(label))
    threads = _RUNS["help"]
    assert sorted(threads) == list(range(40, 40 + 16 * count))
    assert len({threads[s] for s in range(40, 56)}) == 2


@pytest.mark.parametrize("repeat", range(3))
def test_a_failure_is_the_first_in_the_batch_whichever_thread_met_it(image_file, repeat):
    """Sample 103 fails after sample 104 did (in the helper, while the batch's own thread is held at 103): the
    error is 103's, as a loop over the batch in one thread reports it."""
    _RUNS["fail"] = {}
    pipelines = {"image": [NDArrayDecoder(), Copy("fail", hold=103, batch_end=116, fail=range(103, 116)),
                           ToTensor()]}
    with Loader(image_file, batch_size=16, num_workers=2, indices=np.arange(100, 132), order=OrderOption.SEQUENTIAL,
                pipelines=pipelines) as loader:
        with pytest.raises(LookupError, match="sample 103 refused") as caught:
            list(loader)
    threads = _RUNS["fail"]
    assert 104 in threads and threads[104] != threads[103]  # the helper met sample 104's failure first
    assert "on sample 103 (batch 0 of epoch 0)" in "\n".join(caught.value.__notes__)


def test_a_keyboard_interrupt_between_two_positions_reaches_the_loop_at_once(image_file):
    """With ``num_workers=0`` the loop's thread runs the stage, and Ctrl-C raises KeyboardInterrupt there at any
    bytecode: here between taking a position and computing it (injected by a trace function). The first one must
    reach the loop; a watchdog sends a real SIGINT after a few seconds if it hung."""
    code = SampleLoop._work.__code__
    with open(code.co_filename) as source:
        line = next(number for number, text in enumerate(source, 1)
                    if number > code.co_firstlineno and text.strip() == "failure = None")
    injected, caught, hung = [], threading.Event(), threading.Event()

    def trace(frame, event, argument):
        if frame.f_code is not code:
            return None

        def lines(frame, event, argument):
            if event == "line" and frame.f_lineno == line and not injected:
                injected.append(True)
                raise KeyboardInterrupt
            return lines
        return lines

    def watchdog():
        if not caught.wait(WAIT / 2):
            hung.set()
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)

    _RUNS["interrupt"] = {}
    pipelines = {"image": [NDArrayDecoder(), Copy("interrupt", hold=-1, batch_end=0), ToTensor()]}
    with Loader(image_file, batch_size=16, num_workers=0, pipelines=pipelines) as loader:
        threading.Thread(target=watchdog, daemon=True).start()
        sys.settrace(trace)
        try:
            with pytest.raises(KeyboardInterrupt):
                next(iter(loader))
        finally:
            sys.settrace(None)
            caught.set()
    assert injected and not hung.is_set(), "the first KeyboardInterrupt hung; a second SIGINT freed it"
