"""Shared fixtures and the Hypothesis profile used by the whole suite."""

from __future__ import annotations

import os
import pathlib

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

import beton
from beton.fields import BytesField, FloatField, IntField, JSONField, NDArrayField

# Writing files is slow next to Hypothesis' default deadline, and CI runs should not depend on luck.
settings.register_profile(
    "beton",
    deadline=None,
    max_examples=40,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    derandomize=bool(os.environ.get("CI")),
)
settings.load_profile("beton")

#: The tests folder (test modules sit in subfolders mirroring the package; helpers and data sit here).
TESTS = pathlib.Path(__file__).resolve().parent
#: Test data kept in the repository: files written by FFCV 1.0.2, golden files.
DATA = TESTS / "data"


#: Orders that apply to any file (BALANCED needs an RGBImageField: see test_balanced.py; BUCKETED a field with
#: lengths: see test_ragged_order.py).
ANY_FILE_ORDERS = [order for order in beton.OrderOption
                   if order not in (beton.OrderOption.BALANCED, beton.OrderOption.BUCKETED)]


def window_of(order, pages=2):
    """``order_kwargs`` giving a page-window order a small window (the other orders take none)."""
    return {"window_pages": pages} if order is beton.OrderOption.QUASI_RANDOM else {}


class ListDataset:
    """An indexed dataset over a list of sample tuples."""

    def __init__(self, samples):
        self.samples = list(samples)

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, index):
        return self.samples[index]


def write(path, fields, samples, chunksize=100, **options):
    """Write ``samples`` (a list of tuples) with an in-process writer unless options say otherwise."""
    options = {"num_workers": 0, "progress": False, **options}
    beton.DatasetWriter(path, fields, **options).from_indexed_dataset(ListDataset(samples), chunksize=chunksize)
    return path


MIXED_FIELDS = {
    "label": IntField(),
    "score": FloatField(),
    "arr": NDArrayField(np.float32, (3, 4)),
    "blob": BytesField(),
    "meta": JSONField(),
}


def mixed_sample(i: int) -> tuple:
    return (i, i / 3, np.full((3, 4), i, np.float32), bytes(range(i % 256)) * (i % 7), {"i": i, "name": "é" * (i % 5)})


@pytest.fixture
def mixed_file(tmp_path):
    """A 60-sample file with every basic field and 1 KiB pages, so payloads cross many page boundaries."""
    return write(tmp_path / "mixed.beton", MIXED_FIELDS, [mixed_sample(i) for i in range(60)], page_size=1024)


def small_image(i: int) -> np.ndarray:
    """An 8x8x3 uint8 image whose pixels encode its sample index, so batches can be checked exactly."""
    return ((np.arange(8 * 8 * 3, dtype=np.int64).reshape(8, 8, 3) + i * 7) % 251).astype(np.uint8)


def checked_labels(loader) -> list[int]:
    """One epoch's labels, after checking that every image is ``small_image(label)``."""
    seen = []
    for images, labels in loader:
        for image, label in zip(images.numpy(), labels.tolist()):
            np.testing.assert_array_equal(image, small_image(label))
            seen.append(label)
    return seen


IMAGE_FIELDS = {"image": NDArrayField(np.uint8, (8, 8, 3)), "label": IntField()}


@pytest.fixture(scope="session")
def image_file(tmp_path_factory):
    """203 samples (a prime: partial batches everywhere) of an 8x8x3 image and its label; 1 KiB pages."""
    path = tmp_path_factory.mktemp("images") / "images.beton"
    return write(path, IMAGE_FIELDS, [(small_image(i), i) for i in range(203)], page_size=1024)
