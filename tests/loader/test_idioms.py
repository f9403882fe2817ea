"""The Loader used as torch users write loops: temporaries, generators, zip, break, exceptions, threads, copies.

Every case checks the exact samples it receives: the file's ``index`` field is the sample index, and its
``payload`` (an array of 16 int64 per sample, spread over many 1 KiB pages) is derived from the index, so a batch
read from the wrong page, a stale slot or an empty epoch is seen. Expected batches come from a reference Loader's
``epoch_batches(epoch)`` (a pure function of seed and epoch), checked once against ``range`` for SEQUENTIAL and
against a permutation for RANDOM.

Issue #24: ``for x in Loader(...)``, ``next(iter(Loader(...)))``, ``yield from Loader(...)`` and ``zip(Loader(a),
Loader(b))`` yielded nothing, because the Loader's finaliser closed the epoch while only its iterator referenced
it.

No temporary Loader is built inside an ``assert`` statement: pytest's assert rewriting keeps every
sub-expression in a local variable, which keeps the Loader alive and hid exactly that bug (``assert
list(islice(Loader(...), 3)) == ...`` passed before the fix).
"""

from __future__ import annotations

import copy
import functools
import gc
import itertools
import pickle
import threading
import time

import numpy as np
import pytest

from beton import Loader, OrderOption
from beton.decoders import IntDecoder
from beton.errors import LoaderError
from beton.fields import IntField, NDArrayField
from beton.memory import OSCache, ProcessCache
from beton.transforms import ToTensor

from conftest import write
from resume_conformance import where

SAMPLES = 103  # a prime: the last batch is partial for every batch size used here
BATCH = 10
SEED = 5
FIELDS = {"index": IntField(), "payload": NDArrayField(np.int64, (16,))}

MEMORIES = {"os_cache": OSCache(), "process_cache": ProcessCache()}
ORDERS = [OrderOption.SEQUENTIAL, OrderOption.RANDOM]
WORKERS = [0, 2]


def payload_of(i: int) -> np.ndarray:
    return i * 16 + np.arange(16, dtype=np.int64)


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    """103 samples of (index, 16 int64 derived from it): 128-byte payloads, 8 per 1 KiB page, 13 pages."""
    return write(tmp_path_factory.mktemp("idioms") / "indices.beton", FIELDS,
                 [(i, payload_of(i)) for i in range(SAMPLES)], page_size=1024)


@pytest.fixture(params=list(MEMORIES), ids=list(MEMORIES))
def memory(request):
    return MEMORIES[request.param]


@pytest.fixture(params=WORKERS, ids=[f"workers{n}" for n in WORKERS])
def num_workers(request):
    return request.param


@pytest.fixture(params=ORDERS, ids=[order.name.lower() for order in ORDERS])
def order(request):
    return request.param


@pytest.fixture
def make(path, memory, num_workers, order):
    """Builds a Loader of the test's configuration; keyword arguments override it."""
    def build(**options):
        return Loader(path, **{"batch_size": BATCH, "num_workers": num_workers, "memory": memory, "order": order,
                               "seed": SEED, **options})
    return build


@functools.lru_cache(maxsize=None)
def expected(path, order, epoch, batch_size=BATCH, **shard):
    """The batches (lists of sample indices) an epoch must yield, from a reference Loader's order."""
    reference = Loader(path, batch_size=batch_size, num_workers=0, order=order, seed=SEED, **shard)
    try:
        batches = [batch.tolist() for batch in reference.epoch_batches(epoch)]
    finally:
        reference.close()
    if not shard:
        flat = [i for batch in batches for i in batch]
        if order is OrderOption.SEQUENTIAL:
            assert flat == list(range(SAMPLES))
        else:
            assert sorted(flat) == list(range(SAMPLES)) and flat != list(range(SAMPLES))
        assert [len(batch) for batch in batches] == [batch_size] * (SAMPLES // batch_size) + [SAMPLES % batch_size]
    return batches


def indices(batch) -> list[int]:
    """The sample indices of a batch, after checking every sample's payload against its index."""
    index, payload = batch
    got = index.tolist()
    np.testing.assert_array_equal(payload.numpy(), np.stack([payload_of(i) for i in got]) if got else payload.numpy())
    return got


def epoch_of(iterable) -> list[list[int]]:
    return [indices(batch) for batch in iterable]


def beton_threads(prefix: str = "beton-") -> int:
    return sum(thread.name.startswith(prefix) for thread in threading.enumerate())


def wait_for_threads(at_most: int, prefix: str = "beton-", seconds: float = 5.0) -> int:
    deadline = time.monotonic() + seconds
    while beton_threads(prefix) > at_most and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.01)
    return beton_threads(prefix)


# ---- temporaries: the Loader referenced only by its iterator (issue #24) ------------------------------------------


def test_for_over_a_temporary_loader(make, path, order):
    batches = []
    for x, y in make():
        batches.append(indices((x, y)))
    assert batches == expected(path, order, 0)


def test_next_iter_of_a_temporary_loader(make, path, order):
    x, y = next(iter(make()))
    assert indices((x, y)) == expected(path, order, 0)[0]
    x, y = next(iter(make()))  # a second temporary: its own epoch 0 again
    assert indices((x, y)) == expected(path, order, 0)[0]


def test_yield_from_a_temporary_loader(make, path, order):
    def batches(epochs):
        for _ in range(epochs):
            yield from make()  # a new Loader each time: epoch 0 each time

    assert epoch_of(batches(2)) == expected(path, order, 0) * 2


def test_yield_from_one_loader_over_epochs(make, path, order):
    def stream(loader, epochs):
        for _ in range(epochs):
            yield from loader

    with make() as loader:
        assert epoch_of(stream(loader, 2)) == expected(path, order, 0) + expected(path, order, 1)


@pytest.mark.parametrize("other_batch_size", [BATCH, 7])
def test_zip_of_two_temporary_loaders(make, path, order, other_batch_size):
    pairs = [(indices(a), indices(b)) for a, b in zip(make(), make(batch_size=other_batch_size, seed=SEED + 1))]
    first = expected(path, order, 0)
    second = [batch.tolist() for batch in _reference_batches(path, order, other_batch_size, SEED + 1)]
    assert len(pairs) == min(len(first), len(second))
    assert [a for a, _ in pairs] == first[:len(pairs)]
    assert [b for _, b in pairs] == second[:len(pairs)]


def _reference_batches(path, order, batch_size, seed):
    with Loader(path, batch_size=batch_size, num_workers=0, order=order, seed=seed) as reference:
        batches = reference.epoch_batches(0)
    flat = np.concatenate(batches).tolist()
    assert sorted(flat) == list(range(SAMPLES))
    return batches


def test_zip_of_a_loader_with_itself_is_an_error_not_a_short_epoch(make):
    """One Loader runs one epoch at a time: the second ``iter()`` supersedes the first iterator, which raises."""
    with make() as loader:
        with pytest.raises(LoaderError, match="another epoch"):
            for _ in zip(loader, loader):
                pass


def test_enumerate_a_temporary_loader(make, path, order):
    seen = {number: indices(batch) for number, batch in enumerate(make())}
    assert list(seen) == list(range(len(expected(path, order, 0))))
    assert list(seen.values()) == expected(path, order, 0)


def test_islice(make, path, order):
    # a temporary, cut short (outside the assert: pytest's rewritten assert would keep the Loader alive)
    first_three = epoch_of(itertools.islice(make(), 3))
    assert first_three == expected(path, order, 0)[:3]
    with make() as loader:
        assert epoch_of(itertools.islice(loader, 2, 5)) == expected(path, order, 0)[2:5]
        assert where(loader.state_dict()) == (SEED, 0, 5)
        assert epoch_of(loader) == expected(path, order, 1)  # the next epoch, complete


def test_gc_collect_inside_the_loop(make, path, order):
    batches = []
    for batch in make(batch_size=60):  # a temporary: only the iterator holds it (2 batches: a collection is slow)
        gc.collect()
        batches.append(indices(batch))
    assert batches == expected(path, order, 0, batch_size=60)


# ---- leaving a loop early ------------------------------------------------------------------------------------------


def test_break_then_a_new_epoch_is_complete(make, path, order):
    with make() as loader:
        received = []
        for batch in loader:
            received.append(indices(batch))
            if len(received) == 3:
                break
        assert received == expected(path, order, 0)[:3]
        assert where(loader.state_dict()) == (SEED, 0, 3)
        assert epoch_of(loader) == expected(path, order, 1)
        assert epoch_of(loader) == expected(path, order, 2)


def test_an_exception_in_the_loop_body_then_a_new_epoch(make, path, order):
    with make() as loader:
        received = []
        with pytest.raises(ZeroDivisionError):
            for batch in loader:
                received.append(indices(batch))
                if len(received) == 4:
                    1 / 0
        assert received == expected(path, order, 0)[:4]
        assert where(loader.state_dict()) == (SEED, 0, 4)
        assert epoch_of(loader) == expected(path, order, 1)


def test_keyboard_interrupt_in_the_loop_body_propagates_and_the_loader_still_works(make, path, order):
    with make() as loader:
        received = []
        with pytest.raises(KeyboardInterrupt):
            for batch in loader:
                received.append(indices(batch))
                if len(received) == 2:
                    raise KeyboardInterrupt
        assert received == expected(path, order, 0)[:2]
        state = loader.state_dict()
        assert where(state) == (SEED, 0, 2)  # a checkpoint saved on Ctrl-C
        assert epoch_of(loader) == expected(path, order, 1)  # iterating again: the next epoch, complete
        loader.load_state_dict(state)  # or resume the interrupted epoch from the checkpoint
        assert epoch_of(loader) == expected(path, order, 0)[2:]


def test_an_interrupt_while_a_batch_is_delivered_leaves_it_for_the_next_call(make, path, order, monkeypatch):
    """Ctrl-C (or a pinning error) inside a batch's delivery lost the batch: with workers, the next call waited for
    ever for it; without, the epoch went on without it."""
    from beton.loader.epoch import EpochEngine

    deliver, calls = EpochEngine.deliver, []

    def interrupted_once(engine, value):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return deliver(engine, value)

    monkeypatch.setattr(EpochEngine, "deliver", interrupted_once)
    loader = make(copy=True)
    iterator = iter(loader)
    received = [indices(next(iterator)), indices(next(iterator))]
    with pytest.raises(KeyboardInterrupt):
        next(iterator)
    assert where(loader.state_dict()) == (SEED, 0, 2)  # the interrupted batch is not the loop's yet
    received += epoch_of(iterator)  # the same iterator goes on with it
    assert received == expected(path, order, 0)


class _FailsOnce:
    """A step after ToTensor whose first call on the batch holding sample 12 raises (a transient error)."""

    def __init__(self) -> None:
        self.failed = False

    def __call__(self, batch):
        if not self.failed and (batch == 12).any():
            self.failed = True
            raise OSError("a transient read error")
        return batch


def test_after_a_batch_raised_its_iterator_raises_rather_than_ending_the_epoch_quietly(make, path, order):
    """A loop catching the error and calling next() again got StopIteration: a short epoch that looked whole."""
    loader = make(pipelines={"index": [IntDecoder(), ToTensor(), _FailsOnce()]})
    iterator = iter(loader)
    received = []
    with pytest.raises(OSError, match="transient"):
        while True:
            received.append(indices(next(iterator)))
    failed_at = len(received)
    assert received == expected(path, order, 0)[:failed_at] and 12 in expected(path, order, 0)[failed_at]
    with pytest.raises(LoaderError, match=f"batch {failed_at} raised OSError: a transient read error"):
        next(iterator)
    state = loader.state_dict()
    assert where(state) == (SEED, 0, failed_at)
    loader.load_state_dict(state)  # resuming delivers the rest, the failed batch first
    assert epoch_of(loader) == expected(path, order, 0)[failed_at:]


# ---- len -----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("drop_last", [False, True], ids=["keep_last", "drop_last"])
@pytest.mark.parametrize(("rank", "world_size"), [(0, 1), (0, 3), (2, 3), (3, 4)])
def test_len_is_the_number_of_batches_yielded(path, order, drop_last, rank, world_size):
    shard = {"rank": rank, "world_size": world_size} if world_size > 1 else {}
    with Loader(path, batch_size=BATCH, num_workers=2, order=order, seed=SEED, drop_last=drop_last, **shard) as loader:
        announced = len(loader)
        iterator = iter(loader)
        assert len(iterator) == announced
        batches = epoch_of(iterator)
        assert len(batches) == announced
        assert batches == [b.tolist() for b in loader.epoch_batches(0)]
        per_rank = SAMPLES // world_size if drop_last else -(-SAMPLES // world_size)
        assert announced == (per_rank // BATCH if drop_last else -(-per_rank // BATCH))
        assert sum(map(len, batches)) == (announced * BATCH if drop_last else per_rank)
        assert len(loader) == announced  # unchanged by iterating
        assert len(epoch_of(loader)) == announced  # and the next epoch too


@pytest.mark.parametrize("drop_last", [False, True], ids=["keep_last", "drop_last"])
def test_ranks_given_by_hand_partition_the_epoch(path, order, drop_last):
    world_size = 4
    shares = []
    for rank in range(world_size):
        with Loader(path, batch_size=BATCH, num_workers=0, order=order, seed=SEED, drop_last=drop_last,
                    rank=rank, world_size=world_size) as loader:
            shares.append([i for batch in epoch_of(loader) for i in batch])
    assert len({len(share) for share in shares}) == 1  # every rank the same number of samples
    everything = [i for share in shares for i in share]
    if drop_last:
        assert len(set(everything)) == len(everything)  # disjoint
    else:
        assert set(everything) == set(range(SAMPLES))  # padded by repeating: every sample at least once


# ---- several loaders, several threads ------------------------------------------------------------------------------


def test_two_loaders_over_one_file_interleaved(path, memory, num_workers):
    # one strategy object serves both Loaders
    with Loader(path, batch_size=BATCH, num_workers=num_workers, memory=memory, order=OrderOption.RANDOM,
                seed=SEED) as first, \
         Loader(path, batch_size=7, num_workers=num_workers, memory=memory, order=OrderOption.SEQUENTIAL) as second:
        a, b = iter(first), iter(second)
        got_a, got_b = [], []
        shake = np.random.default_rng(0)  # random pauses shake the workers' scheduling
        while True:
            batch_a = next(a, None)
            time.sleep(shake.uniform(0, 0.002))
            batch_b = next(b, None)
            if batch_a is None and batch_b is None:
                break
            if batch_a is not None:
                got_a.append(indices(batch_a))
            if batch_b is not None:
                got_b.append(indices(batch_b))
        assert got_a == expected(path, OrderOption.RANDOM, 0)
        assert got_b == [list(range(s, min(s + 7, SAMPLES))) for s in range(0, SAMPLES, 7)]


def _in_thread(function):
    result = {}

    def run():
        try:
            result["value"] = function()
        except BaseException as error:  # noqa: BLE001 - reported in the test's thread
            result["error"] = error

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(60)
    assert not thread.is_alive(), "the thread did not finish in 60 s"
    if "error" in result:
        raise result["error"]
    return result["value"]


def test_a_loader_built_in_one_thread_and_iterated_in_another(make, path, order):
    loader = _in_thread(make)
    try:
        assert epoch_of(loader) == expected(path, order, 0)
    finally:
        loader.close()
    with make() as loader:  # and the other way round
        assert _in_thread(lambda: epoch_of(loader)) == expected(path, order, 0)
        assert epoch_of(loader) == expected(path, order, 1)


# ---- dropping references mid-epoch ---------------------------------------------------------------------------------


def test_del_loader_mid_epoch_while_iterating_its_iterator(make, path, order):
    loader = make()
    iterator = iter(loader)
    received = [indices(next(iterator)) for _ in range(3)]
    del loader
    gc.collect()
    received += epoch_of(iterator)
    assert received == expected(path, order, 0)


@pytest.mark.parametrize("num_workers", [2], ids=["workers2"])
def test_del_loader_and_iterator_mid_epoch_ends_the_threads(make, path, order):
    gc.collect()
    workers_before, all_before = beton_threads("beton-worker-"), beton_threads()
    loader = make()
    iterator = iter(loader)
    assert indices(next(iterator)) == expected(path, order, 0)[0]
    assert beton_threads("beton-worker-") >= workers_before + 2
    del loader, iterator
    gc.collect()
    assert wait_for_threads(workers_before, "beton-worker-") <= workers_before
    assert wait_for_threads(all_before) <= all_before  # the process cache's page reader too


# ---- copies --------------------------------------------------------------------------------------------------------

COPIES = {"copy": copy.copy, "deepcopy": copy.deepcopy, "pickle": lambda loader: pickle.loads(pickle.dumps(loader))}


@pytest.mark.parametrize("how", list(COPIES))
def test_a_copy_mid_epoch_yields_what_the_original_yields_next(make, path, order, how):
    with make() as original:
        iterator = iter(original)
        received = [indices(next(iterator)) for _ in range(3)]
        duplicate = COPIES[how](original)
        try:
            assert duplicate is not original
            assert duplicate.state_dict() == original.state_dict()
            assert where(original.state_dict()) == (SEED, 0, 3)
            assert len(duplicate) == len(original)
            rest_of_copy = epoch_of(duplicate)  # the copy's iteration does not disturb the original's
            rest = epoch_of(iterator)
            assert rest_of_copy == rest == expected(path, order, 0)[3:]
            assert received + rest == expected(path, order, 0)
            original.close()  # closing one leaves the other working
            assert epoch_of(duplicate) == expected(path, order, 1)
        finally:
            duplicate.close()


@pytest.mark.parametrize("how", list(COPIES))
def test_a_copy_of_a_loader_with_a_drawn_seed_and_a_shard(path, memory, how):
    with Loader(path, batch_size=BATCH, num_workers=2, memory=memory, order=OrderOption.RANDOM,
                rank=1, world_size=3) as original:
        assert epoch_of(original) == [b.tolist() for b in original.epoch_batches(0)]
        duplicate = COPIES[how](original)  # between epochs: the copy starts the next one
        try:
            assert (duplicate.rank, duplicate.world_size, duplicate.seed) == (1, 3, original.seed)
            # both at once, in lockstep, on different epochs: the copy shares no slots, files or threads
            original.set_epoch(2)
            pairs = [(indices(a), indices(b)) for a, b in zip(duplicate, original)]
            assert [a for a, _ in pairs] == [b.tolist() for b in original.epoch_batches(1)]
            assert [b for _, b in pairs] == [b.tolist() for b in original.epoch_batches(2)]
        finally:
            duplicate.close()


# ---- with, close, keeping batches ----------------------------------------------------------------------------------


def test_iterating_a_loader_after_its_with_block_raises(make):
    with make() as loader:
        pass
    with pytest.raises(LoaderError, match="closed"):
        list(loader)
    with pytest.raises(LoaderError, match="closed"):
        next(iter(loader))


def test_iterating_a_closed_loader_raises(make, path, order):
    loader = make()
    assert epoch_of(loader) == expected(path, order, 0)
    loader.close()
    loader.close()  # twice is harmless
    with pytest.raises(LoaderError, match="closed"):
        for _ in loader:
            pass


@pytest.mark.parametrize("order", [OrderOption.SEQUENTIAL], ids=["sequential"])
@pytest.mark.parametrize("closing", ["with", "close"])
def test_an_iterator_of_a_closed_loader_raises_rather_than_ending_early(make, path, order, closing):
    """An iterator whose Loader was closed mid-epoch must not end as if its epoch were complete: a loop that
    consumes it afterwards would train on one batch of the epoch and never know (as a superseded iterator, it
    should raise LoaderError)."""
    if closing == "with":
        with make() as loader:
            iterator = iter(loader)
            first = indices(next(iterator))
    else:
        loader = make()
        iterator = iter(loader)
        first = indices(next(iterator))
        loader.close()
    assert first == expected(path, order, 0)[0]
    with pytest.raises(LoaderError):
        rest = epoch_of(iterator)
        pytest.fail(f"the iterator ended quietly after {len(rest)} more of {len(expected(path, order, 0)) - 1} "
                    f"batches")


def test_list_keeps_every_batch_valid_and_distinct(make, path, order):
    with make() as loader:
        kept = list(loader)
        assert [indices(batch) for batch in kept] == expected(path, order, 0)
        pointers = [tensor.data_ptr() for batch in kept for tensor in batch]
        assert len(set(pointers)) == len(pointers)  # no two kept batches share memory
        assert epoch_of(loader) == expected(path, order, 1)  # the slots are reused for another epoch...
        assert [indices(batch) for batch in kept] == expected(path, order, 0)  # ...the kept batches unchanged


# ---- settings assigned between epochs, as FFCV programs assign them ---------------------------------------------


@pytest.mark.parametrize("new_batch_size", [4, 27, 200])
def test_a_batch_size_assigned_between_epochs_plans_and_allocates_for_it(make, path, order, new_batch_size):
    """A larger batch size once wrote past the slots allocated for the first one (lost samples, a segfault)."""
    loader = make()
    assert epoch_of(loader) == expected(path, order, 0)
    loader.batch_size = new_batch_size
    assert len(loader) == -(-SAMPLES // new_batch_size)
    assert epoch_of(loader) == expected(path, order, 1, batch_size=new_batch_size)
    loader.set_epoch(0)
    assert epoch_of(loader) == expected(path, order, 0, batch_size=new_batch_size)


def test_a_batch_size_assigned_while_a_resumed_epoch_is_pending_delivers_the_rest_once(make, path, order):
    first = make()
    iterator = iter(first)
    taken = [indices(next(iterator)) for _ in range(3)]
    state = first.state_dict()
    iterator.close()
    loader = make()
    loader.load_state_dict(state)
    loader.batch_size = 7
    rest = epoch_of(loader)
    assert {len(batch) for batch in rest[:-1]} == {7}
    received = [i for batch in taken + rest for i in batch]
    assert sorted(received) == list(range(SAMPLES))
    assert epoch_of(loader) == expected(path, order, 1, batch_size=7)  # the next epoch: a fresh run's


def test_indices_assigned_between_epochs_select_those_samples_even_for_an_epoch_run_before(make, path, order):
    """The epoch's order was cached under (seed, epoch, plan): epoch 0 again gave the old selection."""
    loader = make()
    whole = [i for batch in epoch_of(loader) for i in batch]
    assert sorted(whole) == list(range(SAMPLES))
    loader.indices = [5, 3, 60, 61, 7]
    loader.set_epoch(0)
    chosen = [i for batch in epoch_of(loader) for i in batch]
    assert sorted(chosen) == [3, 5, 7, 60, 61]
    assert chosen == [i for batch in make(indices=[5, 3, 60, 61, 7]).epoch_batches(0) for i in batch.tolist()]
    with pytest.raises(IndexError):
        loader.indices = [SAMPLES]
    with pytest.raises(ValueError):  # the Loader's own array: changed in place it would not match its order
        loader.indices[0] = 4


def test_drop_last_and_next_epoch_assigned_between_epochs(make, path, order):
    loader = make()
    loader.drop_last = True
    loader.next_epoch = 2  # FFCV's attribute: the epoch the next iteration runs
    assert loader.next_epoch == 2
    batches = epoch_of(loader)
    assert batches == expected(path, order, 2)[:-1] and len(loader) == SAMPLES // BATCH == len(batches)
    assert loader.next_epoch == 3


@pytest.mark.parametrize("name, value", [("num_workers", 3), ("rank", 1), ("world_size", 2)])
def test_settings_fixed_at_construction_refuse_assignment_rather_than_being_ignored(make, name, value):
    loader = make()
    before = getattr(loader, name)
    with pytest.raises(AttributeError, match=f"{name}={value}"):
        setattr(loader, name, value)
    assert getattr(loader, name) == before


def test_a_checkpoint_of_a_broken_off_epoch_keeps_its_plan_when_the_batch_size_changes_after(make, path, order):
    """state_dict() described the interrupted epoch's position in the new batch size: a resume gave other samples."""
    loader = make()
    received = []
    for batch in loader:
        received.append(indices(batch))
        if len(received) == 3:
            break
    loader.batch_size = 4
    state = loader.state_dict()
    assert where(state) == (SEED, 0, 3) and state["batch_size"] == BATCH
    resumed = make(batch_size=6)
    resumed.load_state_dict(state)
    rest = [i for batch in epoch_of(resumed) for i in batch]
    assert sorted([i for batch in received for i in batch] + rest) == list(range(SAMPLES))
    assert epoch_of(loader) == expected(path, order, 1, batch_size=4)  # the loader itself goes on with epoch 1
