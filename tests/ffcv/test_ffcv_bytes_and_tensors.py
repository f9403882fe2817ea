"""Byte, JSON and tensor fields decoded as FFCV's tests decode them (issue #26): ``BytesDecoder`` on a
``JSONField`` unpacked by ``JSONField.unpack``, ``BytesDecoder`` + ``ToTensor`` on a ``BytesField`` (FFCV's uint8
rows as long as the file's longest value), ``NDArrayDecoder`` on a ``TorchTensorField``."""

from __future__ import annotations

import string

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from beton import Loader
from beton.errors import DecodeError, PipelineError
from beton.fields import BytesField, IntField, JSONField, TorchTensorField
from beton.fields.basics import IntDecoder
from beton.fields.bytes import BytesDecoder
from beton.fields.ndarray import NDArrayDecoder
from beton.transforms import ToTensor

from conftest import write

NUM_SAMPLES = 23


def document(i: int) -> dict:
    rng = np.random.default_rng(i)
    letters = list(string.ascii_uppercase + string.digits)
    return {"".join(rng.choice(letters, 6)): "".join(rng.choice(letters, int(rng.integers(0, 60))))
            for _ in range(3)}


def blob(i: int) -> bytes:
    return bytes(np.random.default_rng(100 + i).integers(1, 256, size=(i * 7) % 40, dtype=np.uint8))


def tensor(i: int) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(200 + i).standard_normal((2, 3)).astype(np.float32))


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    fields = {"index": IntField(), "doc": JSONField(), "blob": BytesField(),
              "activations": TorchTensorField(torch.float32, (2, 3))}
    samples = [(i, document(i), blob(i), tensor(i)) for i in range(NUM_SAMPLES)]
    return write(tmp_path_factory.mktemp("bytes") / "mixed.beton", fields, samples, page_size=512)


def test_json_through_bytes_decoder_and_unpack(dataset):
    seen = 0
    with Loader(dataset, batch_size=3, num_workers=2,
                pipelines={"doc": [BytesDecoder()], "index": [IntDecoder()], "blob": None,
                           "activations": None}) as loader:
        for indices, encoded in loader:
            assert encoded.dtype == np.uint8
            for index, doc in zip(indices.tolist(), JSONField.unpack(encoded)):
                assert doc == document(index)
                seen += 1
            assert JSONField.unpack(encoded[0]) == document(int(indices[0]))  # one row: one value
            assert JSONField.unpack(torch.from_numpy(encoded)) == JSONField.unpack(encoded)
    assert seen == NUM_SAMPLES


def test_bytes_decoder_and_to_tensor_give_rows_as_long_as_the_longest_value(dataset):
    longest = max(len(blob(i)) for i in range(NUM_SAMPLES))
    texts = [len(JSONField().encode(document(i), None).payload) for i in range(NUM_SAMPLES)]
    with Loader(dataset, batch_size=4, num_workers=2,
                pipelines={"blob": [BytesDecoder(), ToTensor()], "doc": [BytesDecoder()],
                           "activations": None}) as loader:
        batches = list(loader)  # kept: each must stay valid
    assert sum(len(indices) for indices, *_ in batches) == NUM_SAMPLES
    for indices, docs, blobs in batches:
        assert isinstance(blobs, torch.Tensor) and blobs.dtype == torch.uint8
        assert blobs.shape == (len(indices), longest)  # the file's longest, in every batch
        assert docs.shape == (len(indices), max(texts) + 1)  # and a NUL after the longest document
        for index, row in zip(indices.tolist(), blobs.numpy()):
            value = blob(index)
            assert row[: len(value)].tobytes() == value and not row[len(value):].any()


def test_exact_bytes_and_the_default_pipelines_keep_lengths(dataset):
    with Loader(dataset, batch_size=5, num_workers=1, pipelines={"blob": [BytesDecoder(exact=True)],
                                                                 "activations": None}) as loader:
        for indices, docs, blobs in loader:
            assert blobs == [blob(i) for i in indices.tolist()] and docs == [document(i) for i in indices.tolist()]
            assert JSONField.unpack(docs) == docs
    with Loader(dataset, batch_size=5, num_workers=1, pipelines={"doc": [BytesDecoder(exact=True)],
                                                                 "activations": None}) as loader:
        indices, texts, blobs = next(iter(loader))
    assert JSONField.unpack(texts) == [document(i) for i in indices.tolist()]
    assert blobs == [blob(i) for i in indices.tolist()]  # a BytesField's default pipeline


def test_ndarray_decoder_reads_a_torch_tensor_field(dataset):
    with Loader(dataset, batch_size=6, num_workers=2,
                pipelines={"activations": [NDArrayDecoder(), ToTensor()], "doc": None, "blob": None}) as loader:
        seen = 0
        for indices, activations in loader:
            assert activations.dtype == torch.float32 and activations.shape[1:] == (2, 3)
            for index, activation in zip(indices.tolist(), activations):
                assert torch.equal(activation, tensor(index))
                seen += 1
    assert seen == NUM_SAMPLES


def test_bfloat16_has_no_numpy_dtype_to_read_into(tmp_path):
    path = write(tmp_path / "b16.beton", {"x": TorchTensorField(torch.bfloat16, (2,))},
                 [(torch.ones(2, dtype=torch.bfloat16),)])
    with pytest.raises(PipelineError, match="numpy has no bfloat16.*TorchTensorDecoder"):
        Loader(path, batch_size=1, pipelines={"x": [NDArrayDecoder()]})


def test_unpack_refuses_what_bytes_decoder_does_not_give():
    with pytest.raises(DecodeError, match="no NUL"):
        JSONField.unpack(np.frombuffer(b'{"a":1}', np.uint8)[None])
    with pytest.raises(DecodeError, match="uint8 rows"):
        JSONField.unpack(np.zeros((2, 3), np.float32))
    with pytest.raises(PipelineError, match="choose one"):
        BytesDecoder(max_length=4, exact=True)


@settings(max_examples=10, deadline=None)
@given(values=st.lists(st.binary(max_size=50), min_size=1, max_size=12))
def test_rows_hold_each_value_then_zeros(tmp_path_factory, values):
    path = write(tmp_path_factory.mktemp("rows") / "b.beton", {"b": BytesField()}, [(v,) for v in values])
    with Loader(path, batch_size=5, num_workers=1, pipelines={"b": [BytesDecoder()]}) as loader:
        rows = np.concatenate([batch for (batch,) in loader])
    assert rows.shape == (len(values), max(len(v) for v in values))
    for value, row in zip(values, rows):
        assert row[: len(value)].tobytes() == value and not row[len(value):].any()
