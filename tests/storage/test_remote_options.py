"""One way to configure remote reading: every entry point that can open a URL takes one ``RemoteOptions`` as
``remote=`` and hands it, unchanged, to the file system; the older spellings are gone.

The store is an fsspec memory file system registered under its own protocol that opens only when it is given the
storage option ``token=TOKEN``: a road that dropped the user's options on the way fails with PermissionError.
"""

from __future__ import annotations

import json

import pytest

fsspec = pytest.importorskip("fsspec", reason="remote reads need fsspec (the 'remote' extra)")

from fsspec.implementations.memory import MemoryFileSystem  # noqa: E402

import beton  # noqa: E402
from beton import Loader, Reader, RemoteOptions  # noqa: E402
from beton.memory import ProcessCache  # noqa: E402
from beton.dataset import ShardedDataset, dataset_manifest, index, merge, read_manifest  # noqa: E402
from beton.storage.reader import read_head  # noqa: E402
from beton.tools.cli import main as cli  # noqa: E402
from conftest import MIXED_FIELDS, mixed_sample, write  # noqa: E402

PROTOCOL = "betonguarded"
TOKEN = "the user's own"
OPTIONS = RemoteOptions(storage_options={"token": TOKEN}, retries=1, backoff=0.001, timeout=5.0)
PIPELINES = {"blob": None, "meta": None}
COUNTS = (30, 20)


class GuardedFileSystem(MemoryFileSystem):
    """An in-memory store (its own, not fsspec's shared one) that opens only with ``token=TOKEN``."""

    protocol = PROTOCOL
    store: dict = {}
    pseudo_dirs = [""]

    def __init__(self, *args, token=None, **kwargs):
        if token != TOKEN:
            raise PermissionError(f"{PROTOCOL}:// opened without the user's storage options (token={token!r})")
        super().__init__(*args, **kwargs)

    @classmethod
    def _strip_protocol(cls, path):
        return super()._strip_protocol(path.removeprefix(f"{PROTOCOL}://") if isinstance(path, str) else path)


@pytest.fixture(scope="module")
def guarded(tmp_path_factory):
    """Two shards and a manifest beside them in the guarded store: (shard URLs, manifest URL, local copies)."""
    fsspec.register_implementation(PROTOCOL, GuardedFileSystem, clobber=True)
    directory = tmp_path_factory.mktemp("guarded")
    store = GuardedFileSystem(token=TOKEN)
    paths, urls, start = [], [], 0
    for number, count in enumerate(COUNTS):
        path = write(str(directory / f"part-{number}.beton"), MIXED_FIELDS,
                     [mixed_sample(start + i) for i in range(count)], page_size=1024)
        store.pipe_file(f"/bucket/part-{number}.beton", open(path, "rb").read())
        paths.append(path)
        urls.append(f"{PROTOCOL}://bucket/part-{number}.beton")
        start += count
    manifest = f"{PROTOCOL}://bucket/train.json"
    dataset_manifest(urls, remote=OPTIONS).write(manifest)  # the manifest's own options reach the store
    yield urls, manifest, paths
    GuardedFileSystem.store.clear()
    GuardedFileSystem.pseudo_dirs[:] = [""]


def labels(loader) -> list[int]:
    return [int(label) for batch in loader for label in batch[0]]


def test_the_store_refuses_a_url_opened_without_the_users_options(guarded):
    urls, manifest, _ = guarded
    with pytest.raises(PermissionError, match="without the user's storage options"):
        Reader(urls[0])
    with pytest.raises(PermissionError):
        read_manifest(manifest)
    with pytest.raises(PermissionError):
        Reader(urls[0], remote=RemoteOptions(retries=0))


def test_reader_verify_and_read_head_pass_remote_to_the_file_system(guarded):
    urls, _, paths = guarded
    with Reader(urls[0], remote=OPTIONS) as reader, Reader(paths[0]) as local:
        assert reader.remote.options is OPTIONS  # passed down unchanged
        assert reader.remote.fetcher.fs.storage_options == {"token": TOKEN}
        assert [str(value) for value in reader[7]] == [str(value) for value in local[7]]
    assert beton.verify(urls[0], remote=OPTIONS).num_samples == COUNTS[0]
    assert read_head(urls[1], remote=OPTIONS).num_samples == COUNTS[1]


def test_manifests_indexes_and_merges_pass_remote_to_the_file_system(guarded, tmp_path):
    urls, manifest, paths = guarded
    listed = read_manifest(manifest, remote=OPTIONS)
    assert listed.remote is OPTIONS and [shard.location for shard in listed.shards] == urls
    with listed.open_shard(1) as reader:  # no options given: the manifest's own
        assert reader.remote.options is OPTIONS and len(reader) == COUNTS[1]
    globbed = dataset_manifest(f"{PROTOCOL}://bucket/part-*.beton", remote=OPTIONS)  # listing the store too
    assert globbed.num_samples == sum(COUNTS) and globbed.remote is OPTIONS
    with dataset_manifest(urls, remote=OPTIONS).open_shard(0) as reader:
        assert reader.remote.options is OPTIONS
    written = index(f"{PROTOCOL}://bucket/again.json", urls, verify=True, remote=OPTIONS)
    assert written.remote is OPTIONS and read_manifest(written.source, remote=OPTIONS).shards == listed.shards
    merge(tmp_path / "merged.beton", manifest, remote=OPTIONS)
    merge(tmp_path / "local.beton", paths)
    assert (tmp_path / "merged.beton").read_bytes() == (tmp_path / "local.beton").read_bytes()


@pytest.mark.parametrize("source", ["one file", "a list", "a manifest"])
def test_the_loader_passes_remote_to_the_file_system(guarded, source):
    urls, manifest, _ = guarded
    path = {"one file": urls[0], "a list": urls, "a manifest": manifest}[source]
    with Loader(path, batch_size=16, num_workers=1, pipelines=PIPELINES, remote=OPTIONS) as loader:
        dataset = loader.reader
        if isinstance(dataset, ShardedDataset):  # shards are opened as needed, with the options it holds
            for number in range(len(dataset.manifest.shards)):
                with dataset.open_shard(number) as reader:
                    # several remote files share one read-ahead budget: the rest of the options arrive as given
                    assert reader.remote.options.storage_options is OPTIONS.storage_options
        else:
            assert dataset.remote.options is OPTIONS
        expected = list(range(COUNTS[0] if source == "one file" else sum(COUNTS)))
        assert labels(loader) == expected and labels(loader) == expected  # a second epoch checks identities


def test_the_cli_flags_build_the_remote_options(guarded, tmp_path, capsys):
    urls, manifest, paths = guarded
    flags = ["--storage-options", json.dumps({"token": TOKEN}), "--retries", "1", "--backoff", "0.001"]
    assert cli(["info", urls[0], *flags]) == 0
    assert f"samples:     {COUNTS[0]}" in capsys.readouterr().out
    assert cli(["verify", urls[1], *flags]) == 0
    assert cli(["index", f"{PROTOCOL}://bucket/cli.json", *urls, *flags]) == 0
    assert cli(["merge", str(tmp_path / "merged.beton"), manifest, *flags]) == 0
    with Reader(tmp_path / "merged.beton") as reader:
        assert len(reader) == sum(COUNTS)
    capsys.readouterr()
    assert cli(["verify", urls[1]]) == 1  # without the flags the store refuses
    assert "without the user's storage options" in capsys.readouterr().err


OLD_SPELLINGS = ["storage_options", "cache_dir", "cache_limit", "remote_options"]


@pytest.mark.parametrize("keyword", OLD_SPELLINGS)
def test_the_older_keywords_are_gone(guarded, keyword, tmp_path):
    _, _, paths = guarded
    value = {"storage_options": {}, "cache_dir": str(tmp_path), "cache_limit": 1, "remote_options": OPTIONS}[keyword]
    calls = [lambda **kw: Reader(paths[0], **kw), lambda **kw: beton.verify(paths[0], **kw),
             lambda **kw: read_head(paths[0], **kw), lambda **kw: dataset_manifest(paths, **kw),
             lambda **kw: index(tmp_path / "x.json", paths, **kw),
             lambda **kw: merge(tmp_path / "x.beton", paths, **kw),
             lambda **kw: Loader(paths[0], batch_size=4, pipelines=PIPELINES, **kw)]
    for call in calls:
        with pytest.raises(TypeError, match=f"unexpected keyword argument '{keyword}'"):
            call(**{keyword: value})
    assert not (tmp_path / "x.json").exists() and not (tmp_path / "x.beton").exists()


def test_remote_settings_left_the_memory_strategy_and_the_old_helper_is_gone():
    with pytest.raises(TypeError, match="unexpected keyword argument 'remote'"):
        ProcessCache(remote=OPTIONS)
    import beton.storage.remote

    assert not hasattr(beton.storage.remote, "resolve_remote_options")


@pytest.mark.parametrize("value", [{"token": TOKEN}, "s3", 8])
def test_remote_takes_only_a_remote_options_even_for_a_local_path(guarded, value):
    _, _, paths = guarded
    for call in (lambda: Reader(paths[0], remote=value), lambda: beton.verify(paths[0], remote=value),
                 lambda: dataset_manifest(paths, remote=value),
                 lambda: Loader(paths[0], batch_size=4, pipelines=PIPELINES, remote=value)):
        with pytest.raises(TypeError, match=r"remote= takes a beton.RemoteOptions \(fsspec's settings go in "):
            call()


def test_a_local_path_ignores_remote(guarded):
    _, _, paths = guarded
    unused = RemoteOptions(cache_dir="/nonexistent/never-used", storage_options={"token": "elsewhere"})
    with Reader(paths[0], remote=unused) as reader:
        assert reader.remote is None
    with Loader(paths, batch_size=16, num_workers=1, pipelines=PIPELINES, remote=unused) as loader:
        assert labels(loader) == list(range(sum(COUNTS)))
