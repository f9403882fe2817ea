"""Orders: permutations, determinism, sharding and QUASI_RANDOM's page bounds, over seeds x epochs x ranks."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, strategies as st

import beton
import beton.errors

from beton.order import (ORDERS, Order, OrderContext, OrderOption, QuasiRandomOrder, RandomOrder, SequentialOrder,
                         shard)
from beton.order.base import shard_sizes
from beton.order.quasi_random import expected_uniform_pages
from beton.order.remainder import Interruption, consumed_and_left, remainder

PAGES = np.repeat(np.arange(40), 25)  # 1,000 samples, 25 per page
CONTEXT = OrderContext(PAGES, batch_size=50)
ALL_ORDERS = [SequentialOrder(), RandomOrder(), QuasiRandomOrder(), QuasiRandomOrder(window_pages=3)]
# Test ids that are the same in every process (pytest-xdist's workers must collect the same names).
ORDER_IDS = ["sequential", "random", "quasi_random", "quasi_random_3_pages"]


@pytest.mark.parametrize("order", ALL_ORDERS, ids=ORDER_IDS)
@pytest.mark.parametrize("seed", [0, 1, 12345])
@pytest.mark.parametrize("epoch", [0, 1, 7])
def test_every_index_once_and_deterministic(order, seed, epoch):
    indices = np.arange(3, 1000, 2)
    permutation = order.permutation(indices, seed, epoch, CONTEXT)
    assert sorted(permutation.tolist()) == indices.tolist()
    assert np.array_equal(permutation, order.permutation(indices, seed, epoch, CONTEXT))


@pytest.mark.parametrize("order", ALL_ORDERS[1:], ids=ORDER_IDS[1:])
def test_random_orders_change_with_seed_and_epoch(order):
    indices = np.arange(1000)
    base = order.permutation(indices, 0, 0, CONTEXT)
    assert not np.array_equal(base, order.permutation(indices, 1, 0, CONTEXT))
    assert not np.array_equal(base, order.permutation(indices, 0, 1, CONTEXT))


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
@pytest.mark.parametrize("length", [0, 1, 12, 13])
@pytest.mark.parametrize("drop_last", [False, True])
def test_shards_have_equal_sizes_and_cover_the_order(world_size, length, drop_last):
    order = np.arange(100, 100 + length)
    parts = [shard(order, rank, world_size, drop_last) for rank in range(world_size)]
    assert len({len(part) for part in parts}) == 1
    joined = np.concatenate(parts)
    if drop_last:
        assert np.array_equal(joined, order[: len(joined)]) and len(order) - len(joined) < world_size
    else:
        assert set(joined.tolist()) == set(order.tolist())
        assert len(joined) - len(order) < world_size  # only the padding repeats
        if length % world_size == 0:
            assert np.array_equal(joined, order)  # an exact partition


def pages_per_batch(permutation, batch_size):
    return [len(np.unique(PAGES[permutation[b : b + batch_size]])) for b in range(0, len(permutation), batch_size)]


@pytest.mark.parametrize("seed", range(5))
def test_quasi_random_mixes_pages_and_stays_in_its_window(seed):
    """Measure: mean distinct pages per batch, QUASI_RANDOM (default window) vs a uniform shuffle."""
    indices = np.arange(1000)
    uniform = np.mean(pages_per_batch(RandomOrder().permutation(indices, seed, 0, CONTEXT), 50))
    quasi = pages_per_batch(QuasiRandomOrder().permutation(indices, seed, 0, CONTEXT), 50)
    assert np.mean(quasi) >= 0.5 * uniform
    window = expected_uniform_pages(PAGES, 50)
    assert max(quasi) <= 2 * window
    small = pages_per_batch(QuasiRandomOrder(window_pages=3).permutation(indices, seed, 0, CONTEXT), 50)
    assert max(small) <= 2 * 3


def test_quasi_random_uses_each_page_in_one_contiguous_run_of_batches():
    permutation = QuasiRandomOrder(window_pages=4).permutation(np.arange(1000), 3, 2, CONTEXT)
    batch_of_position = np.arange(1000) // 50
    for page in range(40):
        batches = np.unique(batch_of_position[np.isin(permutation, np.flatnonzero(PAGES == page))])
        # the batches that use a page span at most its window (4 pages * 25 samples) plus a boundary batch
        assert batches.max() - batches.min() <= 4 * 25 // 50 + 1


def test_orders_are_picked_from_the_mapping(image_file, monkeypatch):
    from beton import Loader

    assert set(ORDERS) == set(OrderOption)
    with pytest.raises(ValueError):
        QuasiRandomOrder(window_pages=0)
    for option in OrderOption:
        marker = type(f"Marked{option.name}", (RandomOrder,), {"__init__": lambda self, **kwargs: None})
        monkeypatch.setitem(ORDERS, option, marker)
        with Loader(image_file, batch_size=8, num_workers=1, order=option) as loader:
            assert type(loader.order) is marker, option


def test_ffcv_style_traversal_orders_and_order_classes(image_file):
    from beton import Loader
    from beton.traversal_order import Random, TraversalOrder

    class Backwards(TraversalOrder):  # FFCV's contract: built with the loader, asked for each epoch's order
        def sample_order(self, epoch):
            return self.indices[::-1] if epoch % 2 == 0 else self.indices

    with Loader(image_file, batch_size=50, num_workers=1, order=Backwards) as loader:
        assert [int(i) for i in np.concatenate(loader.epoch_batches(0))] == list(range(202, -1, -1))
        assert [int(i) for i in np.concatenate(loader.epoch_batches(1))] == list(range(203))
    halves = []
    for rank in range(2):
        with Loader(image_file, batch_size=50, num_workers=1, order=Backwards, rank=rank, world_size=2,
                    drop_last=True) as loader:
            halves.append([int(i) for i in np.concatenate(loader.epoch_batches(0))])
    assert halves == [list(range(202, 101, -1))[:100], list(range(101, 0, -1))[:100]]
    with Loader(image_file, batch_size=50, num_workers=1, order=Random, seed=4) as by_class, \
            Loader(image_file, batch_size=50, num_workers=1, order=beton.OrderOption.RANDOM, seed=4) as by_option:
        assert [b.tolist() for b in by_class.epoch_batches(0)] == [b.tolist() for b in by_option.epoch_batches(0)]

    class Outside(TraversalOrder):
        def sample_order(self, epoch):
            return [0, 1, 999]

    with Loader(image_file, batch_size=50, num_workers=1, order=Outside) as loader:
        with pytest.raises(beton.errors.PipelineError, match="outside the Loader's selected samples"):
            loader.epoch_batches(0)

    class Floats(TraversalOrder):  # were truncated to whole numbers; FFCV's indexing with them raises
        def sample_order(self, epoch):
            return self.indices[::-1] + 0.5

    with Loader(image_file, batch_size=50, num_workers=1, order=Floats) as loader:
        with pytest.raises(beton.errors.PipelineError, match=r"Floats.sample_order\(0\) must return whole sample "
                                                             "numbers, got an array of float64"):
            loader.epoch_batches(0)


class _Returns(Order):
    """A custom order that returns what it is given, whatever the indices (to test what the Loader accepts)."""

    def __init__(self, result, padding=None):
        self.result, self.padding = result, padding

    def permutation(self, indices, seed, epoch, context):
        return self.result

    def pad(self, order, total, context):
        return order if self.padding is None else np.concatenate([order, self.padding])[:total]


@pytest.mark.parametrize("result, message", [
    (np.r_[np.arange(202), 203], r"returned sample 203, outside the file's samples \[0, 203\)"),  # read unchecked
    (np.r_[np.arange(202), 2**40], "returned sample 1099511627776, outside"),                        # a crash before
    (np.r_[np.arange(202), -1], "returned sample -1, outside"),
    (np.r_[np.arange(202), 0], r"left out sample 202 \(and so returned another more than once\)"),
    (np.arange(200), r"returned 200 samples; it must return every one of the selected samples exactly once \(203\)"),
    (np.arange(203.0), "must return a 1-D array of whole sample numbers, got an array of float64"),
], ids=["past_the_file", "far_past_the_file", "negative", "repeated", "too_few", "floats"])
def test_a_custom_order_that_is_not_a_permutation_is_refused_when_the_epoch_starts(image_file, result, message):
    from beton import Loader

    with Loader(image_file, batch_size=50, num_workers=1, order=_Returns(result)) as loader:
        with pytest.raises(beton.errors.LoaderError, match=message):
            iter(loader)
    with Loader(image_file, batch_size=50, num_workers=1, order=_Returns(np.arange(203)[::-1])) as loader:
        assert [int(i) for i in np.concatenate(loader.epoch_batches(0))] == list(range(202, -1, -1))
        assert [int(label) for _, label in loader for label in label] == list(range(202, -1, -1))


def test_a_custom_order_over_selected_samples_must_return_each_as_often_as_selected(image_file):
    from beton import Loader

    selected = np.array([5, 9, 9, 40])  # indices= may repeat a sample
    for result, message in [(np.array([9, 5, 40, 40]), r"returned sample 9 1 time\(s\), selected 2 time\(s\)"),
                            (np.array([9, 5, 40, 7]), r"returned sample 7 1 time\(s\), selected 0 time\(s\)")]:
        with Loader(image_file, batch_size=2, num_workers=1, indices=selected, order=_Returns(result)) as loader:
            with pytest.raises(beton.errors.LoaderError, match=message):
                iter(loader)
    with Loader(image_file, batch_size=2, num_workers=1, indices=selected, order=_Returns(selected[::-1])) as loader:
        assert [int(label) for _, label in loader for label in label] == [40, 9, 9, 5]


@pytest.mark.parametrize("padding", [np.array([203]), np.array([2**40])], ids=["past_the_file", "far_past_the_file"])
def test_a_custom_padding_of_samples_outside_the_order_is_refused(image_file, padding):
    from beton import Loader

    with Loader(image_file, batch_size=50, num_workers=1, order=_Returns(np.arange(203), padding), rank=1,
                world_size=2) as loader:  # 203 samples on 2 ranks: one padding sample
        with pytest.raises(beton.errors.LoaderError, match="must return the order followed by samples of it again"):
            iter(loader)


def _spans_of_every_rank(count, cut):
    """The remainder's reference: every rank of the plan, those past the order's end included."""
    per_rank, _ = shard_sizes(count, cut.world_size, cut.drop_last)
    delivered = per_rank // cut.batch_size * cut.batch_size if cut.drop_last else per_rank
    return [(rank * per_rank, max(rank * per_rank, min(rank * per_rank + delivered, count)),
             min(cut.position * cut.batch_size, max(0, min(rank * per_rank + delivered, count) - rank * per_rank)))
            for rank in range(cut.world_size)]


@given(count=st.integers(0, 60), world_size=st.integers(1, 150), batch_size=st.integers(1, 9),
       drop_last=st.booleans(), position=st.integers(0, 12))
def test_the_remainder_of_a_plan_with_more_ranks_than_samples_is_that_of_every_rank(count, world_size, batch_size,
                                                                                  drop_last, position):
    cut = Interruption(world_size, batch_size, drop_last, position)
    spans = _spans_of_every_rank(count, cut)
    received = sum(taken for _, _, taken in spans)
    assert consumed_and_left(count, cut) == (received, sum(end - start for start, end, _ in spans) - received)
    order = np.arange(count) * 7
    assert remainder(order, cut).tolist() == [v for s, e, t in spans for v in order[s + t : e].tolist()]


def test_a_state_s_world_size_bounds_no_loop():
    """A crafted state's world size of 10**7 spent 12 s in a loop over ranks that hold nothing."""
    assert consumed_and_left(97, Interruption(10**12, 4, False, 1)) == (97, 0)
    assert remainder(np.arange(97), Interruption(10**12, 4, False, 0)).tolist() == list(range(97))
    assert consumed_and_left(97, Interruption(10**12, 4, True, 1)) == (0, 0)  # every rank's share is dropped
