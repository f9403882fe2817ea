"""Padded batches of variable-length samples: decoders, pad / truncate / window / pack, against numpy references."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import beton
from beton import Loader
from beton.decoders import BytesDecoder, IntDecoder, RaggedDecoder
from beton.errors import PipelineError
from beton.fields import BytesField, IntField, RaggedArrayField
from beton.pipeline.ragged import Packed, Padded
from beton.random import integer, operation_key
from beton.transforms import (Convert, NormalizeImage, Pack, PackRows, PadToLongest, ToDevice, ToTensor,
                              ToTorchImage)

from conftest import write

LENGTHS = [0, 1, 5, 17, 3, 64, 2, 0, 33, 9, 130, 4, 12, 7, 1, 50, 6, 0, 21, 8]


def tokens(i: int, length: int) -> np.ndarray:
    return (np.arange(length, dtype=np.int32) * 31 + i * 1000) % 50_000


def frames(i: int, length: int) -> np.ndarray:
    return (np.arange(length * 3, dtype=np.float32) + i * 0.5).reshape(length, 3)


@pytest.fixture(scope="module")
def ragged_file(tmp_path_factory):
    samples = [(tokens(i, n), frames(i, n % 40), bytes(range(n % 256)), i) for i, n in enumerate(LENGTHS)]
    return write(tmp_path_factory.mktemp("ragged") / "r.beton",
                 {"tokens": RaggedArrayField(np.int32, (None,)), "frames": RaggedArrayField(np.float32, (None, 3)),
                  "blob": BytesField(), "index": IntField()}, samples)


def reference_window(value: np.ndarray, max_length: int, window: str, start: int | None = None) -> np.ndarray:
    """The rows a window keeps, by plain slicing."""
    take = min(len(value), max_length)
    if window == "start":
        start = 0
    elif window == "center":
        start = (len(value) - take) // 2
    return value[start : start + take]


def reference_padded(values: list[np.ndarray], capacity: int, pad_value) -> tuple[np.ndarray, np.ndarray]:
    out = np.full((len(values), capacity, *values[0].shape[1:]), pad_value, values[0].dtype)
    for row, value in zip(out, values):
        row[: len(value)] = value
    return out, np.array([len(v) for v in values], np.int64)


def load(path, pipelines, batch_size=6, **options) -> list[tuple]:
    options = {"num_workers": 1, **options}
    with Loader(path, batch_size=batch_size, pipelines=pipelines, **options) as loader:
        return list(loader)


# ---- decoders against slicing ---------------------------------------------------------------------------


@settings(max_examples=25)
@given(lengths=st.lists(st.integers(0, 40), min_size=1, max_size=15), max_length=st.integers(1, 45),
       window=st.sampled_from(["start", "center", "random"]), pad_value=st.sampled_from([0, -7, 2**31 - 1]),
       batch_size=st.integers(1, 7))
def test_ragged_decoder_keeps_a_window_and_pads_like_numpy(tmp_path_factory, lengths, max_length, window, pad_value,
                                                           batch_size):
    values = [tokens(i, n) for i, n in enumerate(lengths)]
    path = write(tmp_path_factory.mktemp("w") / "w.beton", {"t": RaggedArrayField(np.int32, (None,))},
                 [(v,) for v in values])
    seed = 11
    batches = load(path, {"t": [RaggedDecoder(max_length, pad_value, window)]}, batch_size, seed=seed)
    key = operation_key(seed, 0, 0, 0)
    expected = []
    for i, value in enumerate(values):
        take = min(len(value), max_length)
        start = integer(key, i, 0, 0, len(value) - take + 1) if window == "random" else None
        expected.append(reference_window(value, max_length, window, start))
    got_values = np.concatenate([b.values for b, in batches])
    got_lengths = np.concatenate([b.lengths for b, in batches])
    want_values, want_lengths = reference_padded(expected, max_length, pad_value)
    np.testing.assert_array_equal(got_lengths, want_lengths)
    np.testing.assert_array_equal(got_values, want_values)


def test_a_random_window_is_a_contiguous_part_drawn_anew_every_epoch(ragged_file):
    with Loader(ragged_file, batch_size=20, num_workers=1, seed=3,
                pipelines={"tokens": [RaggedDecoder(8, window="random")], "frames": None, "blob": None}) as loader:
        epochs = [next(iter(loader)) for _ in range(4)]
    starts = []
    for batch, index in epochs:
        for row, length, i in zip(batch.values, batch.lengths, index):
            value = tokens(int(i), LENGTHS[int(i)])
            assert length == min(len(value), 8)
            found = [s for s in range(len(value) - length + 1) if (value[s : s + length] == row[:length]).all()]
            assert found, "the window is a contiguous run of the sample's rows"
            if len(value) > 8:
                starts.append(found[0])
    assert len(set(starts)) > 5  # the windows move: not always the first rows


def test_rows_with_several_columns_and_float_pad_values(ragged_file):
    (batch, index), = load(ragged_file, {"tokens": None, "blob": None,
                                         "frames": [RaggedDecoder(16, pad_value=float("nan"), window="center")]},
                           batch_size=20)
    expected = [reference_window(frames(i, LENGTHS[i] % 40), 16, "center") for i in index.tolist()]
    want, lengths = reference_padded(expected, 16, np.nan)
    assert batch.values.shape == (20, 16, 3) and batch.values.dtype == np.float32
    np.testing.assert_array_equal(batch.lengths, lengths)
    np.testing.assert_array_equal(batch.values, want)  # NaN where padded, equal where not
    assert np.isnan(batch.values[0]).all()  # sample 0 is empty


@pytest.mark.parametrize("window", ["start", "center", "random"])
def test_bytes_decoder_pads_bytes_for_torch_or_gives_bytes(ragged_file, window):
    (padded, index), = load(ragged_file, {"tokens": None, "frames": None,
                                          "blob": [BytesDecoder(max_length=10, pad_value=255, window=window),
                                                   ToTensor()]}, batch_size=20, seed=1)
    (listed, _), = load(ragged_file, {"tokens": None, "frames": None}, batch_size=20)
    assert isinstance(padded, Padded) and padded.values.dtype == torch.uint8 and padded.values.shape == (20, 10)
    assert listed == [bytes(range(n % 256)) for n in LENGTHS]  # the default: exact bytes
    key = operation_key(1, 0, 0, 0)
    for sample, (row, length, value) in enumerate(zip(padded.values.numpy(), padded.lengths.numpy(), listed)):
        data = np.frombuffer(value, np.uint8)
        take = min(len(data), 10)
        start = integer(key, sample, 0, 0, len(data) - take + 1) if window == "random" else None
        np.testing.assert_array_equal(row[:length], reference_window(data, 10, window, start))
        assert (row[length:] == 255).all()


# ---- batch operations against numpy ---------------------------------------------------------------------


@settings(max_examples=25)
@given(lengths=st.lists(st.integers(0, 30), min_size=1, max_size=12), max_length=st.integers(1, 32),
       multiple_of=st.integers(1, 8), row_length=st.integers(1, 40))
def test_pad_to_longest_pack_and_pack_rows_match_numpy(tmp_path_factory, lengths, max_length, multiple_of,
                                                       row_length):
    values = [frames(i, n) for i, n in enumerate(lengths)]
    path = write(tmp_path_factory.mktemp("p") / "p.beton", {"f": RaggedArrayField(np.float32, (None, 3))},
                 [(v,) for v in values])
    kept = [v[:max_length] for v in values]
    size = len(values)
    (trimmed,), = load(path, {"f": [RaggedDecoder(max_length, pad_value=-1.0), PadToLongest(multiple_of)]}, size)
    (packed,), = load(path, {"f": [RaggedDecoder(max_length), Pack()]}, size)
    (rows,), = load(path, {"f": [RaggedDecoder(max_length), PackRows(row_length, pad_value=9.0)]}, size)

    longest = max(len(v) for v in kept)
    width = min(max_length, -(-longest // multiple_of) * multiple_of)
    want, want_lengths = reference_padded(kept, width, -1.0)
    assert trimmed.values.flags.c_contiguous
    np.testing.assert_array_equal(trimmed.values, want)
    np.testing.assert_array_equal(trimmed.lengths, want_lengths)

    flat = np.concatenate(kept)
    np.testing.assert_array_equal(packed.values, flat)
    np.testing.assert_array_equal(packed.offsets, np.concatenate([[0], np.cumsum([len(v) for v in kept])]))
    assert packed.offsets.dtype == np.int32 and packed.max_length == longest
    for i, value in enumerate(kept):
        np.testing.assert_array_equal(packed.values[packed.offsets[i] : packed.offsets[i + 1]], value)

    count = -(-len(flat) // row_length)
    padded_flat = np.concatenate([flat, np.full((count * row_length - len(flat), 3), 9.0, np.float32)])
    np.testing.assert_array_equal(rows.values, padded_flat.reshape(count, row_length, 3))
    last = [len(flat) - (count - 1) * row_length] if count else []
    assert rows.lengths.tolist() == [row_length] * (count - 1) + last


def test_kept_batches_stay_valid_after_the_rows_move_within_the_slot(ragged_file):
    """Pack and PadToLongest move rows inside the slot's buffer: batches the loop keeps must not change."""
    for overwrite_kept, copy in ((False, False), (True, True)):
        batches = load(ragged_file, {"tokens": [RaggedDecoder(20), Pack(), ToTensor()], "frames": None, "blob": None},
                       batch_size=3, num_workers=2, overwrite_kept=overwrite_kept, copy=copy, batches_ahead=1)
        for packed, index in batches:
            assert isinstance(packed, Packed)
            for i, sample in enumerate(index.tolist()):
                value = packed.values[packed.offsets[i] : packed.offsets[i + 1]].numpy()
                np.testing.assert_array_equal(value, tokens(sample, LENGTHS[sample])[:20])


@pytest.mark.parametrize("workers", [1, 2])
def test_random_windows_are_identical_for_any_number_of_workers(ragged_file, workers):
    pipelines = {"tokens": [RaggedDecoder(6, window="random"), PadToLongest(), ToTensor()],
                 "frames": [RaggedDecoder(4, window="random"), Pack(), ToTensor()],
                 "blob": [BytesDecoder(max_length=5, window="random"), ToTensor()]}

    def epochs(num_workers):
        with Loader(ragged_file, batch_size=4, num_workers=num_workers, seed=7, order=beton.OrderOption.RANDOM,
                    pipelines=pipelines) as loader:
            return [[tuple(part.clone() if isinstance(part, torch.Tensor) else part for output in batch
                           for part in (output if isinstance(output, tuple) else (output,)))
                     for batch in loader] for _ in range(2)]

    reference, other = epochs(0), epochs(workers)
    assert len(reference[0]) == 5
    for epoch_a, epoch_b in zip(reference, other):
        for a, b in zip(epoch_a, epoch_b):
            assert len(a) == len(b)
            for x, y in zip(a, b):
                assert torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y
    windows = [{sample: tuple(values[:length].tolist()) for batch in epoch
                for values, length, sample in zip(batch[0], batch[1], batch[-1].tolist())} for epoch in reference]
    assert windows[0].keys() == windows[1].keys() == set(range(len(LENGTHS)))
    assert windows[0] != windows[1]  # another epoch draws other windows


# ---- torch operations and the layout check --------------------------------------------------------------


def test_torch_operations_take_both_parts(ragged_file):
    (batch, _), = load(ragged_file, {"frames": None, "blob": None,
                                     "tokens": [RaggedDecoder(8), ToTensor(), Convert(torch.float64),
                                                ToDevice("cpu"), lambda padded: padded.values.sum(1)]},
                       batch_size=20)
    want = [float(reference_window(tokens(i, n), 8, "start").sum()) for i, n in enumerate(LENGTHS)]
    assert batch.dtype == torch.float64 and batch.tolist() == want


def test_callables_receive_packed_batches_and_may_return_tensors_or_padded_batches(ragged_file):
    def per_sample_sums(packed):
        return torch.segment_reduce(packed.values.double(), "sum", offsets=packed.offsets.long())

    def doubled(padded):
        return Padded(padded.values * 2, padded.lengths)

    (sums, _), = load(ragged_file, {"frames": None, "blob": None,
                                    "tokens": [RaggedDecoder(8), Pack(), ToTensor(), per_sample_sums]}, batch_size=20)
    with Loader(ragged_file, batch_size=20, num_workers=1,
                pipelines={"frames": None, "blob": None, "tokens": [RaggedDecoder(8), ToTensor(), doubled]}) as loader:
        assert loader.plan.final_states[0].layout == "padded"
        (twice, _), = list(loader)
    want = [float(tokens(i, n)[:8].sum()) for i, n in enumerate(LENGTHS)]
    assert sums.tolist() == want
    assert (twice.values.sum(1) == 2 * torch.tensor(want, dtype=torch.int64)).all()


def test_padded_mask_marks_the_data():
    padded = Padded(np.zeros((3, 4)), np.array([0, 2, 4]))
    assert padded.mask().tolist() == [[False] * 4, [True, True, False, False], [True] * 4]
    as_torch = Padded(torch.zeros(3, 4), torch.tensor([0, 2, 4]))
    assert as_torch.mask().tolist() == padded.mask().tolist()


@pytest.mark.parametrize("operations, words", [
    ([RaggedDecoder(8), ToTensor(), ToTorchImage()], "takes dense batches, got padded torch"),
    ([RaggedDecoder(8), NormalizeImage(np.zeros(3), np.ones(3), np.float32)], "takes dense batches"),
    ([RaggedDecoder(8), ToTensor(), PadToLongest()], "padded numpy batch"),
    ([RaggedDecoder(8), Pack(), Pack()], "takes padded batches, got packed"),
    ([RaggedDecoder(8, pad_value=0.5)], "pad_value 0.5"),
    ([RaggedDecoder(8, pad_value=2**40)], "pad_value"),
    ([IntDecoder()], "decodes IntField"),
])
def test_operations_that_cannot_take_a_padded_batch_are_refused_when_the_loader_is_built(ragged_file, operations,
                                                                                          words):
    with pytest.raises(PipelineError, match=words):
        Loader(ragged_file, batch_size=2, pipelines={"tokens": operations, "frames": None, "blob": None})


@pytest.mark.parametrize("make", [lambda: RaggedDecoder(0), lambda: RaggedDecoder(4, window="end"),
                                  lambda: BytesDecoder(max_length=-1), lambda: PadToLongest(0), lambda: PackRows(0),
                                  lambda: Pack(np.float32)])
def test_bad_parameters_are_refused_at_construction(make):
    with pytest.raises(PipelineError):
        make()
