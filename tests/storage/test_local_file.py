"""A dataset's local files are regular files or a clear error, before anything is read: a FIFO that a manifest or
an archive holds would make ``open()`` wait forever, a device would never end."""

from __future__ import annotations

import os

import pytest

import beton
from beton import Loader
from beton.dataset import index
from beton.dataset.manifest import read_manifest
from beton.dataset.shards import dataset_manifest
from beton.decoders import BytesDecoder, IntDecoder
from beton.errors import BetonError
from beton.fields import BytesField, IntField

from conftest import write
from processes import refusal

FIELDS = {"label": IntField(), "blob": BytesField()}


def fifo_in_place_of(path) -> None:
    os.remove(path)
    os.mkfifo(path)


def epoch(dataset, pipelines=None) -> list[int]:
    with Loader(str(dataset), batch_size=4, num_workers=1, pipelines=pipelines) as loader:
        return [int(label) for labels, *_ in loader for label in labels]


@pytest.fixture
def shards(tmp_path):
    return [write(str(tmp_path / f"part-{k}.beton"), FIELDS, [(10 * k + i, b"x" * i) for i in range(6)])
            for k in range(2)]


def test_a_fifo_or_a_device_named_as_a_dataset_file_is_refused_without_waiting(tmp_path):
    fifo = tmp_path / "data.beton"
    os.mkfifo(fifo)
    for path, kind in [(fifo, "a FIFO"), ("/dev/zero", "a character device")]:
        for action in (lambda: beton.Reader(path), lambda: epoch(path)):
            error = refusal(action, timeout=20)
            assert isinstance(error, BetonError) and f"is {kind}, not a file a dataset can be read from" in str(error)
            assert error.path == str(path)


@pytest.mark.parametrize("tables_file", [True, False], ids=["indexed", "listed"])
@pytest.mark.parametrize("labels_only", [True, False], ids=["labels_only", "payloads"])
def test_a_shard_replaced_by_a_fifo_is_refused_without_waiting(tmp_path, shards, tables_file, labels_only):
    manifest = tmp_path / "data.json"
    if tables_file:  # the shards' tables come from the tables file: the FIFO is met when the epoch reaches it
        index(str(manifest), shards)
        assert read_manifest(str(manifest)).tables is not None
    else:  # the shards' tables are read from each shard when the dataset opens
        dataset_manifest(shards).write(str(manifest))
    fifo_in_place_of(shards[1])
    pipelines = {"label": [IntDecoder()], "blob": None} if labels_only else \
        {"label": [IntDecoder()], "blob": [BytesDecoder()]}
    error = refusal(lambda: epoch(manifest, pipelines), timeout=20)
    assert isinstance(error, BetonError) and "FIFO" in str(error) and error.path == shards[1]


def test_a_fifo_as_the_manifest_or_its_tables_file_is_refused_without_waiting(tmp_path, shards):
    manifest = tmp_path / "data.json"
    index(str(manifest), shards)
    tables = read_manifest(str(manifest)).tables.location
    fifo_in_place_of(tables)
    error = refusal(lambda: epoch(manifest), timeout=20)
    assert isinstance(error, BetonError) and "is a FIFO" in str(error) and error.path == tables
    fifo_in_place_of(manifest)
    error = refusal(lambda: epoch(manifest), timeout=20)
    assert isinstance(error, BetonError) and "is a FIFO" in str(error) and error.path == str(manifest)
