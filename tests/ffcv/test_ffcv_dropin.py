"""The small things FFCV programs do with a loader and its reader, done as those programs do them (issue #26):
``loader.reader.handlers``, ``reader.alloc_table``, ``custom_fields=`` given instances, ``Loader.filter``'s
values."""

from __future__ import annotations

from typing import Callable

import numpy as np
import pytest

import beton
from beton.decoders import NDArrayDecoder
from beton.errors import FieldError
from beton.fields import FloatField, IntField, NDArrayField
from beton.loader import Loader
from beton.pipeline.operation import AllocationQuery, Operation
from beton.pipeline.state import State

from conftest import write
from ffcv_style_fields import OffsetIntField

NUM_SAMPLES = 20


def samples(start: int = 0) -> list[tuple]:
    return [(np.full((2, 3), i, np.uint8), i, i / 4, 3 * i) for i in range(start, start + NUM_SAMPLES)]


FIELDS = {"mask": NDArrayField(np.uint8, (2, 3)), "label": IntField(), "score": FloatField(),
          "number": OffsetIntField(-5)}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("dropin")
    return [write(folder / f"part-{k}.beton", FIELDS, samples(k * NUM_SAMPLES), page_size=256) for k in (0, 1)]


def test_the_readers_handlers_are_its_fields_by_name(files):
    with Loader(files[0], batch_size=4, num_workers=1, custom_fields={"number": OffsetIntField}) as loader:
        assert loader.reader.handlers["mask"].shape == (2, 3)
        assert isinstance(loader.reader.handlers["label"], IntField)
        assert loader.reader.handlers is loader.reader.fields
        assert loader.reader.alloc_table is loader.reader.allocation_table
        # beton's layout: samples x payload fields (the mask's, and the FFCV-style field's, empty)
        assert loader.reader.alloc_table.shape == (NUM_SAMPLES, 2)
    with Loader(files, batch_size=4, num_workers=1, custom_fields={"number": OffsetIntField}) as union:
        assert isinstance(union.reader, beton.dataset.union.ShardedDataset)
        assert union.reader.handlers["mask"].shape == (2, 3) and list(union.reader.handlers) == list(FIELDS)
        assert union.reader.alloc_table.shape == (2 * NUM_SAMPLES, 2)
        column = union.reader.descriptors["mask"].payload_column
        np.testing.assert_array_equal(union.reader.alloc_table[:, column]["size"], 6)


def test_custom_fields_takes_an_instance_as_ffcv_does(files):
    given = OffsetIntField(99)  # FFCV builds the field from the file with the class's from_binary: so does beton
    with beton.Reader(files[0], custom_fields={"number": given}) as reader:
        assert reader.fields["number"].field.offset == -5
    with Loader(files[0], batch_size=NUM_SAMPLES, num_workers=1, custom_fields={"number": given},
                pipelines={"mask": None, "score": None}) as loader:
        labels, numbers = next(iter(loader))
    assert numbers.tolist() == (3 * labels).tolist()


def test_custom_fields_refuses_what_is_neither_a_field_class_nor_a_field(files):
    with pytest.raises(FieldError, match="not a Field subclass.*nor a field instance"):
        beton.Reader(files[0], custom_fields={"number": object()})


@pytest.mark.parametrize("condition", [lambda value: value[0] < 5, lambda value: value < 5],
                         ids=["ffcv's value[0]", "the value compared"])
def test_filter_gives_scalar_values_with_ffcvs_shape(files, condition):
    seen = []

    def recorded(value):
        seen.append(value)
        return condition(value)

    with Loader(files[0], batch_size=8, num_workers=1, custom_fields={"number": OffsetIntField}) as loader:
        with loader.filter("label", recorded) as small:
            assert sorted(int(label) for batch in small for label in batch[1]) == [0, 1, 2, 3, 4]
        assert all(value.shape == (1,) and value.dtype == np.int64 for value in seen)
        with loader.filter("score", lambda score: score[0] >= 4.5) as high:
            assert sorted(int(label) for batch in high for label in batch[1]) == list(range(18, NUM_SAMPLES))
        with loader.filter("mask", lambda mask: mask.shape == (2, 3) and mask[0, 0] % 2 == 1) as odd:
            assert sorted(int(label) for batch in odd for label in batch[1]) == list(range(1, NUM_SAMPLES, 2))



class Times(Operation):
    """An FFCV-style operation with an attribute a program may change between epochs."""

    def __init__(self, factor: int) -> None:
        super().__init__()
        self.factor = factor

    def generate_code(self) -> Callable:
        factor = self.factor

        def times(masks, dst):
            dst[:] = masks * factor
            return dst

        return times

    def declare_state_and_memory(self, previous_state: State):
        return previous_state, AllocationQuery(previous_state.shape, previous_state.dtype)


def test_the_generated_code_is_reused_across_epochs_until_an_operation_changes(files):
    """FFCV's tests compare ``loader.code`` between epochs; beton's is the compiled plan."""
    times = Times(2)
    with Loader(files[0], batch_size=4, num_workers=1, custom_fields={"number": OffsetIntField},
                pipelines={"mask": [NDArrayDecoder(), times], "number": None, "score": None}) as loader:
        code = loader.code
        assert code is loader.plan and "Times() (FFCV contract)" in loader.explain()
        next(iter(loader))
        masks, labels = next(iter(loader))
        assert loader.code is code and masks[:, 0, 0].tolist() == (2 * labels).tolist()
        times.factor = 3  # changed between epochs: the next one plans again
        masks, labels = next(iter(loader))
        assert loader.code is not code and masks[:, 0, 0].tolist() == (3 * labels).tolist()
