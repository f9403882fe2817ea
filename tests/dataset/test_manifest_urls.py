"""Manifest files and globs at URLs go through beton's one retry budget (docs/remote.md): a manifest is written
locally and uploaded whole (beton/storage/remote/upload.py), a glob is listed with the client's own retries off,
and either is retried on a transient failure and a BetonError naming the URL on a permanent one. Against fsspec's
in-memory store, whose calls are made to fail here."""

from __future__ import annotations

import uuid

import pytest

fsspec = pytest.importorskip("fsspec", reason="URLs need fsspec (the 'remote' extra)")

from fsspec.implementations.memory import MemoryFileSystem  # noqa: E402

from beton import Loader  # noqa: E402
from beton.dataset import index  # noqa: E402
from beton.dataset.manifest import read_manifest  # noqa: E402
from beton.dataset.shards import dataset_manifest  # noqa: E402
from beton.errors import StorageError  # noqa: E402
from beton.fields import IntField  # noqa: E402
from beton.storage.remote import RemoteOptions  # noqa: E402
from conftest import write  # noqa: E402

OPTIONS = RemoteOptions(retries=2, backoff=0.001)


@pytest.fixture
def folder(tmp_path):
    """A folder of two shards in the in-memory store (its URL), removed afterwards."""
    fs = fsspec.filesystem("memory")
    root = f"/beton-{uuid.uuid4().hex}"
    for k in range(2):
        local = write(str(tmp_path / f"part-{k}.beton"), {"label": IntField()}, [(10 * k + i,) for i in range(3)])
        fs.put_file(local, f"{root}/part-{k}.beton")
    yield f"memory://{root}"
    fs.rm(root, recursive=True)


def failing(monkeypatch, name: str, errors: list[BaseException]) -> list[object]:
    """Make the store's method ``name`` raise ``errors`` in turn, then work; returns the calls made."""
    original = getattr(MemoryFileSystem, name)
    calls = []

    def method(self, *args, **kwargs):
        calls.append(args)
        if errors:
            raise errors.pop(0)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(MemoryFileSystem, name, method)
    return calls


def test_a_manifest_written_to_a_url_is_retried_on_a_transient_failure(folder, monkeypatch):
    manifest = dataset_manifest([f"{folder}/part-0.beton", f"{folder}/part-1.beton"], remote=OPTIONS)
    calls = failing(monkeypatch, "put_file", [ConnectionResetError("dropped")])
    manifest.write(f"{folder}/data.json")
    assert len(calls) == 2
    assert read_manifest(f"{folder}/data.json", remote=OPTIONS).shards == manifest.shards


def test_a_manifest_refused_by_the_store_is_a_storage_error_naming_it_and_writes_nothing(folder, monkeypatch):
    manifest = dataset_manifest([f"{folder}/part-0.beton"], remote=OPTIONS)
    calls = failing(monkeypatch, "put_file", [PermissionError("access denied")])
    with pytest.raises(StorageError, match="access denied") as caught:
        manifest.write(f"{folder}/data.json")
    assert caught.value.path == f"{folder}/data.json"
    assert len(calls) == 1  # not retried
    assert fsspec.filesystem("memory").ls(folder[len("memory://"):], detail=False) == [
        f"{folder[len('memory://'):]}/part-{k}.beton" for k in range(2)]


def test_a_glob_at_a_url_is_retried_on_a_transient_failure(folder, monkeypatch):
    calls = failing(monkeypatch, "glob", [ConnectionResetError("dropped"), TimeoutError("slow")])
    manifest = dataset_manifest(f"{folder}/part-*.beton", remote=OPTIONS)
    assert len(calls) == 3
    assert list(manifest.shards.locations) == [f"{folder}/part-0.beton", f"{folder}/part-1.beton"]
    assert manifest.num_samples == 6


def test_a_glob_gives_urls_spelled_as_the_user_spelled_it(folder):
    """memory://name/... and memory:///name/... are one folder; the store spells its matches the second way, and a
    manifest at the first (`beton index`) took them for files outside its folder and refused to open."""
    two_slashes = "memory://" + folder[len("memory:///"):]
    manifest = dataset_manifest(f"{two_slashes}/part-*.beton", remote=OPTIONS)
    assert list(manifest.shards.locations) == [f"{two_slashes}/part-0.beton", f"{two_slashes}/part-1.beton"]
    index(f"{two_slashes}/data.json", f"{two_slashes}/part-*.beton", remote=OPTIONS)
    with Loader(f"{two_slashes}/data.json", batch_size=6, remote=OPTIONS) as loader:
        assert [label for (labels,) in loader for label in labels.tolist()] == [0, 1, 2, 10, 11, 12]


def test_a_glob_refused_by_the_store_is_a_storage_error_naming_it(folder, monkeypatch):
    calls = failing(monkeypatch, "glob", [PermissionError("access denied")])
    with pytest.raises(StorageError, match="listing the files of the glob failed.*access denied") as caught:
        dataset_manifest(f"{folder}/part-*.beton", remote=OPTIONS)
    assert caught.value.path == f"{folder}/part-*.beton"
    assert len(calls) == 1


@pytest.mark.parametrize("name, lookalike", [("a[1].beton", "a1.beton"), ("q?.beton", "qx.beton")])
def test_a_url_naming_an_object_with_glob_characters_reads_that_object(folder, tmp_path, name, lookalike):
    """As a local path does: a Loader given s3://b/a[1].beton read the glob's match a1.beton, and q?.beton read
    itself and qx.beton, while a Reader read the object named."""
    fs = fsspec.filesystem("memory")
    for file, first in ((name, 100), (lookalike, 200)):
        local = write(str(tmp_path / f"{first}.beton"), {"label": IntField()}, [(first + i,) for i in range(2)])
        fs.put_file(local, f"{folder[len('memory://'):]}/{file}")
    with Loader(f"{folder}/{name}", batch_size=8, remote=OPTIONS) as loader:
        assert [label for (labels,) in loader for label in labels.tolist()] == [100, 101]
    assert list(dataset_manifest(f"{folder}/[aq]*.beton", remote=OPTIONS).shards.locations) == sorted(
        f"{folder}/{file}" for file in (name, lookalike))  # a glob naming no object stays a glob
