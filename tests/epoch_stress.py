"""Races found by force: random delays at every hand-off of the epoch engine, and many short epochs checked exactly.

Shared by ``tests/loader/test_stress.py`` (a few hundred epochs in the suite) and ``benchmarks/stress.py`` (the
long run: ``python benchmarks/stress.py --epochs 20000``). It lives beside the suite's other shared helpers
(``resume_conformance.py``, ``range_server.py``): tests import it by name (pytest puts this folder on
``sys.path``), the benchmark adds this folder to ``sys.path``; the package itself carries no test hooks.

**Delays** (:class:`Jitter`): :meth:`Jitter.installed` wraps, for as long as it is entered, every hand-off
named in :data:`HAND_OFFS` (a worker taking a batch and publishing its result, an idle worker helping with
another's per-sample stage, the slot gate, the consumer's ``next()``, ``close()``, ``interrupt()``, the process
cache's schedule, page reader and sources) with a sleep before and after the call, and replaces the condition
each of the epoch state, a per-sample stage (its lock too), the slot gate and the page schedule is built with by
one that also sleeps around taking its lock, inside it and after each wait (so delays land *inside* the critical
sections too, between reading one thing and the next). Each sleep happens with probability ``probability`` and
lasts 0 to ``max_delay`` seconds, drawn from one generator seeded with
``seed`` (the choices, not the threads' interleavings, are reproducible). It also shortens the consumer's timed
wait (``epoch._WAIT_SECONDS``), so that its liveness check runs between almost every hand-off.

**Epochs** (:func:`run`): a file of :data:`NUM_SAMPLES` samples whose ``index`` field is the sample's index and
whose ``payload`` (an array spanning small pages, so the page reader has work) is derived from it. Each epoch
draws what the training loop does (:data:`ACTIONS`): run to the end, ``break``, raise in the loop body,
``iter()`` again (supersede), ``loader.close()``, or ``del`` the loader, after a drawn number of batches;
with or without a slow loop body, keeping every batch or not. Loaders are rebuilt now and then with drawn
options: 0-3 workers, the OS cache or the process cache (its default budget or the smallest), batch sizes,
``drop_last``, ``batches_ahead``, a subset of the samples (down to single-batch and empty epochs), and half
the time the payload through a per-sample Python stage (:class:`PythonCopy`) that idle workers help with. Every
batch received is compared, at once and again after the slow step, with ``loader.epoch_batches(epoch)``; kept
batches again at the epoch's end. After each epoch no ``beton-worker-*`` thread may be alive, and a page reader
only while its loader is open and for at most :data:`READER_GRACE` seconds after its epoch ended.

Each failure is counted by kind (:class:`Summary`), with the first examples and the scenario they ran.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import faulthandler
import gc
import random
import sys
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

import beton
from beton.errors import LoaderError
from beton.decoders import NDArrayDecoder
from beton.fields import IntField, NDArrayField
from beton.loader import epoch as epoch_module
from beton.loader.epoch import EpochEngine, EpochIterator, _EpochState
from beton.memory.page_reader import PageReader
from beton.memory.page_schedule import PageSchedule
from beton.memory.process_cache import ProcessCacheLayer
from beton.memory.slots import SlotGate
from beton.pipeline import SampleOperation, State
from beton.pipeline.sample_loop import SampleLoop

NUM_SAMPLES = 48
PAYLOAD_WIDTH = 40  # int32 values per sample: 160 bytes, so payloads cross the 256-byte pages
PAGE_SIZE = 256
READER_GRACE = 2.0  # seconds a page reader may outlive its epoch's end
HANG_SECONDS = 120.0  # an epoch running longer is a hang: every thread's stack is dumped and the process exits

#: (class, method): every hand-off of the epoch engine, each wrapped with a sleep before and after
HAND_OFFS = (
    (_EpochState, "take_batch"), (_EpochState, "publish"), (_EpochState, "finished"),
    (_EpochState, "share"), (_EpochState, "loop_to_help"),
    (SampleLoop, "run"), (SampleLoop, "help"), (SampleLoop, "finish"),
    (EpochEngine, "compute"),
    (EpochIterator, "__next__"), (EpochIterator, "close"), (EpochIterator, "interrupt"),
    (SlotGate, "wait"), (SlotGate, "asked_for"), (SlotGate, "close"),
    (PageSchedule, "pin"), (PageSchedule, "mark_ready"), (PageSchedule, "pages_for"), (PageSchedule, "release"),
    (PageSchedule, "stop"), (PageSchedule, "fail"),
    (PageReader, "read_page"), (PageReader, "stop"),
    (ProcessCacheLayer, "start_epoch"), (ProcessCacheLayer, "source"), (ProcessCacheLayer, "batch_done"),
    (ProcessCacheLayer, "close"),
)
#: (class, attribute): the conditions (and the per-sample stage's plain lock) replaced by shaken ones, as each
#: object is built
CONDITIONS = ((_EpochState, "condition"), (SlotGate, "_condition"), (PageSchedule, "_condition"),
              (SampleLoop, "_condition"), (SampleLoop, "_lock"))

ACTIONS = ("full", "break", "raise", "supersede", "close", "del", "cycle")
CYCLE_WAIT = 0.05  # seconds an abandoned cycle is left to the collector's own runs, in any thread
GC_THRESHOLD = 50  # allocations between collections during a run: finalisers then run in any thread, often


class Jitter:
    """Random sleeps at the engine's hand-offs while :meth:`installed` is entered (see the module docstring)."""

    def __init__(self, seed: int, max_delay: float = 0.02, probability: float = 0.01, yields: float = 0.3,
                 wait: float = 0.001) -> None:
        self.max_delay, self.probability, self.yields, self.wait = max_delay, probability, yields, wait
        self._random = random.Random(seed)
        self._lock = threading.Lock()

    def pause(self) -> None:
        """Maybe sleep: 0 to ``max_delay`` seconds with ``probability``, else with ``yields`` only hand the
        interpreter to another thread (``sleep(0)``: cheap, so it can happen at a third of the hand-offs)."""
        with self._lock:
            draw = self._random.random()
            delay = self._random.random() * self.max_delay if draw < self.probability else None
        if delay is not None:
            time.sleep(delay)
        elif draw < self.probability + self.yields:
            time.sleep(0)

    @contextlib.contextmanager
    def installed(self) -> Iterator[Jitter]:
        """Wrap the hand-offs and conditions (and shorten the consumer's timed wait) until the block ends. Enter
        it while no epoch runs: the classes are patched in place."""
        saved: list[tuple[Any, str, Any]] = []

        def replace(owner: Any, name: str, value: Any) -> None:
            saved.append((owner, name, owner.__dict__[name]))
            setattr(owner, name, value)

        try:
            for owner, name in HAND_OFFS:
                replace(owner, name, self._delayed(owner.__dict__[name]))
            for owner, attribute in CONDITIONS:
                replace(owner, "__init__", self._shaking(owner.__dict__["__init__"], attribute))
            replace(epoch_module, "_WAIT_SECONDS", self.wait)
            yield self
        finally:
            for owner, name, value in reversed(saved):
                setattr(owner, name, value)

    def _delayed(self, method: Callable) -> Callable:
        def delayed(*args: Any, **kwargs: Any) -> Any:
            self.pause()
            try:
                return method(*args, **kwargs)
            finally:
                self.pause()

        delayed.__wrapped__ = method
        return delayed

    def _shaking(self, init: Callable, attribute: str) -> Callable:
        def shaking(obj: Any, *args: Any, **kwargs: Any) -> None:
            init(obj, *args, **kwargs)
            setattr(obj, attribute, _ShakenCondition(getattr(obj, attribute), self))

        return shaking


class _ShakenCondition:
    """A ``threading.Condition`` that sleeps (maybe) before taking its lock, right after, before releasing it, and
    after every wait."""

    def __init__(self, condition: threading.Condition, jitter: Jitter) -> None:
        self._condition, self._jitter = condition, jitter

    def __enter__(self) -> bool:
        self._jitter.pause()
        entered = self._condition.__enter__()
        self._jitter.pause()
        return entered

    def __exit__(self, *exc_info: Any) -> None:
        self._jitter.pause()
        self._condition.__exit__(*exc_info)

    def wait(self, timeout: float | None = None) -> bool:
        woken = self._condition.wait(timeout)
        self._jitter.pause()
        return woken

    def wait_for(self, predicate: Callable[[], bool], timeout: float | None = None) -> bool:
        self._jitter.pause()
        return self._condition.wait_for(predicate, timeout)

    def notify(self, n: int = 1) -> None:
        self._condition.notify(n)

    def notify_all(self) -> None:
        self._condition.notify_all()


# ---- the file and the checks -----------------------------------------------------------------------------------


def payload_of(samples: np.ndarray) -> np.ndarray:
    """What the ``payload`` field holds for each of ``samples``."""
    return (np.asarray(samples, np.int64)[:, None] * 1000 + np.arange(PAYLOAD_WIDTH)).astype(np.int32)


def write_file(path: str) -> str:
    """The stress file: ``index`` is the sample's index, ``payload`` derived from it (:func:`payload_of`)."""
    fields = {"index": IntField(), "payload": NDArrayField(np.int32, (PAYLOAD_WIDTH,))}
    writer = beton.DatasetWriter(path, fields, num_workers=0, progress=False, page_size=PAGE_SIZE)
    writer.from_indexed_dataset(_Samples(), chunksize=16)
    return path


@dataclasses.dataclass(frozen=True)
class PythonCopy(SampleOperation):
    """The payload's rows copied in Python, a per-sample stage: idle workers help finish batches with it."""

    def output_state(self, previous: Any) -> State:
        return previous

    def apply(self, src: Any, dst: np.ndarray, i: int, sample: int, context: Any) -> None:
        time.sleep(0)  # the GIL to another thread, so that helpers take positions between this batch's own
        dst[i] = src[i]


class _Samples:
    def __len__(self) -> int:
        return NUM_SAMPLES

    def __getitem__(self, index: int) -> tuple:
        return index, payload_of(np.array([index]))[0]


def helper_returns_when_its_epoch_closes_inside_its_own_wait() -> bool:
    """The race the harness found (seed 13, a cycle action): a worker with no batch left waits in
    ``_EpochState.loop_to_help`` for a stage to help with; the collector runs the epoch's finaliser in that very
    thread, at an allocation while it holds the epoch's (reentrant) lock, and ``close()`` notifies every thread but
    the one about to wait. Here ``close()`` runs exactly there, from the read of the offered stages. True if the
    worker returns within a second rather than waiting for a notification that never comes."""
    state = _EpochState(0, 1, SlotGate(3, 0))
    state.computing = 1  # a batch still computed by another worker: nothing to return yet

    class ClosingWhenRead(dict):
        def values(self) -> Any:
            state.close()  # what the finaliser does
            return super().values()

    state.loops = ClosingWhenRead()
    thread = threading.Thread(target=state.loop_to_help, daemon=True)
    thread.start()
    thread.join(1.0)
    return not thread.is_alive()


class Failure(Exception):
    """A check that did not hold: ``kind`` is what :class:`Summary` counts it under."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind


class _Planned(Exception):
    """What a loop body raises on purpose."""


def _check(batch: Any, samples: np.ndarray, what: str) -> None:
    index, payload = (np.asarray(value) for value in batch)
    if index.tolist() != samples.tolist():
        raise Failure("wrong samples", f"{what}: got {index.tolist()}, expected {samples.tolist()}")
    if not np.array_equal(payload, payload_of(samples)):
        raise Failure("wrong payload", f"{what}: samples {samples.tolist()} have the wrong payload")


# ---- scenarios ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class LoaderConfig:
    num_workers: int
    memory: str  # "os", "process", "process-min" (the smallest page budget)
    batch_size: int
    drop_last: bool
    batches_ahead: int | None
    samples: int
    shuffle: bool
    python_stage: bool  # the payload through PythonCopy, a stage idle workers help with

    @classmethod
    def draw(cls, rng: random.Random) -> LoaderConfig:
        batch_size = rng.choice((1, 2, 3, 5, 8, 16))
        # often one batch or a few, sometimes a partial last batch, rarely none (drop_last of a short subset)
        samples = rng.choice((rng.randint(1, batch_size), rng.randint(1, 4 * batch_size),
                              rng.randint(1, NUM_SAMPLES)))
        return cls(rng.choice((0, 1, 1, 2, 3)), rng.choice(("os", "process", "process-min")), batch_size,
                   rng.random() < 0.3, rng.choice((None, 1, 2)), min(samples, NUM_SAMPLES), rng.random() < 0.7,
                   rng.random() < 0.5)

    def build(self, path: str, seed: int) -> beton.Loader:
        memory = {"os": beton.memory.OSCache(), "process": beton.memory.ProcessCache(),
                  "process-min": beton.memory.ProcessCache(pages=1)}[self.memory]
        order = beton.OrderOption.RANDOM if self.shuffle else beton.OrderOption.SEQUENTIAL
        return beton.Loader(path, batch_size=self.batch_size, num_workers=self.num_workers, memory=memory,
                            order=order, seed=seed, drop_last=self.drop_last, batches_ahead=self.batches_ahead,
                            indices=np.arange(self.samples),
                            pipelines={"payload": [NDArrayDecoder(), PythonCopy()]} if self.python_stage else None)


@dataclasses.dataclass(frozen=True)
class EpochPlan:
    """What the loop does in one epoch: ``action`` after ``after`` batches, a slow body or not, keeping batches."""

    action: str
    after: int
    slow: float  # seconds the loop body sleeps per batch at most (0: a fast loop)
    keep: bool

    @classmethod
    def draw(cls, rng: random.Random, slow_step: float) -> EpochPlan:
        return cls(rng.choice(ACTIONS), rng.randint(0, 6), rng.choice((0.0, slow_step)), rng.random() < 0.2)


@dataclasses.dataclass
class Summary:
    """Epochs run and failures by kind, with the first ``examples`` of each (scenario and traceback)."""

    seed: int
    epochs: int = 0
    seconds: float = 0.0
    failures: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    examples: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    actions: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    slowest: tuple[float, str] = (0.0, "")  # the longest epoch: seconds, and what it ran

    @property
    def failed(self) -> int:
        return sum(self.failures.values())

    def add(self, kind: str, text: str, keep: int = 3) -> None:
        self.failures[kind] += 1
        found = self.examples.setdefault(kind, [])
        if len(found) < keep:
            found.append(text)

    def report(self) -> str:
        rate = self.epochs / self.seconds if self.seconds else 0.0
        lines = [f"{self.epochs} epochs in {self.seconds:.1f} s ({rate:.1f} epochs/s), seed {self.seed}, "
                 f"{self.failed} failures"]
        lines += [f"  {kind}: {count}" for kind, count in self.failures.most_common()]
        lines.append(f"slowest epoch: {self.slowest[0]:.2f} s, {self.slowest[1]}")
        for kind, texts in self.examples.items():
            lines += [f"--- {kind}"] + texts
        return "\n".join(lines)


class _Run:
    """The state of one stress run: the file, the current loader and its options, the epoch counter."""

    def __init__(self, path: str, rng: random.Random, seed: int, slow_step: float) -> None:
        self.path, self.rng, self.seed, self.slow_step = path, rng, seed, slow_step
        self.loader: beton.Loader | None = None
        self.config: LoaderConfig | None = None
        self.epoch = 0

    def fresh_loader(self) -> beton.Loader:
        self.config = LoaderConfig.draw(self.rng)
        self.loader = self.config.build(self.path, self.seed)
        return self.loader

    def start(self, loader: beton.Loader) -> tuple[EpochIterator, list[np.ndarray]]:
        """A new epoch on ``loader`` (numbered by this run), and the batches it must yield."""
        self.epoch += 1
        loader.set_epoch(self.epoch)
        expected = loader.epoch_batches(self.epoch)
        return iter(loader), expected

    def receive(self, iterator: EpochIterator, expected: list[np.ndarray], position: int, plan: EpochPlan,
                kept: list) -> Any:
        batch = next(iterator)
        if position >= len(expected):
            raise Failure("extra batch", f"batch {position} of an epoch of {len(expected)}")
        _check(batch, expected[position], f"batch {position}")
        if plan.slow:
            time.sleep(self.rng.random() * plan.slow)
            _check(batch, expected[position], f"batch {position} after the loop's step")
        if plan.keep:
            kept.append((position, batch))
        return batch

    def finish(self, iterator: EpochIterator, expected: list[np.ndarray], position: int, plan: EpochPlan,
               kept: list) -> None:
        """Receive the rest of the epoch from ``position``, then check that it ends there."""
        while position < len(expected):
            self.receive(iterator, expected, position, plan, kept)
            position += 1
        try:
            extra = next(iterator)
        except StopIteration:
            return
        raise Failure("extra batch", f"after {len(expected)} batches: {np.asarray(extra[0]).tolist()}")


def _expect_ended(iterator: Any, position: int, length: int, failure: str) -> None:
    """An iterator its Loader ended before its last batch must raise LoaderError, not go on or stop quietly."""
    if position < length:
        try:
            next(iterator)
        except LoaderError:
            return
        raise Failure(failure, f"after {position} of {length} batches")


def _alive(prefix: str) -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name.startswith(prefix)]


def run_epoch(run: _Run, plan: EpochPlan) -> None:
    """One epoch as ``plan`` says; raises :class:`Failure` (or whatever the loader raised) when something is off."""
    if run.loader is None or run.rng.random() < 0.15:
        if run.loader is not None:
            run.loader.close()
        run.fresh_loader()
    loader = run.loader
    iterator, expected = run.start(loader)
    stop_at = min(plan.after, len(expected))
    kept: list = []
    position = 0
    while position < stop_at:
        run.receive(iterator, expected, position, plan, kept)
        position += 1
    if plan.action == "full":
        run.finish(iterator, expected, position, plan, kept)
    elif plan.action == "break":
        pass  # the iterator is dropped below
    elif plan.action == "raise":
        try:
            for batch in iterator:
                _check(batch, expected[position], f"batch {position}, the one the loop body raised on")
                raise _Planned()
        except _Planned:
            pass
    elif plan.action == "supersede":
        second, expected_next = run.start(loader)
        _expect_ended(iterator, position, len(expected), "superseded iterator went on")
        run.finish(second, expected_next, 0, plan, [])
        del second
    elif plan.action == "close":
        loader.close()
        run.loader = None
        _expect_ended(iterator, position, len(expected), "closed loader's iterator went on")
        if _alive("beton-page-reader"):
            raise Failure("page reader alive after close", f"{_alive('beton-page-reader')}")
    elif plan.action == "cycle":
        # abandoned inside a reference cycle (an exception kept with its traceback does this): the iterator's
        # finaliser runs when the collector next runs, in whichever thread allocates then, a worker's included
        cycle: list = [iterator]
        cycle.append(cycle)
        collected = weakref.ref(iterator)
        del cycle
        iterator = None
        deadline = time.monotonic() + CYCLE_WAIT
        while collected() is not None and time.monotonic() < deadline:
            time.sleep(0.001)
        if collected() is not None:
            gc.collect()  # the cycle reached an older generation: collect it as a full collection would
        # A finaliser cannot always join (it may run in a worker, or while its thread holds the lock threads
        # take as they exit): the workers, told to stop, end by themselves.
        deadline = time.monotonic() + READER_GRACE
        while _alive("beton-worker") and time.monotonic() < deadline:
            time.sleep(0.001)
    elif plan.action == "del":
        gone = weakref.ref(loader)
        run.loader = None
        del loader
        run.finish(iterator, expected, position, plan, kept)  # the iterator keeps its loader
        del iterator
        if gone() is not None:
            gc.collect()
        if gone() is not None:
            raise Failure("loader outlived its iterator", "after del of both")
    for position, batch in kept:
        _check(batch, expected[position], f"kept batch {position} at the epoch's end")
    del kept
    iterator = None  # noqa: F841 - dropping it closes the epoch
    workers = _alive("beton-worker")
    if workers:
        raise Failure("worker threads left", ", ".join(thread.name for thread in workers))
    deadline = time.monotonic() + READER_GRACE
    while len(_alive("beton-page-reader")) > 0 and time.monotonic() < deadline:
        time.sleep(0.001)
    if _alive("beton-page-reader"):
        raise Failure("page reader outlived its epoch", f"{READER_GRACE} s after the epoch ended")


def run(path: str, epochs: int, seed: int, *, max_delay: float = 0.02, probability: float = 0.01,
        yields: float = 0.3, slow_step: float = 0.02, progress: Callable[[Summary], None] | None = None,
        seconds: float | None = None) -> Summary:
    """Run ``epochs`` epochs (or as many as fit in ``seconds``) on the stress file at ``path``, under a
    :class:`Jitter` seeded with ``seed``."""
    rng = random.Random(seed)
    summary = Summary(seed)
    state = _Run(path, rng, seed, slow_step)
    start = time.perf_counter()
    thresholds = gc.get_threshold()
    # collections of the youngest objects often (so finalisers run in any thread), the older as often as usual
    gc.set_threshold(GC_THRESHOLD, thresholds[1] * thresholds[0] // GC_THRESHOLD, thresholds[2])
    gc.freeze()  # what is alive now (torch, numba, ...) stays out of every collection: full ones cost little
    with Jitter(seed, max_delay, probability, yields).installed():
        try:
            for _ in range(epochs):
                if seconds is not None and time.perf_counter() - start > seconds:
                    break
                plan = EpochPlan.draw(rng, slow_step)
                summary.actions[plan.action] += 1
                faulthandler.dump_traceback_later(HANG_SECONDS, exit=True, file=sys.stderr)
                began = time.perf_counter()
                try:
                    run_epoch(state, plan)
                except Failure as failure:
                    summary.add(failure.kind, f"epoch {state.epoch}, {state.config}, {plan}: {failure}")
                except Exception as error:  # noqa: BLE001 - every unexpected exception is a failure to count
                    summary.add(type(error).__name__, f"epoch {state.epoch}, {state.config}, {plan}:\n"
                                + "".join(traceback.format_exception(error)))
                finally:
                    faulthandler.cancel_dump_traceback_later()
                    took = time.perf_counter() - began
                    if took > summary.slowest[0]:
                        summary.slowest = (took, f"epoch {state.epoch}, {state.config}, {plan}")
                summary.epochs += 1
                if progress is not None and summary.epochs % 500 == 0:
                    summary.seconds = time.perf_counter() - start
                    progress(summary)
        finally:
            if state.loader is not None:
                state.loader.close()
            gc.set_threshold(*thresholds)
            gc.unfreeze()
    summary.seconds = time.perf_counter() - start
    return summary
