"""Loader: correct data in every configuration, partial batches, dropping fields, resume, copies."""

from __future__ import annotations

import dataclasses
import threading

import numpy as np
import pytest
import torch

import beton
import beton.order
from beton import Loader, OrderOption
from beton.errors import PipelineError
from beton.decoders import BytesDecoder, IntDecoder, JSONDecoder, NDArrayDecoder, RaggedDecoder, SimpleRGBImageDecoder
from beton.fields import IntField, RaggedArrayField, RGBImageField
from beton.loader import CompileOptions
from beton.memory import OSCache, ProcessCache
from beton.traversal_order import TraversalOrder
from beton.transforms import Convert, ImageMixup, LabelMixup, PadToLongest, Squeeze, ToTensor, ToTorchImage
from beton.transforms.flip import RandomHorizontalFlip

from conftest import ANY_FILE_ORDERS, MIXED_FIELDS, mixed_sample, small_image, write
from resume_conformance import check_resume, where


@pytest.fixture(scope="module")
def image_mix_file(tmp_path_factory):
    """60 images, about half stored raw and half as JPEG: what the BALANCED order balances."""
    path = tmp_path_factory.mktemp("mix") / "mix.beton"
    return write(path, {"image": RGBImageField(write_mode="proportion", compress_probability=0.5),
                        "label": IntField()}, [(small_image(i), i) for i in range(60)], page_size=1024)


def labels_of(loader):
    return [batch[1].tolist() for batch in loader]


@pytest.mark.parametrize("os_cache", [True, False])
@pytest.mark.parametrize("order", ANY_FILE_ORDERS)
def test_batches_hold_the_right_samples(image_file, order, os_cache):
    with Loader(image_file, batch_size=16, num_workers=2, order=order, seed=3, os_cache=os_cache) as loader:
        seen = []
        for images, labels in loader:
            assert images.dtype == torch.uint8 and images.shape[1:] == (8, 8, 3)
            for image, label in zip(images.numpy(), labels.tolist()):
                np.testing.assert_array_equal(image, small_image(label))
            seen += labels.tolist()
        assert sorted(seen) == list(range(203))
        assert len(loader) == 13 and images.shape[0] == 203 - 12 * 16  # a partial last batch


def test_every_basic_field_through_its_default_pipeline(tmp_path):
    path = write(tmp_path / "mixed.beton", MIXED_FIELDS, [mixed_sample(i) for i in range(30)], page_size=512)
    with Loader(path, batch_size=7, num_workers=2) as loader:
        position = 0
        for label, score, arr, blob, meta in loader:
            for k in range(len(label)):
                expected = mixed_sample(position + k)
                assert label[k].item() == expected[0] and score[k].item() == expected[1]
                np.testing.assert_array_equal(arr[k].numpy(), expected[2])
                assert blob[k] == expected[3] and meta[k] == expected[4]
            position += len(label)
        assert position == 30


def test_explicit_pipelines_none_drops_and_user_lists_are_not_mutated(image_file):
    image_pipeline = [NDArrayDecoder(), ToTensor(), ToTorchImage(), Convert(torch.float32)]
    pipelines = {"image": image_pipeline, "label": None}
    before = list(image_pipeline)
    with Loader(image_file, batch_size=10, num_workers=1, pipelines=pipelines) as loader:
        (images,) = next(iter(loader))
        assert images.shape == (10, 3, 8, 8) and images.dtype == torch.float32
        np.testing.assert_array_equal(images[4].permute(1, 2, 0).numpy(), small_image(4))
    assert image_pipeline == before and pipelines == {"image": image_pipeline, "label": None}


def test_one_operation_instance_in_two_pipelines(tmp_path):
    fields = {"a": beton.fields.NDArrayField(np.uint8, (8, 8, 3)), "b": beton.fields.NDArrayField(np.uint8, (8, 8, 3))}
    path = write(tmp_path / "two.beton", fields, [(small_image(i), small_image(i + 1)) for i in range(20)])
    flip = RandomHorizontalFlip(flip_prob=1.0)
    with Loader(path, batch_size=20, num_workers=1, pipelines={"a": [NDArrayDecoder(), flip, ToTensor()],
                                                              "b": [NDArrayDecoder(), flip, ToTensor()]}) as loader:
        a, b = next(iter(loader))
        np.testing.assert_array_equal(a[3].numpy(), small_image(3)[:, ::-1])
        np.testing.assert_array_equal(b[3].numpy(), small_image(4)[:, ::-1])


def test_indices_select_a_subset_in_order(image_file):
    with Loader(image_file, batch_size=4, num_workers=2, indices=[9, 3, 200, 7, 7]) as loader:
        assert labels_of(loader) == [[9, 3, 200, 7], [7]]
    with pytest.raises(IndexError):
        Loader(image_file, batch_size=4, indices=[203])


def test_drop_last(image_file):
    with Loader(image_file, batch_size=50, num_workers=2, drop_last=True) as loader:
        assert len(loader) == 4 and [len(b) for b in labels_of(loader)] == [50] * 4


def test_same_seed_same_batches_and_epochs_differ(image_file):
    def run(seed):
        with Loader(image_file, batch_size=32, num_workers=2, order=OrderOption.RANDOM, seed=seed) as loader:
            return [labels_of(loader) for _ in range(2)]

    first, again = run(5), run(5)
    assert first == again and first[0] != first[1] and run(6) != first


def test_seed_none_is_drawn_recorded_and_resumable(image_file):
    def epoch_orders(loader):
        return [labels_of(loader) for _ in range(2)]

    with Loader(image_file, batch_size=32, order=OrderOption.RANDOM) as first, \
            Loader(image_file, batch_size=32, order=OrderOption.RANDOM) as second:
        state = first.state_dict()
        assert state["seed"] != second.state_dict()["seed"]  # two 63-bit draws
        orders = epoch_orders(first)
        assert orders != epoch_orders(second)
    with Loader(image_file, batch_size=32, order=OrderOption.RANDOM) as resumed:
        resumed.load_state_dict(state)
        assert epoch_orders(resumed) == orders


class EvensThenOdds(beton.order.Order):
    """A user-defined order: even indices first, then odd ones, reversed on odd epochs."""

    def permutation(self, indices, seed, epoch, context):
        ordered = np.concatenate([indices[indices % 2 == 0], indices[indices % 2 == 1]])
        return ordered[::-1] if epoch % 2 else ordered


class Rotating(TraversalOrder):
    """FFCV's custom-order contract: a rotation by the epoch, keyed by nothing else."""

    def sample_order(self, epoch):
        return np.roll(self.indices, 17 * (epoch + 1))


AUGMENTED = {"image": [NDArrayDecoder(), RandomHorizontalFlip(), ImageMixup(0.5)],  # per-sample and per-batch draws
             "label": [IntDecoder(), LabelMixup(0.5), ToTensor()]}
MEMORIES = [OSCache(), ProcessCache()]
EVERY_ORDER = [*ANY_FILE_ORDERS, EvensThenOdds(), Rotating]


@pytest.mark.parametrize("memory", MEMORIES, ids=["os-cache", "process-cache"])
@pytest.mark.parametrize("order", EVERY_ORDER, ids=lambda order: getattr(order, "name", type(order).__name__))
@pytest.mark.parametrize("midpoint", [0, 5, 13])
def test_every_order_resumes_exactly_under_both_memory_strategies(image_file, order, memory, midpoint):
    check_resume(lambda: Loader(image_file, batch_size=16, num_workers=2, order=order, seed=11, memory=memory,
                                pipelines=AUGMENTED), midpoint)


@pytest.mark.parametrize("memory", MEMORIES, ids=["os-cache", "process-cache"])
@pytest.mark.parametrize("midpoint", [0, 3, "end"])
def test_balanced_resumes_exactly(image_mix_file, memory, midpoint):
    check_resume(lambda: Loader(image_mix_file, batch_size=8, num_workers=2, order=OrderOption.BALANCED, seed=4,
                                memory=memory, pipelines={"image": [SimpleRGBImageDecoder(), RandomHorizontalFlip(),
                                                                    ToTensor()]}), midpoint)


@pytest.fixture(scope="module")
def ragged_file(tmp_path_factory):
    """75 token sequences of long-tailed lengths (some far beyond the decoders' max_length), in 512-byte pages."""
    lengths = np.minimum(np.random.default_rng(8).pareto(1.2, 75) * 20, 900).astype(np.int64)
    return write(tmp_path_factory.mktemp("ragged") / "ragged.beton",
                 {"tokens": RaggedArrayField(np.int32, (None,)), "index": IntField()},
                 [(np.arange(n, dtype=np.int32) * 3 + i, i) for i, n in enumerate(lengths)], page_size=512)


@pytest.mark.parametrize("memory", MEMORIES, ids=["os-cache", "process-cache"])
@pytest.mark.parametrize("shard", [{}, {"rank": 2, "world_size": 3}, {"rank": 0, "world_size": 2, "drop_last": True}],
                         ids=["one-rank", "rank-2-of-3", "rank-0-of-2-drop-last"])
@pytest.mark.parametrize("midpoint", [0, 3, "end"])
def test_bucketed_resumes_exactly(ragged_file, memory, shard, midpoint):
    # random windows (per-sample draws, which the process cache computes ahead to read only them) and a
    # per-batch draw (mixup of the labels), over an order of length buckets
    def make():
        return Loader(ragged_file, batch_size=8, num_workers=2, order=OrderOption.BUCKETED, seed=6, memory=memory,
                      pipelines={"tokens": [RaggedDecoder(24, window="random"), PadToLongest(), ToTensor()],
                                 "index": [IntDecoder(), LabelMixup(0.5), ToTensor()]}, **shard)

    check_resume(make, midpoint)


@pytest.mark.parametrize("options", [{"num_workers": 0}, {"num_workers": 1, "batches_ahead": 5},
                                     {"rank": 1, "world_size": 3, "order": OrderOption.QUASI_RANDOM},
                                     {"drop_last": True, "order": OrderOption.RANDOM, "overwrite_kept": True}],
                         ids=["in-loop", "one-worker-far-ahead", "rank-1-of-3", "drop-last-ring"])
def test_resume_is_exact_for_any_workers_shard_and_ring(image_file, options):
    check_resume(lambda: Loader(image_file, batch_size=16, seed=2, pipelines=AUGMENTED,
                                **{"num_workers": 2, "order": OrderOption.RANDOM, **options}), 2)


EXPECTED_BATCHES = [list(range(16 * k, min(203, 16 * k + 16))) for k in range(13)]


@pytest.mark.parametrize("os_cache", [True, False])
@pytest.mark.parametrize("num_workers", [1, 2])
def test_batches_the_loop_keeps_stay_valid(image_file, os_cache, num_workers):
    with Loader(image_file, batch_size=16, num_workers=num_workers, batches_ahead=1, os_cache=os_cache) as loader:
        labels = []
        for images, batch_labels in loader:  # the common validation pattern: keep, then concatenate
            labels.append(batch_labels)
        assert torch.cat(labels).tolist() == list(range(203))
        kept = list(loader)
        assert [batch[1].tolist() for batch in kept] == EXPECTED_BATCHES
        for images, batch_labels in kept:
            for image, label in zip(images.numpy(), batch_labels.tolist()):
                np.testing.assert_array_equal(image, small_image(label))
        views = [batch_labels[:2] for _, batch_labels in loader]  # a view keeps its batch's memory too
        assert [view.tolist() for view in views] == [batch[:2] for batch in EXPECTED_BATCHES]


def test_batches_nobody_keeps_reuse_the_ring(image_file):
    with Loader(image_file, batch_size=16, num_workers=2) as loader:
        addresses = {images.data_ptr() for images, _ in loader}
        assert len(addresses) <= loader.num_slots  # no fresh memory unless a batch is kept


def test_overwrite_kept_is_the_zero_copy_ring_and_copy_returns_copies(image_file):
    with Loader(image_file, batch_size=16, num_workers=1, batches_ahead=1, overwrite_kept=True) as loader:
        kept = [labels for _, labels in loader]
        assert [batch.tolist() for batch in kept] != EXPECTED_BATCHES  # slots were overwritten under the list
    with Loader(image_file, batch_size=16, num_workers=1, batches_ahead=1, copy=True) as loader:
        kept = [labels for _, labels in loader]
        assert [batch.tolist() for batch in kept] == EXPECTED_BATCHES
        assert len({labels.data_ptr() for labels in kept}) == len(kept)


def test_an_iterator_superseded_by_a_new_epoch_raises_instead_of_ending(image_file):
    with Loader(image_file, batch_size=16, num_workers=2) as loader:
        first = iter(loader)
        next(first)
        second = iter(loader)
        with pytest.raises(beton.errors.LoaderError, match="started another epoch"):
            next(first)
        assert len(list(second)) == 13
        finished = iter(loader)
        assert len(list(finished)) == 13
        iter(loader)
        with pytest.raises(StopIteration):  # an epoch that was over ends as usual
            next(finished)


@pytest.mark.parametrize("interruption", ["break", "exception", "keyboard_interrupt"])
def test_state_after_an_interrupted_loop_resumes_the_interrupted_epoch(image_file, interruption):
    def make_loader():
        return Loader(image_file, batch_size=16, num_workers=2, order=OrderOption.RANDOM, seed=5)

    with make_loader() as reference:
        expected = labels_of(reference)
    with make_loader() as interrupted:
        received = []
        try:
            for _, labels in interrupted:
                received.append(labels.tolist())
                if len(received) == 4:
                    if interruption == "break":
                        break
                    raise KeyboardInterrupt if interruption == "keyboard_interrupt" else RuntimeError("user code")
        except (KeyboardInterrupt, RuntimeError):
            pass
        state = interrupted.state_dict()
    assert where(state) == (5, 0, 4)
    assert received == expected[:4]
    with make_loader() as resumed:
        resumed.load_state_dict(state)
        assert labels_of(resumed) == expected[4:]


def test_pipeline_errors_are_clear(image_file):
    with pytest.raises(PipelineError, match="decodes IntField"):
        Loader(image_file, batch_size=4, pipelines={"image": [IntDecoder()]})
    with pytest.raises(PipelineError, match=r"pipeline 'image'\[2\]: decoder IntDecoder\(\) must come first"):
        # FFCV's rule puts the field's default decoder before ToTensor; a decoder after it is a slip
        Loader(image_file, batch_size=4, pipelines={"image": [ToTensor(), IntDecoder()]})
    with pytest.raises(PipelineError, match="numpy HxWxC images"):
        Loader(image_file, batch_size=4, pipelines={"label": [IntDecoder(), RandomHorizontalFlip()]})
    with pytest.raises(PipelineError, match="does not have"):
        Loader(image_file, batch_size=4, pipelines={"nope": [IntDecoder()]})
    with pytest.raises(PipelineError, match="torch batch"):
        Loader(image_file, batch_size=4, pipelines={"label": [IntDecoder(), Squeeze()]})


def test_explain_shows_stages_and_generated_source(image_file):
    with Loader(image_file, batch_size=4, pipelines={"image": [NDArrayDecoder(), RandomHorizontalFlip(),
                                                                ToTensor()]}) as loader:
        text = loader.explain()
    assert "jit (disk-cached)" in text and "def stage(start, end, samples" in text
    assert "RandomHorizontalFlip" in text and "IntDecoder" in text


def test_two_loaders_iterated_concurrently_from_two_threads(image_file):
    results = {}

    def consume(name, order):
        with Loader(image_file, batch_size=8, num_workers=2, order=order, seed=1) as loader:
            results[name] = [(images.numpy().copy(), labels.tolist()) for images, labels in loader]

    threads = [threading.Thread(target=consume, args=(name, order))
               for name, order in (("a", OrderOption.RANDOM), ("b", OrderOption.SEQUENTIAL))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for name in "ab":
        assert sorted(sum((labels for _, labels in results[name]), [])) == list(range(203))
        for images, labels in results[name]:
            for image, label in zip(images, labels):
                np.testing.assert_array_equal(image, small_image(label))


def test_bytes_and_json_decoders_keep_exact_lengths(tmp_path):
    fields = {"b": beton.fields.BytesField(), "j": beton.fields.JSONField()}
    samples = [(b"\0" * n, {"n": n}) for n in (0, 1, 300, 2000, 5)]
    path = write(tmp_path / "bj.beton", fields, samples, page_size=256)
    for os_cache in (True, False):
        with Loader(path, batch_size=3, num_workers=2, os_cache=os_cache,
                    pipelines={"b": [BytesDecoder(exact=True)], "j": [JSONDecoder()]}) as loader:
            got = [pair for b, j in loader for pair in zip(b, j)]
        assert got == samples


def test_a_user_defined_order(image_file):
    with Loader(image_file, batch_size=50, num_workers=2, order=EvensThenOdds(), indices=range(10)) as loader:
        assert labels_of(loader) == [[0, 2, 4, 6, 8, 1, 3, 5, 7, 9]]
        assert labels_of(loader) == [[9, 7, 5, 3, 1, 8, 6, 4, 2, 0]]


def test_custom_fields_reach_the_loader(tmp_path):
    from user_fields import make_local_field

    Celsius = make_local_field()
    path = write(tmp_path / "t.beton", {"temp": Celsius(), "n": beton.fields.IntField()}, [(21.5, 1), (-4.0, 2)])
    with pytest.raises(PipelineError, match="custom_fields"):
        Loader(path, batch_size=2)
    with Loader(path, batch_size=2, custom_fields={"temp": Celsius}, pipelines={"temp": None}) as loader:
        assert [n.tolist() for (n,) in loader] == [[1, 2]]


# ---- the torch DataLoader's habits ---------------------------------------------------------------------------


def test_num_workers_0_computes_in_the_calling_thread_with_the_same_batches(image_file):
    threads = set()

    def record_thread(batch):
        threads.add(threading.current_thread().name)
        return batch

    def make(num_workers):
        return Loader(image_file, batch_size=16, num_workers=num_workers, order=OrderOption.RANDOM, seed=2,
                      pipelines={"image": [NDArrayDecoder(), RandomHorizontalFlip(), ToTensor(), record_thread]})

    with make(2) as threaded, make(0) as in_place:
        expected = [(images.clone(), labels.clone()) for images, labels in threaded]
        threads.clear()
        got = list(in_place)
    assert threads == {threading.current_thread().name}
    assert len(got) == len(expected) == 13
    for (images, labels), (want_images, want_labels) in zip(got, expected):
        assert torch.equal(images, want_images) and torch.equal(labels, want_labels)


def test_shuffle_picks_the_order_and_contradictions_are_errors(image_file):
    def first_epoch(**options):
        with Loader(image_file, batch_size=16, num_workers=1, seed=3, **options) as loader:
            return labels_of(loader)

    assert first_epoch(shuffle=True) == first_epoch(order=OrderOption.RANDOM) != first_epoch()
    assert first_epoch(shuffle=False) == first_epoch(order=OrderOption.SEQUENTIAL)
    assert first_epoch(shuffle=True, order=OrderOption.QUASI_RANDOM) == first_epoch(order=OrderOption.QUASI_RANDOM)
    with pytest.raises(ValueError, match="contradicts"):
        Loader(image_file, batch_size=4, shuffle=False, order=OrderOption.RANDOM)
    with pytest.raises(ValueError, match="contradicts"):
        Loader(image_file, batch_size=4, shuffle=True, order=OrderOption.SEQUENTIAL)


def test_prefetch_factor_is_batches_ahead_per_worker(image_file):
    with Loader(image_file, batch_size=8, num_workers=2, prefetch_factor=3, persistent_workers=True) as torch_style, \
            Loader(image_file, batch_size=8, num_workers=2, batches_ahead=6) as beton_style:
        assert torch_style.num_slots == beton_style.num_slots
    with pytest.raises(ValueError, match="not both"):
        Loader(image_file, batch_size=8, batches_ahead=2, prefetch_factor=2)


def test_pin_memory_pins_only_where_cuda_is(image_file, monkeypatch):
    with pytest.warns(UserWarning, match="CUDA is not available"):
        loader = Loader(image_file, batch_size=16, num_workers=1, pin_memory=True)
    with loader:
        assert labels_of(loader) == EXPECTED_BATCHES
    pinned = []

    def fake_pin(tensor):  # no CUDA here: record what would be pinned, and copy as pinning does
        pinned.append(tensor.shape)
        return tensor.clone()

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.Tensor, "pin_memory", fake_pin)
    with Loader(image_file, batch_size=16, num_workers=1, pin_memory=True) as loader:
        assert labels_of(loader) == EXPECTED_BATCHES
    assert len(pinned) == 2 * 13 and pinned[0] == (16, 8, 8, 3)


def test_repr_shows_path_samples_batches_and_pipelines(image_file):
    with Loader(image_file, batch_size=16, num_workers=1, order=OrderOption.RANDOM, indices=range(40)) as loader:
        text = repr(loader)
    assert text.startswith(f"Loader({str(image_file)!r}, samples=40, batches=3, batch_size=16, order=RandomOrder")
    assert "'image': [NDArrayDecoder(), ToTensor()]" in text and "'label': [IntDecoder(), ToTensor()]" in text


def test_filter_selects_samples_by_a_field_value_like_ffcv(image_file):
    with Loader(image_file, batch_size=16, num_workers=1, order=OrderOption.RANDOM, indices=range(100)) as loader:
        with loader.filter("label", lambda label: label % 3 == 0) as multiples:
            assert multiples.seed == loader.seed and multiples.batch_size == 16
            assert sorted(sum(labels_of(multiples), [])) == list(range(0, 100, 3))
        with pytest.raises(PipelineError, match="no field 'colour'"):
            loader.filter("colour", bool)


def test_order_kwargs_reach_the_order_class(image_file):
    with Loader(image_file, batch_size=16, num_workers=1, order=OrderOption.QUASI_RANDOM,
                order_kwargs={"window_pages": 1}) as loader:
        assert loader.order.window_pages == 1
    with pytest.raises(ValueError, match="not an instance"):
        Loader(image_file, batch_size=16, order=beton.order.RandomOrder(), order_kwargs={"x": 1})


def test_set_epoch_after_an_interrupted_epoch_moves_the_checkpoint_too(image_file):
    with Loader(image_file, batch_size=16, num_workers=2, order=OrderOption.RANDOM, seed=5) as loader:
        for number, _ in enumerate(loader):
            if number == 3:
                break
        assert loader.state_dict()["epoch"] == 0
        loader.set_epoch(5)  # a DDP loop that sets the epoch and checkpoints before iterating
        assert where(loader.state_dict()) == (5, 5, 0)


# ---- configuration: option objects and FFCV's shorthand ----------------------------------------------------------

FFCV_NAMES = {"fname", "path", "batch_size", "num_workers", "os_cache", "order", "distributed", "seed", "indices",
              "pipelines", "custom_fields", "drop_last", "batches_ahead", "recompile"}

@pytest.mark.parametrize("batch_size", [2.5, "16", True, 0, -3, np.float64(4.0)])
def test_a_batch_size_that_is_not_a_whole_number_of_samples_is_named(image_file, batch_size):
    with pytest.raises(ValueError, match=r"batch_size must be a whole number of at least 1, got"):
        Loader(image_file, batch_size=batch_size)


@pytest.mark.parametrize("indices, message", [
    (np.arange(203) % 2 == 0, "boolean mask"), ([True, False, True], "boolean mask"),
    ([1.7, 2.2], "whole sample numbers"), (np.array([1.0, 2.0]), "whole sample numbers")])
def test_indices_that_are_not_sample_numbers_are_refused_not_misread(image_file, indices, message):
    """A mask read as numbers selects samples 0 and 1, floats read as numbers are truncated: both silently give
    other samples than meant."""
    with pytest.raises(ValueError, match=message):
        Loader(image_file, batch_size=8, indices=indices)


@pytest.mark.parametrize("indices", [range(3), [0, 2, 2], np.array([5], np.uint16), torch.tensor([1, 4]), []])
def test_indices_as_any_kind_of_whole_numbers_work(image_file, indices):
    with Loader(image_file, batch_size=8, num_workers=0, indices=indices) as loader:
        assert loader.indices.tolist() == [int(index) for index in indices]


@pytest.mark.parametrize("seed", [-1, 1.5, "3", True])
def test_a_seed_that_is_not_a_whole_number_of_at_least_zero_is_refused_when_the_loader_is_built(image_file, seed):
    with pytest.raises(ValueError, match="seed must be a whole number of at least 0"):
        Loader(image_file, batch_size=8, seed=seed)


@pytest.mark.parametrize("options, message", [
    ({"rank": 0, "world_size": 0}, "world_size must be a whole number of at least 1, got 0"),
    ({"rank": True, "world_size": 2}, "rank must be a whole number of at least 0, got True"),
    ({"rank": 1.0, "world_size": 2}, "rank must be a whole number of at least 0, got 1.0"),
    ({"rank": 0, "world_size": 2.5}, "world_size must be a whole number of at least 1, got 2.5"),
    ({"rank": 2, "world_size": 2}, r"rank must lie in \[0, world_size=2\), got 2"),
    ({"num_workers": 2.5}, "num_workers must be -1 .* got 2.5"),
    ({"num_workers": True}, "num_workers must be -1 .* got True"),
    ({"num_workers": -2}, "num_workers must be -1 .* got -2"),
    ({"indices": [[1, 2], [3, 4]]}, r"flat sequence of sample numbers, got an array of shape \(2, 2\)")])
def test_shard_workers_and_indices_that_mean_nothing_are_refused_not_reinterpreted(image_file, options, message):
    """world_size=0 became 1, rank=True rank 1, num_workers=2.5 and float ranks failed only when an epoch started,
    and 2-D indices were flattened."""
    with pytest.raises(ValueError, match=message):
        Loader(image_file, batch_size=8, **options)


@pytest.mark.parametrize("epoch", [-1, 1.9, True, "2"])
def test_set_epoch_refuses_what_is_not_an_epoch_number(image_file, epoch):
    """set_epoch(1.9) ran epoch 1; set_epoch(-1) failed inside numpy when the epoch started."""
    with Loader(image_file, batch_size=8, num_workers=0) as loader:
        with pytest.raises(ValueError, match="epoch must be a whole number of at least 0"):
            loader.set_epoch(epoch)
        loader.set_epoch(np.int64(2))
        assert loader.next_epoch == 2


def test_a_numpy_integer_batch_size_works(image_file):
    with Loader(image_file, batch_size=np.int64(50), num_workers=0) as loader:
        assert [len(labels) for _, labels in loader] == [50, 50, 50, 50, 3]


def test_the_constructor_takes_at_most_fourteen_options_beyond_ffcvs_names():
    import inspect

    parameters = inspect.signature(Loader).parameters
    own = [name for name, p in parameters.items() if name not in FFCV_NAMES and p.kind is not p.VAR_KEYWORD]
    # 13 since remote= joined them: how URLs are read left the memory strategy (ProcessCache(remote=...)), which
    # is only about memory, for the one RemoteOptions every entry point takes (docs/remote.md); 14 since
    # verify_content= joined: whether reads check content digests, as Reader(verify_content=...) (docs/format.md)
    assert len(own) <= 14, own
    assert not any(p.kind is p.VAR_KEYWORD for p in parameters.values())  # a misspelt option is a TypeError


def test_compile_options_choose_the_kernel_cache(image_file, tmp_path):
    with Loader(image_file, batch_size=16, num_workers=1, compile_options=CompileOptions(kernel_cache_dir=str(tmp_path)),
                pipelines={"image": [NDArrayDecoder(), RandomHorizontalFlip(flip_prob=0.123)]}) as loader:  # a new stage
        assert loader.compile_options == CompileOptions(kernel_cache_dir=str(tmp_path))
    assert list(tmp_path.glob("beton_stage_*.py"))  # the stage was written where the option said
    with pytest.raises(TypeError, match="unexpected keyword argument 'readahead'"):
        Loader(image_file, batch_size=16, readahead=False)


def epoch_labels(loader):
    return [labels.tolist() for _, labels in loader]


def test_a_memory_strategy_is_a_reusable_declaration(image_file):
    strategy = ProcessCache(pages=100)
    with Loader(image_file, batch_size=16, num_workers=2, memory=strategy, order=OrderOption.RANDOM, seed=3) as one, \
            Loader(image_file, batch_size=16, num_workers=1, memory=strategy, order=OrderOption.RANDOM, seed=3) as two:
        assert one.memory is not two.memory and one.memory_strategy is two.memory_strategy is strategy
        assert epoch_labels(one) == epoch_labels(two)  # interleaved use of one declaration: two independent caches
        assert one.memory_counters["pages_read"] > 0 and one.memory.budget_pages == 100
    with pytest.raises(dataclasses.FrozenInstanceError):
        strategy.pages = 1  # type: ignore[misc]
    assert strategy == ProcessCache(pages=100)


def test_os_cache_is_the_shorthand_and_contradicting_memory_is_an_error(image_file):
    from beton.memory import OSCacheLayer, ProcessCacheLayer

    for options, layer in (({}, OSCacheLayer), ({"os_cache": True}, OSCacheLayer),
                           ({"os_cache": False}, ProcessCacheLayer), ({"memory": ProcessCache()}, ProcessCacheLayer),
                           ({"os_cache": True, "memory": OSCache(readahead=False)}, OSCacheLayer)):
        with Loader(image_file, batch_size=16, num_workers=1, **options) as loader:
            assert type(loader.memory) is layer
    with pytest.raises(ValueError, match="contradicts"):
        Loader(image_file, batch_size=16, os_cache=True, memory=ProcessCache())
    with pytest.raises(ValueError, match="contradicts"):
        Loader(image_file, batch_size=16, os_cache=False, memory=OSCache())
    with pytest.raises(TypeError, match="memory must be"):
        Loader(image_file, batch_size=16, memory="process")
    with pytest.raises(ValueError, match="positive"):
        ProcessCache(read_bandwidth=0)


class _Twice(TraversalOrder):
    """FFCV's contract allows an order that repeats samples: every sample twice."""

    def sample_order(self, epoch):
        return np.concatenate([self.indices, self.indices])


class _FirstHalf(beton.order.Order):
    permutes = False

    def permutation(self, indices, seed, epoch, context):
        return np.asarray(indices[: len(indices) // 2], np.int64)


@pytest.mark.parametrize("order", [_Twice, _FirstHalf()], ids=["repeats", "leaves out"])
@pytest.mark.parametrize("drop_last", [False, True])
def test_len_counts_the_batches_an_order_that_does_not_permute_gives(image_file, order, drop_last):
    """len() counted the selection instead of what the order gives, as FFCV's counts its traversal order: a
    schedule or progress bar built on it was off by the repeats or the samples left out."""
    with Loader(image_file, batch_size=16, num_workers=2, order=order, seed=3, drop_last=drop_last) as loader:
        expected = len(list(loader))
        assert len(loader) == expected != len(Loader(image_file, batch_size=16, drop_last=drop_last))
