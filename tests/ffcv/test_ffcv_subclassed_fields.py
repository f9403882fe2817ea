"""Built-in fields subclassed FFCV's way (issue #26): a subclass overrides only ``encode(self, destination, field,
malloc)`` and calls ``super().encode(destination, field, malloc)``, as FFCV's own test's ``StringField`` does."""

from __future__ import annotations

import numpy as np
import pytest

import beton
from beton.errors import EncodeError
from beton.fields import FloatField, IntField, RGBImageField
from beton.fields.ndarray import NDArrayDecoder, NDArrayField
from beton.loader import Loader, OrderOption
from beton.writer import DatasetWriter

from conftest import small_image

MAX_STRING_SIZE = 100


class StringDecoder(NDArrayDecoder):
    pass


class StringField(NDArrayField):
    def __init__(self, max_len: int, pad_char="\0"):
        self.max_len = max_len
        self.pad_char = pad_char
        super().__init__(np.dtype("uint8"), (max_len,))

    def encode(self, destination, field, malloc):
        padded_field = (field + self.pad_char * self.max_len)[: self.max_len]
        field = np.frombuffer(padded_field.encode("ascii"), dtype="uint8")
        return super().encode(destination, field, malloc)


class TenfoldIntField(IntField):
    """Metadata only: the built-in writes its record into ``destination``."""

    def encode(self, destination, field, malloc):
        return super().encode(destination, 10 * field, malloc)


class GrayAsRGBField(RGBImageField):
    def encode(self, destination, field, malloc):
        return super().encode(destination, np.repeat(field[:, :, None], 3, axis=2), malloc)


class BetonStyleOption(IntField):
    """beton's encode with an option: a beton subclass, not FFCV's three-argument call."""

    def encode(self, value, context, scale=3):
        return super().encode(scale * value, context)


class ForgetsSuper(NDArrayField):
    def encode(self, destination, field, malloc):
        pass


def captions(count: int) -> list[str]:
    rng = np.random.default_rng(5)
    return ["".join(rng.choice(list("abcdef0123456789-"), int(rng.integers(0, 50)))) for _ in range(count)]


@pytest.mark.parametrize("num_workers", [0, 2])  # 2: the field crosses to the writer's worker processes
def test_string_field(tmp_path, num_workers):
    dataset = [(caption,) for caption in captions(100)]
    path = tmp_path / "strings.beton"
    DatasetWriter(path, {"label": StringField(MAX_STRING_SIZE)}, num_workers=num_workers,
                  progress=False).from_indexed_dataset(dataset, chunksize=10)
    loader = Loader(path, batch_size=10, num_workers=2, order=OrderOption.RANDOM,
                    pipelines={"label": [StringDecoder()]}, custom_fields={"label": StringField})
    with loader:
        all_caps = [cap.tobytes().decode("ascii").replace("\0", "") for (x,) in loader for cap in x]
        # as FFCV's inherited from_binary: the field read back is the built-in the class extends
        assert type(loader.reader.handlers["label"]) is NDArrayField
        assert loader.reader.handlers["label"].shape == (MAX_STRING_SIZE,)
    assert sorted(all_caps) == sorted(caption for (caption,) in dataset)
    with beton.Reader(path) as reader:  # the file holds a plain NDArrayField: no class needed to read it
        assert reader[3][0].tobytes().decode("ascii").rstrip("\0") == dataset[3][0]


def test_metadata_and_image_fields_subclassed(tmp_path):
    images = [small_image(i)[:, :, 0].copy() for i in range(6)]
    path = tmp_path / "mixed.beton"
    DatasetWriter(path, {"number": TenfoldIntField(), "gray": GrayAsRGBField(write_mode="raw"),
                         "score": FloatField(), "beton": BetonStyleOption()}, num_workers=0,
                  progress=False).from_indexed_dataset([(i, images[i], i / 2, i) for i in range(6)])
    with beton.Reader(path) as reader:
        for i in range(6):
            number, image, score, tripled = reader[i]
            assert number == 10 * i and score == i / 2 and tripled == 3 * i
            np.testing.assert_array_equal(image, np.repeat(images[i][:, :, None], 3, axis=2))


def test_a_subclass_that_stores_no_payload_is_refused(tmp_path):
    with pytest.raises(EncodeError, match="stored no payload"):
        DatasetWriter(tmp_path / "x.beton", {"x": ForgetsSuper(np.uint8, (2,))}, num_workers=0,
                      progress=False).from_indexed_dataset([(np.zeros(2, np.uint8),)])
    assert not (tmp_path / "x.beton").exists()


def test_the_built_ins_answer_ffcvs_call_only_inside_a_writer():
    def malloc(size):
        return 0, np.zeros(size, np.uint8)

    with pytest.raises(EncodeError, match="inside a DatasetWriter"):
        NDArrayField(np.uint8, (2,)).encode(np.zeros(1, np.uint64), np.zeros(2, np.uint8), malloc)
