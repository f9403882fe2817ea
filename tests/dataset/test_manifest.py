"""Manifests: the shards of one dataset, as a JSON file or built in memory from files, globs and lists.

A manifest file is untrusted input: every malformed or inconsistent one ends in a FormatError naming the file and
the entry, and a shard that is not the file the manifest lists (changed header, other count, other fields) in a
ShardError naming the shard, when it is opened."""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import beton
from beton.errors import CorruptDataError, FormatError, ShardError
from beton.fields import FloatField, IntField, NDArrayField
from beton.dataset import manifest as manifest_module
from beton.dataset.manifest import (MAX_MANIFEST_BYTES, FieldSpec, Manifest, header_digest, parse_manifest,
                                    read_manifest)
from beton.dataset.shards import dataset_manifest, index

from conftest import DATA, MIXED_FIELDS, ListDataset, mixed_sample
from processes import moto_s3

SAMPLES = [mixed_sample(i) for i in range(40)]
BOUNDS = [0, 13, 13, 40]  # uneven, one shard empty


def write_part(path, start, end, fields=MIXED_FIELDS, samples=SAMPLES, **options):
    options = {"num_workers": 0, "progress": False, "page_size": 1024, **options}
    beton.DatasetWriter(path, fields, **options).from_indexed_dataset(ListDataset(samples), start=start, end=end)
    return str(path)


@pytest.fixture
def shards(tmp_path):
    """Three shards of SAMPLES in tmp_path/data, and their manifest tmp_path/data/train.json."""
    directory = tmp_path / "data"
    directory.mkdir()
    paths = [write_part(directory / f"part-{k}.beton", start, end)
             for k, (start, end) in enumerate(zip(BOUNDS, BOUNDS[1:]))]
    index(directory / "train.json", paths)
    return paths


def manifest_text(paths_and_counts, fields=None) -> dict:
    """A valid manifest document for files that need not exist (parse_manifest does not open shards)."""
    return {"format": "beton-manifest", "version": 1, "num_samples": sum(count for _, count in paths_and_counts),
            "fields": fields or [{"name": "label", "type": "beton.IntField", "arguments": {},
                                  "metadata_dtype": [["value", "<i8"]], "payload": False}],
            "shards": [{"path": path, "num_samples": count, "header_sha256": "ab" * 32}
                       for path, count in paths_and_counts]}


# ---- round trip ----------------------------------------------------------------------------------------------

def test_index_writes_a_manifest_that_reads_back_the_same(shards, tmp_path):
    manifest = read_manifest(tmp_path / "data" / "train.json")
    assert manifest.source == str(tmp_path / "data" / "train.json")
    assert [shard.location for shard in manifest.shards] == shards
    assert [(shard.start, shard.end) for shard in manifest.shards] == [(0, 13), (13, 13), (13, 40)]
    assert manifest.num_samples == 40 and list(manifest.bounds) == [0, 13, 13, 40]
    assert [field.name for field in manifest.fields] == list(MIXED_FIELDS)
    assert manifest.fields[2].arguments == {"dtype": "<f4", "shape": [3, 4]}
    document = json.loads((tmp_path / "data" / "train.json").read_text())
    assert [entry["path"] for entry in document["shards"]] == ["part-0.beton", "part-1.beton", "part-2.beton"]
    with open(shards[2], "rb") as file:
        assert document["shards"][2]["header_sha256"] == header_digest(file.read(256))
    assert dataset_manifest(shards) == Manifest(manifest.shards, manifest.fields)  # the same, built in memory


def test_every_global_sample_is_found_in_its_shard(shards, tmp_path):
    manifest = read_manifest(tmp_path / "data" / "train.json")
    numbers, local = manifest.locate(np.arange(40))
    for index_, (number, position) in enumerate(zip(numbers.tolist(), local.tolist())):
        with manifest.open_shard(number) as reader:
            got, want = reader[position], SAMPLES[index_]
            assert got[0] == want[0] and got[4] == want[4]


@given(st.lists(st.integers(0, 50), min_size=1, max_size=12), st.data())
def test_locate_is_the_inverse_of_laying_shards_end_to_end(counts, data):
    manifest = Manifest.of([(f"s{k}.beton", count, "0" * 64) for k, count in enumerate(counts)], ())
    total = sum(counts)
    expected_shard = np.repeat(np.arange(len(counts)), counts)
    expected_local = np.concatenate([np.arange(count) for count in counts])
    indices = np.array(data.draw(st.lists(st.integers(0, max(total - 1, 0)), max_size=30)) if total else [],
                       np.int64)
    shard, local = manifest.locate(indices)
    assert shard.dtype == np.int64 and local.dtype == np.int64
    assert np.array_equal(shard, expected_shard[indices]) and np.array_equal(local, expected_local[indices])
    with pytest.raises(IndexError, match=f"sample index {total} out of range"):
        manifest.locate([0, total][-1:] if total else [0])
    with pytest.raises(IndexError):
        manifest.locate(np.array([-1]))


def test_locate_keeps_the_shape_and_refuses_non_integers():
    manifest = Manifest.of([("a", 3, "0" * 64), ("b", 4, "0" * 64)], ())
    shard, local = manifest.locate(np.array([[0, 3], [6, 2]], np.uint32))
    assert shard.tolist() == [[0, 1], [1, 0]] and local.tolist() == [[0, 0], [3, 2]]
    assert [a.tolist() for a in manifest.locate(5)] == [1, 2]
    with pytest.raises(TypeError):
        manifest.locate(np.array([1.0]))


@given(st.lists(st.tuples(st.from_regex(r"[a-z0-9_]{1,8}(/[a-z0-9_.-]{1,8}){0,2}", fullmatch=True)
                          .filter(lambda p: not any(part in (".", "..") for part in p.split("/"))),
                          st.integers(0, 2**40)), min_size=1, max_size=8, unique_by=lambda e: e[0]))
def test_manifest_files_round_trip(entries):
    manifest = Manifest.of([(os.path.join("/d", *path.split("/")), count, f"{k:064x}")
                            for k, (path, count) in enumerate(entries)],
                           (FieldSpec("x", "beton.IntField", "{}", np.dtype([("value", "<i8")]), False),))
    text = manifest.to_json("/d/m.json")
    again = parse_manifest(text, "/d/m.json")
    assert again == Manifest(manifest.shards, manifest.fields, source="/d/m.json")
    assert [entry["path"] for entry in json.loads(text)["shards"]] == [path for path, _ in entries]


# ---- hostile manifest files -----------------------------------------------------------------------------------

def mutate(change):
    def apply(document):
        change(document)
        return json.dumps(document).encode()
    return apply


HOSTILE = {
    "not JSON": (lambda d: b'{"format": "beton-manifest",', "invalid JSON"),
    "not UTF-8": (lambda d: b'{"format": "\xff"}', "invalid JSON"),
    "too deep": (lambda d: b"[" * 100_000 + b"]" * 100_000, "levels deep"),
    "a list": (lambda d: b"[]", "the manifest must be a JSON object"),
    "another format": (mutate(lambda d: d.update(format="webdataset")), "not a beton manifest"),
    "a newer version": (mutate(lambda d: d.update(version=2)), "manifest version 2 is not the supported version 1"),
    "a missing key": (mutate(lambda d: d.pop("num_samples")), "the manifest lacks 'num_samples'"),
    "an unknown key": (mutate(lambda d: d.update(extra=1)), "unknown keys 'extra'"),
    "counts that do not add up": (mutate(lambda d: d.update(num_samples=41)),
                                  "add up to 40, the manifest's \"num_samples\" says 41"),
    "a negative count": (mutate(lambda d: d["shards"][0].update(num_samples=-1)), "shard 0: \"num_samples\""),
    "a boolean count": (mutate(lambda d: d["shards"][0].update(num_samples=True)), "shard 0: \"num_samples\""),
    "a fractional count": (mutate(lambda d: d["shards"][0].update(num_samples=1.5)), "shard 0: \"num_samples\""),
    "a huge count": (mutate(lambda d: d.update(num_samples=2**70)), "\"num_samples\" must be an integer"),
    "counts beyond 2**63 in all": (mutate(lambda d: [s.update(num_samples=2**62) for s in d["shards"]]),
                                   "more than 2**63 - 1"),
    "a bad hash": (mutate(lambda d: d["shards"][1].update(header_sha256="AB" * 32)), "shard 1: \"header_sha256\""),
    "no shards": (mutate(lambda d: d.update(shards=[])), "\"shards\" must be a non-empty list"),
    "no fields": (mutate(lambda d: d.update(fields=[])), "\"fields\" must be a non-empty list"),
    "a field twice": (mutate(lambda d: d["fields"].append(dict(d["fields"][0]))), "field 'label' is listed twice"),
    "a big-endian dtype": (mutate(lambda d: d["fields"][0].update(metadata_dtype=[["value", ">i8"]])),
                           "field 0 ('label'): \"metadata_dtype\""),
    "an object dtype": (mutate(lambda d: d["fields"][0].update(metadata_dtype="|O")), "\"metadata_dtype\""),
    "arguments not an object": (mutate(lambda d: d["fields"][0].update(arguments=[1])), "must be an object"),
    "a shard that is no object": (mutate(lambda d: d["shards"].append("x.beton")), "shard 3 must be a JSON object"),
    "a path with ..": (mutate(lambda d: d["shards"][0].update(path="../../etc/x.beton")), "outside the manifest's"),
    "an absolute path": (mutate(lambda d: d["shards"][0].update(path="/etc/x.beton")), "outside the manifest's"),
    "an encoded ..": (mutate(lambda d: d["shards"][0].update(path="a/%2e%2e/%2E%2E/x.beton")), "outside the manifest's"),
    "a backslash": (mutate(lambda d: d["shards"][0].update(path="..\\x.beton")), "backslash"),
    "a file URL": (mutate(lambda d: d["shards"][0].update(path="file:///etc/passwd")), "names a file of this machine"),
    "a chained local URL": (mutate(lambda d: d["shards"][0].update(path="simplecache::file:///x.beton")),
                            "chained URL"),
    "a shard twice": (mutate(lambda d: d["shards"][2].update(path=d["shards"][0]["path"])),
                      "shard 2 ('part-0.beton') is shard 0 again"),
    "an empty path": (mutate(lambda d: d["shards"][0].update(path="")), "\"path\" must be a non-empty string"),
}


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_manifests_end_in_a_format_error_naming_file_and_entry(shards, tmp_path, name):
    make, expected = HOSTILE[name]
    document = json.loads((tmp_path / "data" / "train.json").read_text())
    path = tmp_path / "data" / "hostile.json"
    path.write_bytes(make(document))
    with pytest.raises(FormatError) as caught:
        dataset_manifest(str(path))
    assert caught.value.path == str(path)
    assert expected in str(caught.value), str(caught.value)


def test_a_manifest_larger_than_the_cap_is_refused_unread(tmp_path, monkeypatch):
    path = tmp_path / "big.json"
    path.write_bytes(json.dumps(manifest_text([("a.beton", 1)])).encode().ljust(5000))
    monkeypatch.setattr(manifest_module, "MAX_MANIFEST_BYTES", 4096)
    with pytest.raises(FormatError, match="a manifest is at most 4096 bytes"):
        read_manifest(path)
    assert MAX_MANIFEST_BYTES == 64 * 2**20


def test_paths_resolve_against_the_manifest_location():
    document = json.dumps(manifest_text([("a/0.beton", 1), ("s3://other/1.beton", 2)])).encode()
    with pytest.raises(FormatError, match="'s3://other/1.beton' lies outside the manifest's directory"):
        parse_manifest(document, "sets/train.json")
    local = parse_manifest(document, "sets/train.json", allow_outside=True)
    assert [shard.location for shard in local.shards] == [os.path.join("sets", "a", "0.beton"), "s3://other/1.beton"]
    with pytest.raises(FormatError, match="outside the manifest's directory"):
        parse_manifest(document, "https://host/data/train.json")
    remote = parse_manifest(document, "https://host/data/train.json?token=x#part", allow_outside=True)
    assert [shard.location for shard in remote.shards] == ["https://host/data/a/0.beton", "s3://other/1.beton"]
    chained = parse_manifest(document, "simplecache::s3://bucket/sets/train.json", allow_outside=True)
    assert chained.shards[0].location == "simplecache::s3://bucket/sets/a/0.beton"


# ---- shards that are not what the manifest says ---------------------------------------------------------------

def test_a_shard_rewritten_after_indexing_is_named_when_opened(shards, tmp_path):
    write_part(shards[2], 13, 40, seed=9, metadata={"rewritten": True})  # same samples, another file
    manifest = dataset_manifest(str(tmp_path / "data" / "train.json"))  # reading the manifest opens no shard
    with manifest.open_shard(0) as reader:
        assert len(reader) == 13
    with pytest.raises(ShardError) as caught:
        manifest.open_shard(2)
    assert caught.value.path == shards[2] and "is not the file the manifest lists" in str(caught.value)
    with pytest.raises(ShardError, match="changed since the manifest was made"):
        beton.dataset.merge(tmp_path / "merged.beton", tmp_path / "data" / "train.json")
    assert not os.path.exists(tmp_path / "merged.beton")


def test_a_manifest_whose_counts_or_fields_were_edited_is_caught_at_the_shard(shards, tmp_path):
    path = tmp_path / "data" / "train.json"
    document = json.loads(path.read_text())
    document["shards"][0]["num_samples"], document["shards"][2]["num_samples"] = 14, 26  # still adds up to 40
    path.write_text(json.dumps(document))
    with pytest.raises(ShardError, match="shard 0 holds 13 samples, the manifest says 14"):
        dataset_manifest(str(path)).open_shard(0)
    document = json.loads(path.read_text())
    document["shards"][0]["num_samples"], document["shards"][2]["num_samples"] = 13, 27
    document["fields"][2]["arguments"]["shape"] = [4, 3]
    path.write_text(json.dumps(document))
    with pytest.raises(ShardError, match=r"field 'arr' \(beton.NDArrayField\) has argument shape=\[3,4\], expected "
                                         r"shape=\[4,3\]"):
        dataset_manifest(str(path)).open_shard(0)


def test_index_checks_every_shard_and_verify_checks_every_page(shards, tmp_path):
    with beton.Reader(shards[2]) as reader:
        assert reader.num_pages > 3
        start, _ = reader.page_bounds(2)
    with open(shards[2], "r+b") as file:
        file.seek(start + 5)
        byte = file.read(1)
        file.seek(start + 5)
        file.write(bytes([byte[0] ^ 0x10]))
    index(tmp_path / "data" / "unchecked.json", shards)  # the tables are intact: indexing alone cannot tell
    with pytest.raises(CorruptDataError) as caught:
        index(tmp_path / "data" / "checked.json", shards, verify=True)
    assert caught.value.path == shards[2] and caught.value.page == 2
    assert not os.path.exists(tmp_path / "data" / "checked.json")


# ---- lists and globs --------------------------------------------------------------------------------------------

def test_lists_globs_and_manifests_name_the_same_dataset(shards, tmp_path):
    expected = dataset_manifest(shards)
    directory = tmp_path / "data"
    assert dataset_manifest(str(directory / "part-*.beton")) == expected
    assert dataset_manifest([directory / "part-0.beton", str(directory / "part-[12].beton")]) == expected
    from_file = dataset_manifest(str(directory / "train.json"))
    assert (from_file.shards, from_file.fields) == (expected.shards, expected.fields)
    mixed = dataset_manifest([str(directory / "train.json"), write_part(tmp_path / "extra.beton", 0, 5)])
    assert [shard.start for shard in mixed.shards] == [0, 13, 13, 40] and mixed.num_samples == 45
    literal = shutil.copy(shards[0], tmp_path / "odd[1].beton")  # an existing name is itself, not a glob
    assert dataset_manifest(str(literal)).num_samples == 13


@pytest.mark.parametrize("url", ["http://127.0.0.1:1/data-*.beton", "https://127.0.0.1:1/shards/data-[0-9].beton"])
def test_a_glob_over_http_is_refused_before_any_request(url):
    from beton.errors import ShardNotFoundError

    for name in (url, [url]):  # nothing listens on port 1: a request would end in another error
        with pytest.raises(ShardNotFoundError) as caught:
            beton.Loader(name, batch_size=4)
        assert caught.value.path == url
        message = str(caught.value)
        assert "a glob over HTTP(S) cannot be expanded" in message and "list of URLs" in message
        assert "manifest file written by `beton index`" in message
    with pytest.raises(ShardNotFoundError, match="HTTP cannot list files"):
        dataset_manifest(["http://127.0.0.1:1/a.beton", url])


def test_a_query_or_a_bracketed_host_makes_no_http_glob():
    from beton.dataset.shards import names_one_file

    assert names_one_file("http://[::1]:8000/train.beton?X-Signature=a*b[c]")  # a query and an IPv6 host
    assert not names_one_file("s3://bucket/part-*.beton")  # stores that list still glob


def test_a_list_whose_fields_differ_names_the_file_and_field(shards, tmp_path):
    other = write_part(tmp_path / "other.beton", 0, 3, fields={"label": IntField(), "score": FloatField(),
                                                               "arr": NDArrayField(np.float64, (3, 4))},
                       samples=[(i, 0.5, np.zeros((3, 4))) for i in range(3)])
    with pytest.raises(ShardError) as caught:
        dataset_manifest([*shards, other])
    assert caught.value.path == other
    assert "field 'arr' (beton.NDArrayField) has argument dtype=\"<f8\", expected dtype=\"<f4\"" in str(caught.value)
    with pytest.raises(ShardError) as caught:  # the first file named is the reference
        dataset_manifest([other, *shards])
    assert caught.value.path == shards[0] and "has argument dtype=\"<f4\", expected dtype=\"<f8\"" in str(caught.value)
    with pytest.raises(ShardError, match="named twice"):
        dataset_manifest([shards[0], shards[1], shards[0]])


def test_one_file_under_two_names_is_named_twice(shards, tmp_path, monkeypatch):
    """Another spelling of a path, a link or a hard link to it was a second shard: every sample came twice (a
    glob listed relative next to absolute paths, or a folder's files and a link among them)."""
    first = shards[0]
    monkeypatch.chdir(os.path.dirname(first))
    link, hard = tmp_path / "link.beton", tmp_path / "hard.beton"
    os.symlink(first, link)
    os.link(first, hard)
    doubled = os.path.join(os.path.dirname(first), "", os.path.basename(first)).replace("/", "//", 1)
    for other in (os.path.basename(first), f"./{os.path.basename(first)}", doubled, str(link), str(hard)):
        with pytest.raises(ShardError, match=rf"named twice \(as shard 0 and 2, first as '{re.escape(first)}'\)"):
            dataset_manifest([first, shards[1], other])
        with pytest.raises(ShardError, match="named twice"):
            beton.Loader([first, other], batch_size=4)
    glob = os.path.join(os.path.dirname(first), "*.beton")
    with pytest.raises(ShardError, match="named twice"):
        dataset_manifest([glob, "./" + os.path.basename(first)])
    assert len(dataset_manifest([first, *shards[1:]]).shards) == len(shards)  # distinct files stay accepted


def test_what_names_no_dataset(tmp_path):
    with pytest.raises(ValueError, match="no shards given"):
        dataset_manifest([])
    with pytest.raises(FileNotFoundError, match="no file matches"):
        dataset_manifest(str(tmp_path / "*.beton"))
    with pytest.raises(FileNotFoundError):
        dataset_manifest(str(tmp_path / "missing.beton"))
    with pytest.raises(TypeError):
        dataset_manifest([3])
    text = tmp_path / "text.beton"
    text.write_bytes(b"hello" * 1000)
    with pytest.raises(FormatError, match="not a beton file"):
        dataset_manifest(str(text))
    ffcv = tmp_path / "ffcv.beton"  # a file FFCV 1.0.2 wrote (tests/data/ffcv)
    with gzip.open(DATA / "ffcv" / "ffcv_v2_raw.beton.gz") as source:
        ffcv.write_bytes(source.read())
    assert beton.Reader(ffcv).format.startswith("FFCV")
    with pytest.raises(FormatError, match="FFCV file carries no checksums"):
        dataset_manifest(str(ffcv))


def test_index_lists_only_shards_it_can_name_from_the_manifest(shards, tmp_path):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    with pytest.raises(ValueError, match="not inside the manifest's directory"):
        index(outside / "m.json", shards)
    assert not os.listdir(outside)
    with pytest.raises(ValueError, match="ends in .json"):
        index(tmp_path / "m.manifest", shards)
    nested = index(tmp_path / "top.json", shards)  # a parent directory: paths go down
    assert json.loads((tmp_path / "top.json").read_text())["shards"][0]["path"] == "data/part-0.beton"
    assert nested.source == str(tmp_path / "top.json")
    in_memory = Manifest(dataset_manifest(shards).shards[:1], dataset_manifest(shards).fields)
    with pytest.raises(ValueError, match=r"is a local file: a manifest at a URL \(https://host/m.json\) can list only"):
        in_memory.to_json("https://host/m.json")
    file_url = Manifest.of([("file:///x.beton", 1, "0" * 64)], in_memory.fields)
    with pytest.raises(ValueError, match="file:// URL"):
        file_url.to_json(tmp_path / "m.json")


# ---- remote shards ----------------------------------------------------------------------------------------------

@pytest.fixture
def http_shards(shards, tmp_path):
    pytest.importorskip("fsspec", reason="remote reads need fsspec (the 'remote' extra)")
    pytest.importorskip("aiohttp", reason="fsspec reads http:// through aiohttp (the 'remote' extra)")
    from range_server import RangeServer

    with RangeServer(tmp_path / "data") as server:
        yield server


def test_a_manifest_at_a_url_lists_shards_beside_it(http_shards, shards, tmp_path):
    from beton.dataset.merge import merge
    from beton import RemoteOptions

    fast = RemoteOptions(retries=2, backoff=0.001, timeout=5.0)
    url = http_shards.url("train.json")
    manifest = read_manifest(url, remote=fast)
    assert [shard.location for shard in manifest.shards] == [http_shards.url(f"part-{k}.beton") for k in range(3)]
    assert manifest.remote is fast
    with manifest.open_shard(2) as reader:  # with the options the manifest was read with
        assert reader[0][0] == 13
    merge(tmp_path / "merged.beton", url, remote=fast)
    merge(tmp_path / "local.beton", shards)
    with open(tmp_path / "merged.beton", "rb") as a, open(tmp_path / "local.beton", "rb") as b:
        assert a.read() == b.read()
    urls = [http_shards.url(f"part-{k}.beton") for k in range(3)]
    local_manifest = index(tmp_path / "urls.json", urls, verify=True, remote=fast)  # several at once
    assert [entry["path"] for entry in json.loads((tmp_path / "urls.json").read_text())["shards"]] == urls
    assert local_manifest.num_samples == 40
    from range_server import Fault

    http_shards.faults.append(Fault("corrupt", name="part-2.beton", from_byte=4096))  # a damaged page, fetched again
    merge(tmp_path / "again.beton", urls, remote=fast)
    assert http_shards.faults[0].times == 0  # the damaged answer was given, and not copied
    with open(tmp_path / "again.beton", "rb") as a, open(tmp_path / "local.beton", "rb") as b:
        assert a.read() == b.read()


def test_a_tables_file_damaged_on_the_way_is_fetched_again(http_shards):
    """One flipped byte in transit made the intact tables file "not the one the manifest lists" (run `beton index`
    again); as a page or header, it is fetched again within the retry budget, and only a digest that stays wrong
    is refused."""
    from beton import RemoteOptions
    from beton.dataset.union import open_dataset
    from range_server import Fault

    fast = RemoteOptions(retries=2, backoff=0.001, timeout=5.0)
    url = http_shards.url("train.json")
    http_shards.faults.append(Fault("corrupt", name="train.tables"))
    with open_dataset(url, remote=fast) as opened:
        assert opened.num_samples == 40
    assert http_shards.faults[0].times == 0  # the damaged answer was given
    http_shards.faults[:] = [Fault("corrupt", times=3, name="train.tables")]  # every try of the budget
    with pytest.raises(FormatError, match="SHA-256 differs"):
        open_dataset(url, remote=fast)
    assert http_shards.faults[0].times == 0


def test_s3_globs_and_manifests_written_to_s3(shards, tmp_path):
    from beton import RemoteOptions

    with moto_s3() as options:
        import fsspec

        fs = fsspec.filesystem("s3", skip_instance_cache=True, **options)
        fs.mkdir("shards")
        for k, path in enumerate(shards):
            fs.put_file(path, f"shards/train/part-{k}.beton")
        remote = RemoteOptions(storage_options=options)
        manifest = dataset_manifest("s3://shards/train/part-*.beton", remote=remote)
        assert [shard.location for shard in manifest.shards] == [f"s3://shards/train/part-{k}.beton" for k in range(3)]
        index("s3://shards/train.json", "s3://shards/train/part-*.beton", remote=remote)
        document = json.loads(fs.cat_file("shards/train.json"))
        assert [entry["path"] for entry in document["shards"]] == [f"train/part-{k}.beton" for k in range(3)]
        again = read_manifest("s3://shards/train.json", remote=remote)
        assert again.shards == manifest.shards
        with again.open_shard(0) as reader:  # the manifest's own RemoteOptions reach the bucket
            assert len(reader) == 13
