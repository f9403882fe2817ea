"""DatasetWriter: order, determinism, parallelism, and what happens when things go wrong."""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest

import beton
from beton.errors import DatasetError, EncodeError, FieldError, WriterError
from beton.fields import BytesField, FloatField, IntField, JSONField, NDArrayField, TorchTensorField
from beton.fields.base import Encoded, Field

from conftest import MIXED_FIELDS, ListDataset, mixed_sample, write
from user_fields import NoisyField, PreparedField


class FailingDataset(ListDataset):
    def __init__(self, samples, fail_at, how="raise"):
        super().__init__(samples)
        self.fail_at, self.how = fail_at, how

    def __getitem__(self, index):
        if index == self.fail_at:
            if self.how == "exit":
                os._exit(3)  # a worker dying abruptly, as from the OOM killer or a native crash
            raise KeyError(f"no sample {index}")
        return super().__getitem__(index)


def files_in(directory):
    return sorted(entry.name for entry in directory.iterdir())


@pytest.mark.parametrize("num_workers", [1, 2, 3])
def test_file_is_byte_identical_for_any_num_workers(tmp_path, num_workers):
    fields = {**MIXED_FIELDS, "noise": NoisyField()}
    samples = [mixed_sample(i) + (None,) for i in range(150)]
    reference = write(tmp_path / "ref.beton", fields, samples, page_size=1024)
    other = write(tmp_path / "other.beton", fields, samples, page_size=1024, num_workers=num_workers,
                  chunksize=7 * num_workers)
    assert other.read_bytes() == reference.read_bytes()
    with beton.Reader(other, custom_fields={"noise": NoisyField}) as reader:  # random per sample, and seeded
        noise = [reader[i][-1] for i in range(150)]
    assert len(set(noise)) == 150


def test_seed_changes_random_encodings(tmp_path):
    samples = [(None,)] * 5
    first = write(tmp_path / "a.beton", {"n": NoisyField()}, samples, seed=1)
    second = write(tmp_path / "b.beton", {"n": NoisyField()}, samples, seed=2)
    assert first.read_bytes() != second.read_bytes()


def test_samples_are_stored_in_the_given_index_order(tmp_path):
    dataset = ListDataset([(i,) for i in range(20)])
    path = tmp_path / "subset.beton"
    beton.DatasetWriter(path, {"i": IntField()}, num_workers=2, progress=False).from_indexed_dataset(
        dataset, indices=[5, 3, 19, 0], chunksize=1
    )
    with beton.Reader(path) as reader:
        assert [reader[k][0] for k in range(4)] == [5, 3, 19, 0]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_from_iterable(tmp_path, num_workers):
    samples = (mixed_sample(i) for i in range(33))
    path = tmp_path / "iter.beton"
    writer = beton.DatasetWriter(path, MIXED_FIELDS, num_workers=num_workers, progress=False, page_size=512)
    writer.from_iterable(samples, length=33, chunksize=4)
    with beton.Reader(path) as reader:
        assert len(reader) == 33
        assert reader[32][0] == 32 and reader[32][3] == mixed_sample(32)[3]


BAD_VALUES = [
    ("label", IntField(), 1.5, "expected an integer, got float"),
    ("label", IntField(), "3", "expected an integer, got str"),
    ("label", IntField(), 2**63, "int64 range"),
    ("score", FloatField(), "0.5", "expected a real number, got str"),
    ("arr", NDArrayField(np.float32, (3, 4)), np.zeros((3, 4)), "dtype <f4 .* got dtype <f8"),
    ("arr", NDArrayField(np.float32, (3, 4)), np.zeros((4, 3), np.float32), r"shape \(3, 4\).* shape \(4, 3\)"),
    ("arr", NDArrayField(np.float32, (3, 4)), [[0.0] * 4] * 3, "expected a numpy array, got list"),
    ("t", TorchTensorField("float32", (2,)), np.zeros(2, np.float32), "expected a torch.Tensor"),
    ("blob", BytesField(), "text", "expected bytes"),
    ("meta", JSONField(), {"x": float("nan")}, "not JSON-serialisable"),
    ("meta", JSONField(), {"x": object()}, "not JSON-serialisable"),
]


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("name, field, bad_value, message", BAD_VALUES)
def test_a_value_that_does_not_fit_names_sample_and_field(tmp_path, name, field, bad_value, message, num_workers):
    good = {IntField: 1, FloatField: 0.5, NDArrayField: np.zeros((3, 4), np.float32), BytesField: b"",
            JSONField: {}, TorchTensorField: None}
    samples = [(good[type(field)] if type(field) is not TorchTensorField else __import__("torch").zeros(2),)] * 10
    samples[6] = (bad_value,)
    with pytest.raises(EncodeError, match=message) as caught:
        write(tmp_path / "bad.beton", {name: field}, samples, num_workers=num_workers, chunksize=3)
    assert caught.value.sample == 6 and caught.value.field == name
    assert "sample 6" in str(caught.value) and repr(name) in str(caught.value)
    assert files_in(tmp_path) == []


@dataclasses.dataclass(frozen=True)
class _PairField(Field):
    """A user field whose encode returns its value as the metadata, unchecked: what numpy makes of it decides."""

    metadata_dtype = np.dtype([("x", "<i8"), ("y", "u1")])

    def encode(self, value, context):
        return Encoded(metadata=value)

    def to_python(self, metadata, payload):
        return int(metadata["x"]), int(metadata["y"])

    def arguments(self):
        return {}


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("bad_metadata, message", [([1, 2], "not 'list'"), ((1, 300), "out of bounds for uint8"),
                                                   ((1, 2, 3), "tuple of length 3")])
def test_metadata_a_field_returns_that_does_not_fit_its_dtype_names_sample_and_field(tmp_path, bad_metadata,
                                                                                      message, num_workers):
    samples = [((i, i),) for i in range(10)]
    samples[7] = (bad_metadata,)
    with pytest.raises(EncodeError, match=message) as caught:
        write(tmp_path / "bad.beton", {"pair": _PairField()}, samples, num_workers=num_workers, chunksize=4)
    assert (caught.value.sample, caught.value.field) == (7, "pair") and "does not fit dtype" in str(caught.value)
    assert files_in(tmp_path) == []
    good = write(tmp_path / "good.beton", {"pair": _PairField()}, samples[:7])
    with beton.Reader(good, custom_fields={_PairField.stored_type_name(): _PairField}) as reader:
        assert [reader[i][0] for i in range(7)] == [(i, i) for i in range(7)]


def test_a_sample_that_is_not_a_tuple_of_the_right_length(tmp_path):
    with pytest.raises(EncodeError, match="expected a tuple of 2 values") as caught:
        write(tmp_path / "x.beton", {"a": IntField(), "b": IntField()}, [(1, 2), (3,)])
    assert caught.value.sample == 1


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_dataset_that_raises_at_k(tmp_path, num_workers):
    dataset = FailingDataset([(i,) for i in range(50)], fail_at=23)
    writer = beton.DatasetWriter(tmp_path / "f.beton", {"i": IntField()}, num_workers=num_workers, progress=False)
    with pytest.raises(DatasetError, match="KeyError") as caught:
        writer.from_indexed_dataset(dataset, chunksize=5)
    assert caught.value.sample == 23 and "sample 23" in str(caught.value)
    assert files_in(tmp_path) == []


def test_an_iterable_that_raises_at_k(tmp_path):
    def samples():
        yield from ((i,) for i in range(4))
        raise RuntimeError("stream broke")

    writer = beton.DatasetWriter(tmp_path / "f.beton", {"i": IntField()}, num_workers=0, progress=False)
    with pytest.raises(DatasetError, match="stream broke") as caught:
        writer.from_iterable(samples())
    assert caught.value.sample == 4
    assert isinstance(caught.value.__cause__, RuntimeError)
    assert files_in(tmp_path) == []


def test_a_worker_that_dies_does_not_hang_the_writer(tmp_path):
    dataset = FailingDataset([(i,) for i in range(40)], fail_at=17, how="exit")
    writer = beton.DatasetWriter(tmp_path / "f.beton", {"i": IntField()}, num_workers=2, progress=False)
    with pytest.raises(WriterError, match="worker process died"):
        writer.from_indexed_dataset(dataset, chunksize=4)
    assert files_in(tmp_path) == []


def test_a_failed_write_keeps_the_existing_file(tmp_path):
    path = write(tmp_path / "keep.beton", {"i": IntField()}, [(1,), (2,)])
    before = path.read_bytes()
    with pytest.raises(EncodeError):
        write(path, {"i": IntField()}, [(1,), ("two",)])
    assert path.read_bytes() == before
    assert files_in(tmp_path) == ["keep.beton"]


def test_keyboard_interrupt_cleans_up(tmp_path):
    class Interrupting(ListDataset):
        def __getitem__(self, index):
            if index == 3:
                raise KeyboardInterrupt
            return super().__getitem__(index)

    writer = beton.DatasetWriter(tmp_path / "k.beton", {"i": IntField()}, num_workers=0, progress=False)
    with pytest.raises(KeyboardInterrupt):
        writer.from_indexed_dataset(Interrupting([(i,) for i in range(10)]))
    assert files_in(tmp_path) == []


@pytest.mark.parametrize(
    "fields, page_size, message",
    [
        ({}, 1024, "non-empty mapping"),
        ({"": IntField()}, 1024, "non-empty strings"),
        ({"a": int}, 1024, "must be a Field instance"),
        ({"a": IntField()}, 1000, "power of two"),
        ({"a": IntField()}, 128, "power of two"),
    ],
)
def test_bad_writer_arguments(tmp_path, fields, page_size, message):
    with pytest.raises(FieldError, match=message):
        beton.DatasetWriter(tmp_path / "x.beton", fields, page_size=page_size)


def test_bad_field_arguments():
    with pytest.raises(FieldError):
        NDArrayField(object, (2,))
    with pytest.raises(FieldError):
        NDArrayField(np.float32, (-1,))
    with pytest.raises(FieldError, match="unsupported torch dtype"):
        TorchTensorField("quint8", (2,))


def test_user_arguments_are_not_mutated(tmp_path):
    fields = {"i": IntField(), "b": BytesField()}
    indices = [2, 0, 1]
    dataset = ListDataset([(i, b"x") for i in range(3)])
    beton.DatasetWriter(tmp_path / "u.beton", fields, num_workers=0, progress=False).from_indexed_dataset(
        dataset, indices=indices
    )
    assert fields == {"i": IntField(), "b": BytesField()} and indices == [2, 0, 1]


def test_shuffle_indices_stores_a_seeded_permutation(tmp_path):
    samples = ListDataset([(i,) for i in range(300)])

    def written(name, seed, **options):
        path = tmp_path / name
        beton.DatasetWriter(path, {"n": IntField()}, seed=seed, progress=False, **options).from_indexed_dataset(
            samples, chunksize=17, shuffle_indices=True)
        with beton.Reader(path) as reader:
            return path.read_bytes(), [reader[i][0] for i in range(len(reader))]

    (first, stored), (second, _), (_, reseeded) = (written("a.beton", 3, num_workers=0),
                                                   written("b.beton", 3, num_workers=2), written("c.beton", 4))
    assert first == second  # the same file for any number of workers
    assert sorted(stored) == list(range(300)) and stored != list(range(300)) and stored != reseeded


def test_fields_prepare_their_encoding_in_the_writing_process_before_its_workers_start(tmp_path):
    """Where RGBImageField compiles its JPEG transcoder once, instead of once in every worker at the same time."""
    marker = tmp_path / "prepared"
    path = write(tmp_path / "p.beton", {"value": PreparedField(str(marker))}, [(i,) for i in range(40)],
                 chunksize=5, num_workers=2)
    assert marker.read_text() == str(os.getpid())
    with beton.Reader(path, custom_fields={"value": PreparedField}) as reader:
        assert [reader[i][0] for i in range(40)] == list(range(40))
