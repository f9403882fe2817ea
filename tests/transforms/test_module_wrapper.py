"""Callables and ``nn.Module``s in a pipeline (ModuleWrapper) on fields of scalars: labels, 0-d arrays."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from beton import DatasetWriter, Loader, PipelineError
from beton.decoders import FloatDecoder, IntDecoder, NDArrayDecoder
from beton.fields import FloatField, IntField, NDArrayField
from beton.transforms import Convert, ModuleWrapper, Squeeze, ToDevice, ToTensor

N = 11  # batches of 4, 4 and 3
FIELDS = {"label": IntField(), "score": FloatField(), "id": NDArrayField(np.uint64, ()),
          "z": NDArrayField(np.complex128, ())}
LABELS = np.arange(N) % 7
SCORES = np.arange(N) / 4 - 1
IDS = np.iinfo(np.uint64).max - np.arange(N, dtype=np.uint64)
ZS = np.arange(N) * (1 + 2j)

EMBEDDING = torch.nn.Embedding(7, 2)


def double(batch):
    return batch * 2


# name -> (field, pipeline with a callable or module, the values expected from the stored ones)
PLACES = {
    "lambda after ToTensor": ("label", [IntDecoder(), ToTensor(), lambda y: y * 3 + 1], lambda: LABELS * 3 + 1),
    "function after ToDevice": ("label", [IntDecoder(), ToTensor(), ToDevice("cpu"), double], lambda: LABELS * 2),
    "module on labels": ("label", [IntDecoder(), ToTensor(), EMBEDDING],
                         lambda: EMBEDDING.weight.detach().numpy()[LABELS]),
    "module after Convert": ("label", [IntDecoder(), ToTensor(), Convert(torch.float32), torch.nn.Hardtanh(0, 5)],
                             lambda: np.clip(LABELS, 0, 5).astype(np.float32)),
    "two callables after Squeeze": ("score", [FloatDecoder(), ToTensor(), Squeeze(), torch.nn.Identity(), double],
                                    lambda: SCORES * 2),
    "ModuleWrapper by hand": ("score", [FloatDecoder(), ToTensor(), ModuleWrapper(torch.nn.ReLU())],
                              lambda: np.maximum(SCORES, 0)),
    "uint64 0-d array": ("id", [NDArrayDecoder(), ToTensor(), lambda z: z.clone()], lambda: IDS),
    "complex 0-d array to floats": ("z", [*FIELDS["z"].default_pipeline(), torch.abs], lambda: np.abs(ZS)),
}


@pytest.fixture(scope="module")
def scalar_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("scalars") / "scalars.beton"
    DatasetWriter(str(path), FIELDS, num_workers=1).from_indexed_dataset(
        [(int(LABELS[i]), float(SCORES[i]), IDS[i : i + 1].reshape(()), ZS[i : i + 1].reshape(())) for i in range(N)])
    return str(path)


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("place", PLACES)
def test_callables_and_modules_work_on_scalar_fields(scalar_file, place, num_workers):
    name, pipeline, expected = PLACES[place]
    pipelines = {other: None for other in FIELDS if other != name} | {name: pipeline}
    loader = Loader(scalar_file, batch_size=4, num_workers=num_workers, pipelines=pipelines)
    try:
        batches = [batch for (batch,) in loader]
    finally:
        loader.close()
    assert [len(b) for b in batches] == [4, 4, 3]
    got = torch.cat(batches)
    want = expected()
    assert got.shape == want.shape and got.dtype == torch.from_numpy(np.asarray(want)).dtype
    np.testing.assert_array_equal(got.detach().numpy(), want)


def test_a_callable_that_returns_no_tensor_is_named(scalar_file):
    with pytest.raises(PipelineError, match="returned list for a one-sample batch of torch torch.int64"):
        Loader(scalar_file, batch_size=4, pipelines={"label": [IntDecoder(), ToTensor(), lambda y: y.tolist()]})
