"""What a manifest file may name (issue #25 item 2): shards in its own directory or below, nothing else, unless
the reader opts in with ``allow_outside=True``; and errors that never show bytes of a file that is not a beton file.

Every hostile entry (tests/manifest_entries.py) is refused while the manifest is read, naming the entry, without
opening it: the entries point at a FIFO, whose opening would hang the read (each read runs in a thread with a
timeout), and the loopback servers' request logs show that nothing but the manifest was asked for."""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import beton
from beton.errors import FormatError
from beton.dataset.manifest import header_digest, parse_manifest, read_manifest, resolve_listed_path
from beton.storage.reader import read_head
from beton.dataset.shards import dataset_manifest

from manifest_entries import EVERYWHERE, LOCAL, REMOTE, hostile_manifest, make_sandbox
from processes import refusal


FIELDS_JSON = [{"name": "label", "type": "beton.IntField", "arguments": {}, "metadata_dtype": "<i8",
                "payload": False}]


@pytest.fixture
def sandbox(tmp_path):
    return make_sandbox(str(tmp_path))


@pytest.fixture
def servers(sandbox):
    """Loopback servers of the sandbox (the manifest's directory is ``/data``) and of the directory beside it."""
    pytest.importorskip("fsspec", reason="remote reads need fsspec (the 'remote' extra)")
    pytest.importorskip("aiohttp", reason="fsspec reads http:// through aiohttp (the 'remote' extra)")
    from range_server import RangeServer

    with RangeServer(os.path.dirname(sandbox["data"])) as here, RangeServer(sandbox["outside"]) as other:
        yield here, other


def entry_of(path: str, listed_as: str) -> dict:
    head = read_head(path)
    return {"path": listed_as, "num_samples": head.num_samples, "header_sha256": header_digest(head.header)}


def with_shards(sandbox: dict, entries: list[dict], name: str) -> str:
    with open(sandbox["manifest"]) as file:
        document = json.load(file)
    document.update(shards=entries, num_samples=sum(entry["num_samples"] for entry in entries))
    del document["tables"]  # it describes the sandbox's shards, not these
    path = os.path.join(sandbox["data"], name)
    with open(path, "w") as file:
        json.dump(document, file)
    return path


# ---- refused --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", [*EVERYWHERE, *LOCAL])
@pytest.mark.parametrize("allow_outside", [False, True])
def test_a_local_manifest_names_nothing_but_its_shards(sandbox, name, allow_outside):
    template, words = {**EVERYWHERE, **LOCAL}[name]
    entry = template.format(outside=sandbox["outside"], other="http://127.0.0.1:1")
    path = hostile_manifest(sandbox, entry)
    if allow_outside and "outside the manifest's directory" in words:
        return  # what the opt-in lifts: test_the_opt_in_reads_a_shard_outside
    error = refusal(lambda: dataset_manifest(path, allow_outside=allow_outside))
    assert isinstance(error, FormatError) and error.path == path
    assert f"shard 0: {entry!r}" in str(error) and words in str(error), str(error)


@pytest.mark.parametrize("name", [*EVERYWHERE, *REMOTE])
def test_a_manifest_at_a_url_names_only_shards_under_its_prefix(sandbox, servers, name):
    here, other = servers
    template, words = {**EVERYWHERE, **REMOTE}[name]
    entry = template.format(outside=sandbox["outside"], other=other.url("").rstrip("/"))
    hostile_manifest(sandbox, entry)
    url = here.url("data/hostile.json")
    error = refusal(lambda: beton.Loader(url, batch_size=2))
    assert isinstance(error, FormatError) and error.path == url
    assert f"shard 0: {entry!r}" in str(error) and words in str(error), str(error)
    assert other.paths == [] and set(here.paths) == {"/data/hostile.json"}, (here.paths, other.paths)


@pytest.mark.parametrize("entry", ["simplecache::{outside}/secret", "file://{outside}/secret", "{outside}/secret",
                                   "tar://x.beton::{outside}/a.tar"])
def test_the_opt_in_does_not_open_local_files_or_chains_from_a_url(sandbox, servers, entry):
    here, other = servers
    entry = entry.format(outside=sandbox["outside"])
    hostile_manifest(sandbox, entry)
    error = refusal(lambda: read_manifest(here.url("data/hostile.json"), allow_outside=True))
    assert isinstance(error, FormatError) and repr(entry) in str(error)
    assert other.paths == []


# ---- the opt-in, and what keeps working -----------------------------------------------------------------------

def test_the_opt_in_reads_a_shard_outside(sandbox, servers):
    here, other = servers
    inside = entry_of(os.path.join(sandbox["data"], "part-0.beton"), "part-0.beton")
    for name, listed_as in (("dot-dot.json", "../outside/outside.beton"),
                            ("absolute.json", sandbox["outside_shard"])):
        path = with_shards(sandbox, [inside, entry_of(sandbox["outside_shard"], listed_as)], name)
        with pytest.raises(FormatError, match="outside the manifest's directory"):
            dataset_manifest(path)
        manifest = dataset_manifest(path, allow_outside=True)
        assert manifest.shards[1].location == sandbox["outside_shard"]
        with beton.Loader(manifest, batch_size=6) as loader:
            assert [batch[0].tolist() for batch in loader] == [[0, 1, 2, 9, 10, 11]]
    far = other.url("outside.beton")
    with_shards(sandbox, [inside, entry_of(sandbox["outside_shard"], far)], "far.json")
    with pytest.raises(FormatError, match="outside the manifest's directory"):
        read_manifest(here.url("data/far.json"))
    assert other.paths == []
    manifest = read_manifest(here.url("data/far.json"), allow_outside=True)
    with manifest.open_shard(1) as reader:
        assert [reader[k][0] for k in range(3)] == [9, 10, 11]


def test_legitimate_manifests_keep_working(sandbox, servers):
    here, _ = servers
    with beton.Loader(sandbox["manifest"], batch_size=6) as loader:  # relative names, a subfolder
        assert [batch[0].tolist() for batch in loader] == [[0, 1, 2, 3, 4, 5]]
    data = sandbox["data"]
    absolute = with_shards(sandbox, [entry_of(os.path.join(data, "part-0.beton"), os.path.join(data, "part-0.beton")),
                                     entry_of(os.path.join(data, "part-2.beton"), "sub/../part-2.beton")], "abs.json")
    manifest = dataset_manifest(absolute)  # an absolute path inside; '..' that stays inside, normalised
    assert [shard.location for shard in manifest.shards] == [os.path.join(data, "part-0.beton"),
                                                             os.path.join(data, "part-2.beton")]
    with beton.Loader(manifest, batch_size=6) as loader:
        assert [batch[0].tolist() for batch in loader] == [[0, 1, 2, 6, 7, 8]]
    with_shards(sandbox, [entry_of(os.path.join(data, "sub", "part-1.beton"), "sub/part-1.beton"),
                          entry_of(os.path.join(data, "part-2.beton"), here.url("data/part-2.beton"))], "remote.json")
    manifest = read_manifest(here.url("data/remote.json"))  # a subfolder, and an absolute URL under the prefix
    assert [shard.location for shard in manifest.shards] == [here.url("data/sub/part-1.beton"),
                                                             here.url("data/part-2.beton")]
    with beton.Loader(manifest, batch_size=6) as loader:
        assert [batch[0].tolist() for batch in loader] == [[3, 4, 5, 6, 7, 8]]


# ---- no bytes of other files in errors ------------------------------------------------------------------------

@pytest.mark.parametrize("content", [b"root:x:0:0:root:/root:/bin/bash\n" * 20, b"root:x", b"\x00secret\x01" * 40])
def test_a_file_that_is_not_beton_is_not_shown_in_the_error(sandbox, servers, content):
    here, _ = servers
    path = os.path.join(sandbox["data"], "notes.txt")
    with open(path, "wb") as file:
        file.write(content)
    calls = {"Reader": lambda: beton.Reader(path), "read_head": lambda: read_head(path),
             "dataset_manifest": lambda: dataset_manifest([path]),
             "Reader over HTTP": lambda: beton.Reader(here.url("data/notes.txt"))}
    for what, call in calls.items():
        with pytest.raises(FormatError) as caught:
            call()
        message = str(caught.value)
        assert "not a beton file" in message, (what, message)
        for shown in (repr(content[:8]), repr(content[:4]), content[:6].decode("latin-1"), content[:8].hex()):
            assert shown not in message, (what, message)


@settings(max_examples=300, deadline=None)
@given(paths=st.lists(st.text(alphabet="ab./", max_size=6) | st.text(alphabet="ab./_-%2e\\é\n", max_size=7),
                      min_size=1, max_size=4),
       count=st.sampled_from([0, 3, True, -1, 2**63]), digest=st.sampled_from(["ab" * 32, "AB" * 32, "a" * 63]))
@example(paths=["a/..", "b/./c", "c/.d"], count=1, digest="ab" * 32)  # plain characters, segments that resolve
@example(paths=["a", "b//c"], count=1, digest="ab" * 32)
@example(paths=["a", "d/"], count=1, digest="ab" * 32)
def test_a_whole_list_of_shards_is_read_as_each_entry_alone_is(paths, count, digest):
    # a manifest's list is checked list by list where every entry is plain (what `beton index` writes), else entry
    # by entry: the result, or the refusal, is the same as the rules give for each entry alone
    entries = [{"path": path, "num_samples": count, "header_sha256": digest} for path in paths]
    data = json.dumps({"format": "beton-manifest", "version": 1, "num_samples": count * len(paths) if
                       type(count) is int else 0, "fields": FIELDS_JSON, "shards": entries}).encode()
    try:
        expected = [resolve_listed_path(path, "/d/sub/../m.json") for path in paths]
        valid = ("" not in paths and type(count) is int and 0 <= count * len(paths) < 2**63 and digest == "ab" * 32
                 and len(set(expected)) == len(expected))
    except FormatError:
        valid = False
    if not valid:
        with pytest.raises(FormatError):
            parse_manifest(data, "/d/sub/../m.json")
        return
    manifest = parse_manifest(data, "/d/sub/../m.json")
    assert [shard.location for shard in manifest.shards] == expected
    assert [shard.start for shard in manifest.shards] == [count * k for k in range(len(paths))]
