"""BUCKETED: batches of similar length, a pure function of (seed, epoch), sharded step by step across ranks."""

from __future__ import annotations

import numpy as np
import pytest

from beton import Loader, OrderOption
from beton.decoders import RaggedDecoder
from beton.errors import LoaderError, PipelineError
from beton.fields import BytesField, IntField, RaggedArrayField
from beton.order import BucketedOrder, OrderContext, RandomOrder, shard
from beton.order.base import repeat_first

from conftest import write


def long_tailed(count: int, seed: int = 0) -> np.ndarray:
    return np.minimum(16 + np.random.default_rng(seed).pareto(1.5, count) * 60, 2048).astype(np.int64)


def context(lengths: np.ndarray, batch_size: int, world_size: int = 1, drop_last: bool = False) -> OrderContext:
    return OrderContext(np.zeros(len(lengths), np.int64), batch_size, {}, {"tokens": lengths}, world_size, drop_last)


def rank_batches(order: np.ndarray, rank: int, world_size: int, batch_size: int, drop_last: bool,
                 made: OrderContext | None = None) -> list:
    """Rank ``rank``'s batches as the Loader cuts them (padded as BUCKETED pads, given its context)."""
    pad = (lambda o, total: BucketedOrder().pad(o, total, made)) if made is not None else repeat_first
    mine = shard(order, rank, world_size, drop_last, pad)
    count = len(mine) // batch_size if drop_last else -(-len(mine) // batch_size)
    return [mine[b * batch_size : (b + 1) * batch_size] for b in range(count)]


@pytest.mark.parametrize("count", [0, 1, 7, 64, 1000, 1003])
@pytest.mark.parametrize("world_size", [1, 2, 3, 8])
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("seed, epoch", [(0, 0), (5, 3)])
def test_every_sample_once_and_the_same_for_the_same_seed_and_epoch(count, world_size, drop_last, seed, epoch):
    lengths = long_tailed(count)
    indices = np.arange(count, dtype=np.int64)[::-1].copy()  # a selection in any order
    made = context(lengths, 16, world_size, drop_last)
    order = BucketedOrder(pool_batches=4).permutation(indices, seed, epoch, made)
    assert sorted(order.tolist()) == sorted(indices.tolist())
    assert np.array_equal(order, BucketedOrder(pool_batches=4).permutation(indices, seed, epoch, made))
    if count > 16:
        assert not np.array_equal(order, BucketedOrder(pool_batches=4).permutation(indices, seed, epoch + 1, made))


@pytest.mark.parametrize("world_size", [1, 2, 4])
@pytest.mark.parametrize("drop_last", [False, True])
def test_batches_hold_similar_lengths_and_ranks_train_on_similar_lengths_at_each_step(world_size, drop_last):
    count, batch = 20_000, 32
    lengths = long_tailed(count)
    indices = np.arange(count, dtype=np.int64)
    made = context(lengths, batch, world_size, drop_last)
    bucketed = BucketedOrder().permutation(indices, 1, 0, made)
    shuffled = RandomOrder().permutation(indices, 1, 0, made)

    def padding(order):  # padded slots per real token, over every rank's batches
        batches = [b for r in range(world_size) for b in rank_batches(order, r, world_size, batch, drop_last, made)]
        return sum(len(b) * lengths[b].max() - lengths[b].sum() for b in batches) / lengths.sum()

    assert padding(bucketed) < 0.1 * padding(shuffled)
    per_rank = [rank_batches(bucketed, r, world_size, batch, drop_last, made) for r in range(world_size)]
    steps = count // (world_size * batch)
    for step in range(steps):  # a step's batches come from one sorted run: rank r's longest <= rank r+1's shortest
        for r in range(world_size - 1):
            assert lengths[per_rank[r][step]].max() <= lengths[per_rank[r + 1][step]].min()
    assert len({len(batches) for batches in per_rank}) == 1  # every rank the same number of batches


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("count", [1, 2, 5, 95, 96, 97, 100, 1003])
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("batch", [1, 8])
def test_uneven_counts_keep_every_batch_one_bucket_every_sample_and_the_same_batches_on_every_rank(
        world_size, count, drop_last, batch):
    # Distinct lengths and one pool holding every sample: the walk is sorted, so a batch holds one bucket
    # exactly when its samples are neighbours in length, i.e. their lengths are consecutive integers.
    lengths = np.random.default_rng(count).permutation(count).astype(np.int64)
    made = context(lengths, batch, world_size, drop_last)
    order = BucketedOrder(pool_batches=10**6).permutation(np.arange(count, dtype=np.int64), 3, 1, made)
    per_rank = [rank_batches(order, r, world_size, batch, drop_last, made) for r in range(world_size)]
    assert len({len(batches) for batches in per_rank}) == 1  # every rank trains as many batches
    batches = [b for batches in per_rank for b in batches]
    for b in batches:
        distinct = np.unique(lengths[b])
        assert distinct[-1] - distinct[0] + 1 == len(distinct), f"a batch mixes lengths {lengths[b].tolist()}"
        assert len(b) == batch or not drop_last
    used = np.concatenate(batches) if batches else np.zeros(0, np.int64)
    if drop_last:  # each sample at most once; no more dropped than the remainders of the ranks and batches
        assert len(np.unique(used)) == len(used)
        assert count - len(used) < world_size + world_size * batch
    else:  # each sample at least once; fewer than world_size repeated
        assert set(used.tolist()) == set(range(count))
        assert len(used) - count < world_size


def test_the_loader_pads_bucketed_ranks_within_their_batches(tmp_path):
    lengths = np.random.default_rng(5).permutation(97) + 1
    path = write(tmp_path / "t.beton", {"tokens": RaggedArrayField(np.int32, (None,)), "index": IntField()},
                 [(np.full(n, i, np.int32), i) for i, n in enumerate(lengths)])
    seen = []
    for rank in range(3):
        with Loader(path, batch_size=8, num_workers=1, seed=1, order=BucketedOrder(pool_batches=1000),
                    rank=rank, world_size=3, pipelines={"tokens": [RaggedDecoder(128)]}) as loader:
            batches = [(padded.lengths.copy(), index.numpy().copy()) for padded, index in loader]
        assert len(batches) == len(loader) == 5
        for batch_lengths, index in batches:
            np.testing.assert_array_equal(batch_lengths, lengths[index])
            distinct = np.unique(batch_lengths)
            assert distinct[-1] - distinct[0] + 1 == len(distinct)
        seen += [i for _, index in batches for i in index.tolist()]
    assert sorted(set(seen)) == list(range(97)) and len(seen) == 99  # 97 samples, 2 repeated to give 3 x 33


def test_the_loader_buckets_by_the_stored_lengths_and_resumes(tmp_path):
    lengths = long_tailed(600, seed=2)
    path = write(tmp_path / "t.beton", {"tokens": RaggedArrayField(np.int32, (None,)), "index": IntField()},
                 [(np.full(n, i, np.int32), i) for i, n in enumerate(lengths)])
    pipelines = {"tokens": [RaggedDecoder(64)]}
    with Loader(path, batch_size=20, num_workers=2, seed=4, order=OrderOption.BUCKETED, pipelines=pipelines) as loader:
        batches = list(loader)
        assert sorted(i for _, index in batches for i in index.tolist()) == list(range(600))
        for padded, index in batches:
            np.testing.assert_array_equal(padded.lengths, np.minimum(lengths[index.numpy()], 64))
        shuffled = np.random.default_rng(0).permutation(600).reshape(-1, 20)
        padding = [sum(len(b) * lengths[b].max() - lengths[b].sum() for b in order)
                   for order in ([index.numpy() for _, index in batches], shuffled)]
        assert padding[0] < 0.2 * padding[1]  # the longest batch (the tail) pads most
        loader.set_epoch(1)
        epoch = iter(loader)
        for _ in range(7):
            next(epoch)
        state = loader.state_dict()
        rest = [index.clone() for _, index in epoch]
    with Loader(path, batch_size=20, num_workers=1, order=OrderOption.BUCKETED, pipelines=pipelines) as resumed:
        resumed.load_state_dict(state)
        again = [index for _, index in resumed]
    assert len(again) == len(rest) == 23 and all((a == b).all() for a, b in zip(again, rest))


def test_which_field_to_bucket_by(tmp_path):
    samples = [(np.zeros(i % 9, np.int32), bytes(i % 5), i) for i in range(40)]
    both = write(tmp_path / "both.beton", {"tokens": RaggedArrayField(np.int32, (None,)), "blob": BytesField(),
                                           "i": IntField()}, samples)
    none = write(tmp_path / "none.beton", {"i": IntField()}, [(i,) for i in range(40)])
    pipelines = {"tokens": [RaggedDecoder(8)], "blob": None}
    with pytest.raises(PipelineError, match=r"name one with BucketedOrder\(field=\.\.\.\).*\['blob', 'tokens'\]"):
        next(iter(Loader(both, batch_size=8, order=OrderOption.BUCKETED, pipelines=pipelines)))
    with pytest.raises(PipelineError, match="this file has none"):
        next(iter(Loader(none, batch_size=8, order=OrderOption.BUCKETED)))
    with Loader(both, batch_size=8, order=OrderOption.BUCKETED, order_kwargs={"field": "blob"},
                pipelines=pipelines) as loader:
        for _, index in loader:
            assert len({int(i) % 5 for i in index}) <= 2  # byte strings of one or two lengths per batch
    with pytest.raises(ValueError):
        BucketedOrder(pool_batches=0)


def test_a_custom_orders_padding_of_the_wrong_length_is_refused():
    with pytest.raises(LoaderError, match=r"gave 6 samples; 2 ranks of 4 need 8"):
        shard(np.arange(7), 0, 2, False, pad=lambda order, total: order[:6])
    assert shard(np.arange(7), 1, 2, False).tolist() == [4, 5, 6, 0]  # the default: torch's repeat-first
