"""Resume on another world size or batch size: the rest of the epoch, each remaining sample once across the new
ranks, then epochs as a fresh run gives them; and states that do not fit are refused, naming what differs.

A job is simulated as its ranks would run it: one Loader per rank, all moving in step (as DDP's do), the
checkpoint taken from rank 0 (every rank's is the same).
"""

from __future__ import annotations


import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from beton import Loader, OrderOption
from beton.decoders import IntDecoder, NDArrayDecoder
from beton.errors import ResumeError
from beton.loader.resume import describe_order
from beton.fields import IntField, NDArrayField, RaggedArrayField, RGBImageField
from beton.memory import OSCache, ProcessCache
from beton.transforms import ToTensor
from beton.traversal_order import TraversalOrder

from conftest import small_image, write

COUNT = 97  # a prime: uneven ranks and partial batches everywhere
FIELDS = {"image": RGBImageField(write_mode="proportion", compress_probability=0.5),  # raw and JPEG: BALANCED
          "tokens": RaggedArrayField(np.int32, (None,)),  # lengths: BUCKETED
          "tag": NDArrayField(np.int64, (4,)), "index": IntField()}
PIPELINES = {"image": None, "tokens": None, "tag": [NDArrayDecoder()], "index": [IntDecoder(), ToTensor()]}
MEMORIES = {"os-cache": OSCache(), "process-cache": ProcessCache()}


def sample(i: int) -> tuple:
    return small_image(i), np.arange(i % 13 + 1, dtype=np.int32), np.full(4, i * 7, np.int64), i


@pytest.fixture(scope="module")
def whole(tmp_path_factory):
    return write(tmp_path_factory.mktemp("elastic") / "whole.beton", FIELDS, [sample(i) for i in range(COUNT)],
                 page_size=1024)


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    folder = tmp_path_factory.mktemp("elastic-shards")
    cuts = [0, 30, 31, 70, COUNT]
    return [str(write(folder / f"part-{k}.beton", FIELDS, [sample(i) for i in range(a, b)], page_size=1024))
            for k, (a, b) in enumerate(zip(cuts, cuts[1:]))]


class Job:
    """The ranks of one job over ``source``; ``batches(...)`` runs the next epoch on every rank in step."""

    def __init__(self, source, world_size: int, batch_size: int, drop_last: bool = False, **options) -> None:
        self.loaders = [Loader(source, batch_size=batch_size, num_workers=0, rank=rank, world_size=world_size,
                               drop_last=drop_last, pipelines=PIPELINES, **{"seed": 7, **options})
                        for rank in range(world_size)]

    def epoch(self, stop_after: int | None = None) -> list[list[list[int]]]:
        """Per rank, the sample indices of each batch it received (every payload checked against its index)."""
        iterators = [iter(loader) for loader in self.loaders]
        received: list[list[list[int]]] = [[] for _ in iterators]
        while stop_after is None or len(received[0]) < stop_after:
            batches = [next(iterator, None) for iterator in iterators]
            if batches[0] is None:
                assert all(batch is None for batch in batches), "the ranks got different numbers of batches"
                break
            for rank, (tag, index) in enumerate(batches):
                assert (tag == index.numpy()[:, None] * 7).all(), "a payload is not its sample's"
                received[rank].append(index.tolist())
        return received

    def state(self) -> dict:
        states = [loader.state_dict() for loader in self.loaders]
        assert all(state == states[0] for state in states), "the ranks' states differ"
        return states[0]

    def load(self, state: dict) -> Job:
        for loader in self.loaders:
            loader.load_state_dict(state)
        return self

    def close(self) -> None:
        for loader in self.loaders:
            loader.close()


def flat(per_rank: list[list[list[int]]]) -> list[int]:
    return [i for batches in per_rank for batch in batches for i in batch]


def check_elastic(source, old: tuple, new: tuple, position: int, **options) -> None:
    """Stop a job of ``old`` = (world_size, batch_size, drop_last) after ``position`` batches per rank, resume it
    as ``new``: the rest of the epoch holds every sample the stopped job had yet to receive, each once (but for
    the new plan's padding, or less what its drop_last drops), none it received; the next epoch is a fresh run's.
    A state at the epoch's start (``position`` 0) runs the whole epoch as the new job would."""
    reference = Job(source, *old, **options)
    uninterrupted = reference.epoch()
    reference.close()
    stopped = Job(source, *old, **options)
    received = stopped.epoch(stop_after=position)
    state = stopped.state()
    stopped.close()
    assert [rank[:position] for rank in uninterrupted] == received
    seen = set(flat(received))
    assert state["samples"] == len(seen)
    expected = set(flat([rank[position:] for rank in uninterrupted])) - seen  # old padding aside

    resumed = Job(source, *new, **options).load(state)
    rest_per_rank = resumed.epoch()
    following = resumed.epoch()
    resumed.close()
    fresh = Job(source, *new, **options)
    if position == 0:  # a state at the epoch's start: the epoch as a fresh run of the new job gives it
        assert rest_per_rank == fresh.epoch()
    else:
        for loader in fresh.loaders:
            loader.set_epoch(1)
    assert following == fresh.epoch()
    fresh.close()
    if position == 0:
        return
    if new == old:  # the same plan: each rank's own next batches, its padding included
        assert rest_per_rank == [rank[position:] for rank in uninterrupted]
        return
    rest = flat(rest_per_rank)
    world_size, batch_size, drop_last = new
    assert not set(rest) & seen, "a sample received before the checkpoint came again"
    if drop_last:
        assert set(rest) <= expected and len(expected - set(rest)) < world_size * batch_size
        assert len(rest) == len(set(rest))
    else:
        assert set(rest) == expected, "a sample the stopped job had yet to receive is missing"
        assert len(rest) - len(set(rest)) < world_size, "more repeats than padding to a multiple of the ranks"


TRANSITIONS = {"2x10-to-3x7": ((2, 10, False), (3, 7, False), 2), "4x5-to-1x16": ((4, 5, False), (1, 16, False), 3),
               "1x8-to-4x8": ((1, 8, False), (4, 8, False), 5), "3x6-to-2x6-drop-last": ((3, 6, True), (2, 6, True), 2)}


@pytest.mark.parametrize("memory", MEMORIES.values(), ids=MEMORIES.keys())
@pytest.mark.parametrize("order", list(OrderOption), ids=lambda order: order.name)
@pytest.mark.parametrize("transition", TRANSITIONS.values(), ids=TRANSITIONS.keys())
def test_every_order_resumes_on_another_world_size_and_batch_size(whole, order, memory, transition):
    old, new, position = transition
    check_elastic(whole, old, new, position, order=order, memory=memory)


@pytest.mark.parametrize("order", [OrderOption.RANDOM, OrderOption.QUASI_RANDOM, OrderOption.BUCKETED],
                         ids=lambda order: order.name)
def test_a_union_of_shards_resumes_on_another_world_size(shards, order):
    check_elastic(shards, (3, 8, False), (2, 5, False), 2, order=order)


@pytest.mark.parametrize("drop_last", [False, True])
def test_a_selection_resumes_on_another_world_size(whole, drop_last):
    selection = np.random.default_rng(3).permutation(COUNT)[:61]
    check_elastic(whole, (2, 4, drop_last), (3, 5, drop_last), 3, order=OrderOption.RANDOM, indices=selection)


def test_drop_last_may_change_on_resume(whole):
    check_elastic(whole, (2, 8, True), (2, 8, False), 2, order=OrderOption.RANDOM)
    check_elastic(whole, (2, 8, False), (3, 8, True), 2, order=OrderOption.RANDOM)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(old_world=st.integers(1, 4), old_batch=st.integers(1, 12), new_world=st.integers(1, 4),
       new_batch=st.integers(1, 12), old_drop=st.booleans(), new_drop=st.booleans(), data=st.data())
def test_any_world_sizes_batch_sizes_and_positions(whole, old_world, old_batch, new_world, new_batch, old_drop,
                                                     new_drop, data):
    with Loader(whole, batch_size=old_batch, rank=0, world_size=old_world, drop_last=old_drop,
                pipelines=PIPELINES) as probe:
        length = len(probe)
    position = data.draw(st.integers(0, length - 1), label="position")  # at the end, the state is the next epoch's
    order = data.draw(st.sampled_from([OrderOption.SEQUENTIAL, OrderOption.RANDOM, OrderOption.QUASI_RANDOM]))
    check_elastic(whole, (old_world, old_batch, old_drop), (new_world, new_batch, new_drop), position, order=order)


def test_resuming_twice_in_one_epoch_still_gives_every_sample_once(whole):
    first = Job(whole, 2, 6, order=OrderOption.QUASI_RANDOM)
    seen = flat(first.epoch(stop_after=3))
    state = first.state()
    first.close()
    second = Job(whole, 3, 4, order=OrderOption.QUASI_RANDOM).load(state)
    seen += flat(second.epoch(stop_after=2))
    state = second.state()
    second.close()
    assert [cut[:2] for cut in state["resumed"]] == [[2, 6]] and state["world_size"] == 3
    assert state["samples"] == len(seen) == len(set(seen))
    third = Job(whole, 1, 10, order=OrderOption.QUASI_RANDOM).load(state)
    rest = flat(third.epoch())
    third.close()
    assert sorted(seen + rest) == list(range(COUNT))


@pytest.mark.parametrize("new", [(2, 5), (1, 8)], ids=["another-plan", "the-same-plan"])
def test_a_loop_that_sets_each_epoch_resumes_the_one_it_sets_first(whole, new):
    """``for epoch in range(state["epoch"], n): loader.set_epoch(epoch); for batch in loader: ...`` (torch's
    habit) after load_state_dict: set_epoch(the state's epoch) started it over, replaying the samples trained before
    the checkpoint; another epoch still starts from its start."""
    first = Job(whole, 1, 8)
    for loader in first.loaders:
        loader.set_epoch(1)
    seen = flat(first.epoch(stop_after=4))
    state = first.state()
    first.close()
    resumed = Job(whole, *new).load(state)
    for loader in resumed.loaders:
        loader.set_epoch(state["epoch"])
    rest = flat(resumed.epoch())  # 2 ranks pad with a repeat of the rest's own first sample
    assert not set(seen) & set(rest) and set(seen) | set(rest) == set(range(COUNT))
    for loader in resumed.loaders:
        loader.set_epoch(1)  # the epoch just finished, again: from its start
    assert set(flat(resumed.epoch())) == set(range(COUNT))
    resumed.close()
    again = Job(whole, *new).load(state)
    for loader in again.loaders:
        loader.set_epoch(2)  # another epoch than the state's: the resume is dropped, that epoch starts
    fresh = Job(whole, *new)
    for loader in fresh.loaders:
        loader.set_epoch(2)
    assert again.epoch() == fresh.epoch()
    again.close()
    fresh.close()


def test_the_same_plan_resumes_batch_for_batch(whole):
    """Same world size and batch size: each rank goes on with exactly its own next batches."""
    job = Job(whole, 3, 5, order=OrderOption.RANDOM)
    uninterrupted = job.epoch()
    job.close()
    stopped = Job(whole, 3, 5, order=OrderOption.RANDOM)
    stopped.epoch(stop_after=4)
    resumed = Job(whole, 3, 5, order=OrderOption.RANDOM).load(stopped.state())
    stopped.close()
    assert resumed.epoch() == [rank[4:] for rank in uninterrupted]
    resumed.close()


# ---- states that do not fit ------------------------------------------------------------------------------------

def saved_state(source, **options) -> dict:
    with Loader(source, batch_size=8, num_workers=0, pipelines=PIPELINES, **{"seed": 7, **options}) as loader:
        iterator = iter(loader)
        next(iterator)
        return loader.state_dict()


def refusal(source, state, **options) -> str:
    with Loader(source, batch_size=8, num_workers=0, pipelines=PIPELINES, **{"seed": 7, **options}) as loader:
        with pytest.raises(ResumeError) as raised:
            loader.load_state_dict(state)
    return str(raised.value)


def test_a_state_of_another_dataset_order_selection_or_seed_is_refused_naming_it(whole, shards, tmp_path):
    state = saved_state(whole, order=OrderOption.RANDOM)
    other = write(tmp_path / "other.beton", FIELDS, [sample(i + 1) for i in range(COUNT)], page_size=1024)
    assert "another file or set of shards" in refusal(other, state, order=OrderOption.RANDOM)
    assert "another file or set of shards" in refusal(shards, state, order=OrderOption.RANDOM)
    assert "another order" in refusal(whole, state, order=OrderOption.QUASI_RANDOM)
    assert "window_pages" in refusal(whole, saved_state(whole, order=OrderOption.QUASI_RANDOM,
                                                         order_kwargs={"window_pages": 2}),
                                     order=OrderOption.QUASI_RANDOM, order_kwargs={"window_pages": 3})
    assert "another selection" in refusal(whole, state, order=OrderOption.RANDOM, indices=range(50))
    assert "seed=7" in refusal(whole, state, order=OrderOption.RANDOM, seed=8)


def test_the_same_content_under_another_path_resumes(whole, tmp_path):
    copy = tmp_path / "moved.beton"
    copy.write_bytes(whole.read_bytes() if hasattr(whole, "read_bytes") else open(whole, "rb").read())
    state = saved_state(whole, order=OrderOption.RANDOM)
    with Loader(copy, batch_size=8, num_workers=0, pipelines=PIPELINES, seed=None, order=OrderOption.RANDOM) as moved:
        moved.load_state_dict(state)  # seed=None takes the state's
        assert moved.state_dict() == state


@pytest.mark.parametrize("change, message", [
    (lambda state: {}, "has no 'seed'"),
    (lambda state: [1, 2], "takes the dict"),
    (lambda state: {key: value for key, value in state.items() if key != "samples"}, "has no 'samples'"),
    (lambda state: {**state, "position": 2.5}, "'position' must be an integer"),
    (lambda state: {**state, "world_size": 0}, "'world_size' must be an integer between 1 and 1048576"),
    (lambda state: {**state, "world_size": 10**12}, "'world_size' must be an integer between 1 and 1048576"),
    (lambda state: {**state, "resumed": [[10**12, 4, False, 1]]}, "'world_size' must be an integer between 1"),
    (lambda state: {**state, "drop_last": "no"}, "'drop_last' must be True or False"),
    (lambda state: {**state, "resumed": [[2, 8]]}, "'resumed' must be a list"),
    (lambda state: {**state, "extra": 1}, "does not write: ['extra']"),
    # well-formed, but 'samples' (8) is not what the plans delivered: they would resume into another rest
    (lambda state: {**state, "samples": 9}, "its 'samples' is 9, but its plans"),
    (lambda state: {**state, "position": 3}, "its 'samples' is 8, but its plans"),
    (lambda state: {**state, "batch_size": 10**12}, f"delivered {COUNT} samples of epoch 0"),
    (lambda state: {**state, "resumed": [[2, 4, False, 1]]}, "its 'samples' is 8, but its plans"),
], ids=["empty", "not-a-dict", "missing-key", "fractional-position", "no-ranks", "too-many-ranks",
        "too-many-ranks-before", "drop-last-text", "short-cut", "unknown-key", "edited-samples", "edited-position",
        "huge-batch", "added-plan"])
def test_a_malformed_state_is_refused_naming_the_key(whole, change, message):
    state = saved_state(whole)
    assert message in refusal(whole, change(state))


def test_a_position_past_the_epoch_is_refused_when_iterating(whole):
    state = {**saved_state(whole), "position": 99, "samples": COUNT}  # consistent: every sample delivered
    with Loader(whole, batch_size=8, num_workers=0, pipelines=PIPELINES, seed=7) as loader:
        loader.load_state_dict(state)
        with pytest.raises(ResumeError, match="position 99 lies past the 13 batches"):
            iter(loader)


def test_a_refused_state_leaves_the_loader_as_it_was(whole):
    with Loader(whole, batch_size=8, num_workers=0, pipelines=PIPELINES, seed=7) as loader:
        iterator = iter(loader)
        next(iterator)
        before = loader.state_dict()
        with pytest.raises(ResumeError):
            loader.load_state_dict({**before, "order": "another"})
        assert loader.state_dict() == before
        assert len(list(iterator)) == len(loader) - 1  # the open epoch goes on


class SeededShuffle(TraversalOrder):  # FFCV's kind of order: reads the Loader's seed when built
    def sample_order(self, epoch: int) -> np.ndarray:
        return np.random.default_rng((self.seed, epoch)).permutation(self.indices)


def test_a_state_refused_for_its_count_leaves_the_seed_and_order_as_they_were(whole):
    state = {**saved_state(whole, seed=11), "samples": 3}
    for order in (OrderOption.RANDOM, SeededShuffle):
        with Loader(whole, batch_size=8, num_workers=0, pipelines=PIPELINES, seed=None, order=order) as loader:
            seed, built, first = loader.seed, loader.order, loader.epoch_batches(0)
            with pytest.raises(ResumeError, match="does not hold together"):
                loader.load_state_dict({**state, "order": describe_order(loader.order)})
            assert (loader.seed, loader.order) == (seed, built)
            assert all(np.array_equal(a, b) for a, b in zip(loader.epoch_batches(0), first))
