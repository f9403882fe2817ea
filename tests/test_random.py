"""The four seed schemes of beton.random, pinned: these values are what users' files, orders and augmentations
were made with, so a change to any scheme (even one that keeps it "as random") must fail here.

The values were computed by the code before the schemes moved into beton.random; each scheme is also checked
through the API that uses it (orders, BatchContext, EncodeContext, DatasetWriter), so a consumer that stops
calling its scheme fails too.
"""

from __future__ import annotations

import numpy as np
import pytest

import beton
from beton.fields import IntField
from beton.fields.base import EncodeContext
from beton.order import BalancedOrder, OrderContext, QuasiRandomOrder, RandomOrder
from beton.pipeline.operation import BatchContext
from beton.random import batch_rng, encode_rng, integer, operation_key, order_rng, uniform, writer_shuffle

KEY = operation_key(7, 3, 1, 2)
PAGES = np.repeat(np.arange(6), 5)  # 30 samples, 5 per page


def test_kernel_scheme_is_pinned():
    assert int(KEY) == 2086008792086238325
    assert int(operation_key(0, 0, 0, 0)) == 11708687640548437744
    assert [uniform(KEY, sample, draw) for sample, draw in [(0, 0), (5, 1), (123456, 7)]] == \
        [0.594992268776138, 0.6156291454451721, 0.2890312520843]
    assert [integer(KEY, sample, 2, 10, 20) for sample in range(5)] == [15, 15, 12, 15, 12]


def test_batch_scheme_is_pinned_and_used_by_batch_context():
    expected = [0.24185293336496705, 0.41529562989221436, 0.039789544259757004]
    assert batch_rng(7, 3, 5, "mixup").random(3).tolist() == expected
    context = BatchContext(samples=np.arange(4), epoch=3, key=KEY, batch=5, seed=7)
    assert context.batch_rng("mixup").random(3).tolist() == expected
    assert context.batch_rng("mixup").integers(0, 1000, 3).tolist() == [244, 241, 558]
    assert context.batch_rng("other").random() != expected[0]


def test_writer_schemes_are_pinned_and_used_by_the_writer(tmp_path):
    expected = [0.2975614812611913, 0.3927043948341896, 0.9495178680363671]
    assert encode_rng(7, 11, 2).random(3).tolist() == expected
    assert EncodeContext(sample=11, field=2, seed=7).rng().random(3).tolist() == expected
    assert writer_shuffle(3, range(12)) == [11, 5, 0, 1, 10, 6, 4, 2, 7, 3, 8, 9]
    path = tmp_path / "shuffled.beton"
    beton.DatasetWriter(path, {"n": IntField()}, seed=3, num_workers=0, progress=False).from_indexed_dataset(
        [(i,) for i in range(12)], shuffle_indices=True)
    with beton.Reader(path) as reader:
        assert [reader[i][0] for i in range(12)] == [11, 5, 0, 1, 10, 6, 4, 2, 7, 3, 8, 9]


@pytest.mark.parametrize("order, context, expected", [
    (RandomOrder(), OrderContext(PAGES, 4),
     [22, 29, 21, 25, 28, 12, 3, 13, 17, 7, 20, 10, 2, 5, 19, 4, 18, 8, 23, 0, 24, 11, 15, 14, 27, 16, 26, 1, 9, 6]),
    (QuasiRandomOrder(), OrderContext(PAGES, 4),
     [10, 27, 15, 8, 19, 29, 9, 7, 18, 26, 14, 28, 13, 16, 12, 11, 5, 25, 6, 17, 23, 1, 4, 20, 24, 21, 0, 22, 2, 3]),
    (QuasiRandomOrder(window_pages=2), OrderContext(PAGES, 4),
     [27, 8, 29, 9, 7, 26, 28, 5, 25, 6, 10, 15, 19, 18, 14, 13, 16, 12, 11, 17, 23, 1, 4, 20, 24, 21, 0, 22, 2, 3]),
    (BalancedOrder(), OrderContext(PAGES, 4, {"image": (np.arange(30) % 3 == 0).astype(np.uint8)}),
     [8, 10, 19, 27, 15, 29, 7, 9, 14, 26, 18, 28, 12, 13, 11, 16, 25, 24, 6, 5, 21, 17, 23, 1, 4, 20, 22, 0, 3, 2]),
], ids=["random", "quasi_random", "quasi_random_window_2", "balanced"])
def test_order_scheme_is_pinned(order, context, expected):
    assert order.permutation(np.arange(30), 7, 3, context).tolist() == expected


def test_order_rng_is_keyed_by_seed_and_epoch_only():
    assert order_rng(7, 3).permutation(30).tolist() == RandomOrder().permutation(
        np.arange(30), 7, 3, OrderContext(PAGES, 4)).tolist()
    assert order_rng(7, 3).random() == order_rng(7, 3).random() != order_rng(7, 4).random()
