"""A manifest's tables file (beton/dataset/tables_file.py): ``beton index`` writes every shard's header and tables
beside the manifest, pinned by its SHA-256, and a dataset opens from the manifest and that file without touching a
shard; each shard is compared with it when an epoch first opens it.

What must hold: the same samples, in every order, as without the tables file and as one merged file; no shard
touched on opening; a tables file changed in any way (a byte, truncated, another dataset's, the manifest's digest)
refused on opening with an error naming it, never served; a shard changed after indexing refused when first opened,
before any of its pages is used."""

from __future__ import annotations

import hashlib
import json
import os
import shutil

import numpy as np
import pytest

import beton
from beton import Loader, OrderOption
from beton.dataset import index
from beton.dataset.union import ShardedDataset, open_dataset
from beton.errors import CorruptDataError, FormatError, ShardError, ShardNotFoundError
from beton.fields import BytesField, IntField

from conftest import write

FIELDS = {"label": IntField(), "blob": BytesField()}
COUNTS = (5, 0, 7, 3, 6)


def samples(shard: int, count: int, salt: int = 0) -> list[tuple[int, bytes]]:
    return [(100 * shard + k + salt, bytes([shard, k, salt]) * (k + 1)) for k in range(count)]


def make_dataset(directory) -> tuple[list[str], str, str]:
    """Shards of COUNTS samples (small pages, so that they span several), their manifest with its tables file, and
    one file of the same samples in the same order. Returns (shards, manifest, whole)."""
    directory = os.fspath(directory)
    parts = [write(os.path.join(directory, f"part-{k}.beton"), FIELDS, samples(k, count), page_size=256)
             for k, count in enumerate(COUNTS)]
    manifest = os.path.join(directory, "dataset.json")
    index(manifest, parts)
    whole = write(os.path.join(directory, "whole.beton"), FIELDS,
                  [sample for k, count in enumerate(COUNTS) for sample in samples(k, count)], page_size=256)
    return parts, manifest, whole


@pytest.fixture
def dataset(tmp_path):
    return make_dataset(tmp_path)


def everything(source, order=OrderOption.SEQUENTIAL, **options):
    with Loader(source, batch_size=4, order=order, seed=3, num_workers=1, **options) as loader:
        return [(labels.numpy().tolist(), list(blobs)) for labels, blobs in loader]


def without_tables(manifest: str) -> str:
    document = json.loads(open(manifest).read())
    del document["tables"]
    path = manifest[: -len(".json")] + "-plain.json"
    with open(path, "w") as file:
        json.dump(document, file)
    return path


def overwrite_table(path: str, table: str, new) -> None:
    """Write ``new(its first 8 bytes)`` over the start of ``table`` in the file ``path``, its header kept."""
    with beton.Reader(path) as reader:
        offset = int(reader.header[table]["offset"])
    with open(path, "r+b") as file:
        file.seek(offset)
        replacement = new(file.read(8))
        file.seek(offset)
        file.write(replacement)


def test_index_writes_the_tables_file_and_pins_it(dataset):
    parts, manifest, whole = dataset
    document = json.loads(open(manifest).read())
    tables = os.path.join(os.path.dirname(manifest), "dataset.tables")
    assert document["tables"] == {"path": "dataset.tables",
                                  "sha256": hashlib.sha256(open(tables, "rb").read()).hexdigest(),
                                  "size": os.path.getsize(tables)}


@pytest.mark.parametrize("order", [order for order in OrderOption if order is not OrderOption.BALANCED])  # no images
def test_samples_are_those_without_the_tables_file_and_of_one_file_in_every_order(dataset, order):
    parts, manifest, whole = dataset
    expected = everything(without_tables(manifest), order)
    assert everything(manifest, order) == expected
    one_file = everything(whole, order)
    if order is OrderOption.QUASI_RANDOM:  # its order follows pages, which shards number otherwise than one file
        expected, one_file = (sorted(sample for labels, blobs in batches for sample in zip(labels, blobs))
                              for batches in (expected, one_file))
    assert expected == one_file


def test_opening_touches_no_shard(dataset, tmp_path):
    parts, manifest, whole = dataset
    away = tmp_path / "away"
    away.mkdir()
    for part in parts:
        shutil.move(part, away)
    with open_dataset(manifest) as opened:  # every shard gone: opening reads the manifest and its tables file
        assert isinstance(opened, ShardedDataset)
        assert [value for (value,) in opened.data_table["label"].tolist()] == [
            label for k, count in enumerate(COUNTS) for label, _ in samples(k, count)]
    with Loader(manifest, batch_size=4) as loader, pytest.raises(ShardNotFoundError) as raised:
        next(iter(loader))
    assert raised.value.path == parts[0]
    for part in parts:
        shutil.move(os.path.join(away, os.path.basename(part)), part)
    assert everything(manifest) == everything(whole)


def test_a_shard_not_reached_is_never_opened(dataset):
    parts, manifest, whole = dataset
    os.unlink(parts[4])  # the last shard: an epoch over the first shards' samples never opens it
    first = sum(COUNTS[:2])
    with Loader(manifest, batch_size=4, indices=list(range(first))) as loader:
        assert [label for labels, _ in loader for label in labels.tolist()] == list(range(COUNTS[0]))


@pytest.mark.parametrize("change", ["byte", "truncated", "grown", "digest in the manifest", "missing"])
def test_a_changed_tables_file_is_refused_on_opening(dataset, change):
    parts, manifest, whole = dataset
    tables = manifest[: -len(".json")] + ".tables"
    if change == "byte":
        with open(tables, "r+b") as file:
            file.seek(os.path.getsize(tables) // 2)
            byte = file.read(1)
            file.seek(-1, os.SEEK_CUR)
            file.write(bytes([byte[0] ^ 1]))
    elif change == "truncated":
        os.truncate(tables, os.path.getsize(tables) - 1)
    elif change == "grown":  # refused by its size, before it is read (the copy that is hashed would cost it)
        with open(tables, "ab") as file:
            file.write(b"\0" * 4096)
    elif change == "digest in the manifest":
        document = json.loads(open(manifest).read())
        document["tables"]["sha256"] = "0" * 64
        with open(manifest, "w") as file:
            json.dump(document, file)
    else:
        os.unlink(tables)
    with pytest.raises(FormatError) as raised:
        open_dataset(manifest)
    assert raised.value.path == tables


@pytest.mark.parametrize("changed, message", [
    (3, "shard 3: the tables file does not hold the tables its header names"),
    (0, "the tables file holds another header for shard 0 than the manifest lists"),  # named the intact shard 0
])
def test_another_datasets_tables_file_is_refused_even_with_its_digest(dataset, tmp_path, changed, message):
    # the same fields and counts, one shard with other samples: a tables file consistent in itself and pinned by
    # the manifest, but holding the header and tables of another file than the manifest's shard
    parts, manifest, whole = dataset
    other = tmp_path / "other"
    other.mkdir()
    others = [shutil.copy(part, other) for part in parts]
    write(others[changed], FIELDS, samples(changed, COUNTS[changed], salt=1), page_size=256)
    index(other / "dataset.json", others)
    tables = manifest[: -len(".json")] + ".tables"
    shutil.copyfile(other / "dataset.tables", tables)
    document = json.loads(open(manifest).read())
    document["tables"]["sha256"] = hashlib.sha256(open(tables, "rb").read()).hexdigest()
    document["tables"]["size"] = os.path.getsize(tables)
    with open(manifest, "w") as file:
        json.dump(document, file)
    with pytest.raises(FormatError, match=message) as raised:
        open_dataset(manifest)
    assert raised.value.path == tables


def test_a_shard_replaced_after_indexing_is_refused_when_first_opened(dataset, tmp_path):
    parts, manifest, whole = dataset
    write(parts[2], FIELDS, samples(2, COUNTS[2], salt=9), page_size=256)  # same count, other samples
    with Loader(manifest, batch_size=4) as loader, \
            pytest.raises(ShardError, match="shard 2 of 5 is not the file the manifest lists") as raised:
        for _ in loader:  # opening read no shard: it cannot tell yet
            pass
    assert raised.value.path == parts[2]


def test_a_shard_whose_tables_differ_from_its_header_is_refused_when_first_opened(dataset):
    # the header (and so its SHA-256, which the manifest lists) kept, a label in the data table changed: the
    # tables file holds what the header names, the file does not
    parts, manifest, whole = dataset
    overwrite_table(parts[3], "data_table", lambda old: np.int64(-1).tobytes())
    with Loader(manifest, batch_size=4) as loader, pytest.raises(ShardError, match="data table") as raised:
        for _ in loader:
            pass
    assert raised.value.path == parts[3]


def test_index_of_local_shards_together_writes_what_shard_by_shard_readers_write(dataset, tmp_path):
    parts, manifest, whole = dataset
    # verify=True opens each shard as a Reader (and checks its pages); without, the shards are read together
    checked = index(tmp_path / "checked.json", parts, verify=True)
    together = os.path.join(os.path.dirname(parts[0]), "together.json")
    index(together, parts)
    assert open(together[: -len(".json")] + ".tables", "rb").read() == open(checked.tables.location, "rb").read()


def test_index_refuses_a_shard_whose_tables_are_damaged_naming_it(dataset):
    parts, manifest, whole = dataset
    overwrite_table(parts[3], "allocation_table", lambda old: bytes([old[0] ^ 1]))
    target = os.path.join(os.path.dirname(parts[0]), "again.json")
    with pytest.raises(CorruptDataError, match="allocation table") as raised:
        index(target, parts)
    assert raised.value.path == parts[3]
    assert not os.path.exists(target) and not os.path.exists(target[: -len(".json")] + ".tables")


@pytest.mark.parametrize("os_cache", [False, True])
def test_a_replaced_shard_of_fields_without_payloads_is_refused_before_its_samples_are_served(tmp_path, os_cache):
    """Labels alone: their values come from the tables file, no page read would open a shard, so each shard is
    compared with the tables file before the first batch with samples in it: the batches before are served,
    that one and none after."""
    labels = {"label": IntField()}
    parts = [write(tmp_path / f"labels-{k}.beton", labels, [(100 * k + i,) for i in range(20)]) for k in range(3)]
    manifest = str(tmp_path / "labels.json")
    index(manifest, parts)
    with Loader(manifest, batch_size=8, os_cache=os_cache) as loader:
        assert sorted(label for (batch,) in loader for label in batch.tolist()) == [
            100 * k + i for k in range(3) for i in range(20)]
    write(parts[1], labels, [(1000 + i,) for i in range(20)])  # the same size, other labels
    served = []
    with Loader(manifest, batch_size=8, os_cache=os_cache) as loader, \
            pytest.raises(ShardError, match="shard 1 of 3 is not the file the manifest lists") as raised:
        for (batch,) in loader:
            served.append(batch)
    assert [batch.tolist() for batch in served] == [list(range(8)), list(range(8, 16))]  # 16..23 spans shard 1
    assert raised.value.path == str(parts[1])


@pytest.mark.parametrize("os_cache", [False, True])
def test_a_replaced_shard_whose_payloads_are_all_empty_is_refused_though_no_page_of_it_is_read(tmp_path, os_cache):
    """Payloads are read, but shard 1's are all empty: no page read opens it, so the batch's own check must,
    while shards with bytes are checked by the reads of their pages. Both kinds of shard in one batch."""
    parts = [write(tmp_path / f"mixed-{k}.beton", FIELDS,
                   [(100 * k + i, b"" if k == 1 else bytes([k, i]) * 40) for i in range(6)]) for k in range(3)]
    manifest = str(tmp_path / "mixed.json")
    index(manifest, parts)
    write(parts[1], FIELDS, [(1000 + i, b"") for i in range(6)])  # the same size, other labels
    served = []
    with Loader(manifest, batch_size=4, os_cache=os_cache) as loader, \
            pytest.raises(ShardError, match="shard 1 of 3 is not the file the manifest lists") as raised:
        for labels, _ in loader:
            served.append(labels.ravel().tolist())
    assert served == [[0, 1, 2, 3]] and raised.value.path == str(parts[1])  # 4, 5 and 100, 101 come next


@pytest.mark.parametrize("os_cache", [False, True])
def test_the_first_batch_opens_the_shards_it_needs_not_every_shard(tmp_path, os_cache, monkeypatch):
    """Shards are compared with the tables file as batches reach them: before, an epoch's start opened all of
    them (at 100,000 shards at URLs, 100,000 requests before the first batch), then again to read pages."""
    parts = [write(tmp_path / f"s-{k}.beton", FIELDS, samples(k, 4)) for k in range(40)]
    manifest = str(tmp_path / "s.json")
    index(manifest, parts)
    opened = []
    honest = ShardedDataset.open_pages
    monkeypatch.setattr(ShardedDataset, "open_pages", lambda self, number: (opened.append(number),
                                                                            honest(self, number))[1])
    with Loader(manifest, batch_size=4, num_workers=1, batches_ahead=1, os_cache=os_cache) as loader:
        labels, _ = next(iter(loader))
        assert labels.ravel().tolist() == [label for label, _ in samples(0, 4)]
        assert 1 <= len(set(opened)) <= 8  # the first batch's shard, and those of the few batches computed ahead
        for _ in loader:
            pass
    assert sorted(set(opened)) == list(range(40)) and len(opened) == 40  # each once (40 < the open-shard bound)


def test_a_shard_replaced_while_another_thread_compares_it_is_compared_by_the_thread_that_opened_it(tmp_path,
                                                                                                      monkeypatch):
    """Two threads open a shard at once (a batch's check, the page reader): one finishes comparing the original
    while the other opens the file, replaced in between. The second had no identity to hold the file to, so it
    must compare what it opened, whatever the first recorded meanwhile."""
    parts, manifest, _ = make_dataset(tmp_path)
    from beton.storage.page_source import LocalFile

    honest = LocalFile.reopened
    with open_dataset(manifest) as dataset:
        def replaced_meanwhile(path, *arguments):
            dataset._unchecked[2] = False  # the other thread's comparison of the original ended
            with open(parts[2], "r+b") as file:  # and a label changed in place: the header, and its hash, kept
                content = file.read()
                file.seek(content.index((200).to_bytes(8, "little")))
                file.write((999).to_bytes(8, "little"))
            return honest(path, *arguments)

        monkeypatch.setattr(LocalFile, "reopened", staticmethod(replaced_meanwhile))
        with pytest.raises(ShardError, match="shard 2 is not the file the manifest's tables file .* data table differs") as raised:
            dataset.open_pages(2)
        assert raised.value.path == parts[2]


def test_index_refuses_to_write_its_tables_file_over_a_listed_shard(tmp_path):
    shard = write(tmp_path / "c.tables", FIELDS, samples(0, 3))
    before = open(shard, "rb").read()
    with pytest.raises(ValueError, match="would be written over a shard"):
        index(str(tmp_path / "c.json"), [shard])
    assert open(shard, "rb").read() == before and not os.path.exists(tmp_path / "c.json")
