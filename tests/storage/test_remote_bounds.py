"""Remote reads against hostile servers (``tests/hostile_server.py`` on loopback): every answer is held to the size
asked for, whatever the server sends; every request is retried alike, the size/identity one included; a missing
file fails at once; redirects follow ``RemoteOptions.redirects``.

Memory is measured with ``tracemalloc`` (numpy and aiohttp's buffers are traced): the servers send 50 MB files and
bodies cut at 64 MiB, so a client that read an answer whole would pass the bounds below many times over
(``test_the_measure_sees_a_whole_body_read`` shows it does, with fsspec's own ``cat_file``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import tracemalloc

import numpy as np
import pytest

pytest.importorskip("fsspec", reason="remote reads need fsspec (the 'remote' extra)")
pytest.importorskip("aiohttp", reason="fsspec reads http:// through aiohttp (the 'remote' extra)")

import beton  # noqa: E402
from beton.errors import FormatError, ShardNotFoundError, StorageError  # noqa: E402
from beton.dataset import dataset_manifest, merge, read_manifest  # noqa: E402
from beton.dataset.manifest import MAX_MANIFEST_BYTES  # noqa: E402
from beton.storage.reader import read_head  # noqa: E402
from beton.storage.remote import RemoteOptions  # noqa: E402
from beton.storage.remote.http import redirect_allowed  # noqa: E402
from beton.tools.cli import main as cli  # noqa: E402
from conftest import MIXED_FIELDS, mixed_sample, write  # noqa: E402
from hostile_server import Attack, HostileServer  # noqa: E402
from processes import moto_s3  # noqa: E402

FAST = RemoteOptions(retries=2, backoff=0.001, max_backoff=0.01, timeout=5.0)
FAST_FLAGS = ["--retries", "2", "--backoff", "0.001", "--max-backoff", "0.01"]
BIG = 50 * 2**20  # the file a server that ignores Range sends whole
BOUND = 4 * 2**20  # peak traced memory of a refused answer: requests here are 64 KiB at most
PIPELINES = {"blob": None, "meta": None}

# what each attack on a range is refused with
REFUSED = {"ignore-range": "does not honour Range", "huge-length": "announced 3221225472 bytes",
           "endless-chunked": "more than the"}


@pytest.fixture(scope="module")
def hosted(tmp_path_factory):
    """A beton file, a manifest of it, a 50 MB file and a manifest too large, served by a hostile server:
    (server, directory)."""
    directory = tmp_path_factory.mktemp("hosted")
    write(str(directory / "data.beton"), MIXED_FIELDS, [mixed_sample(i) for i in range(200)], page_size=1024)
    with open(directory / "big.bin", "wb") as file:
        file.truncate(BIG)
    with open(directory / "huge.json", "wb") as file:
        file.truncate(MAX_MANIFEST_BYTES + 1)
    with HostileServer(directory) as server:
        manifest = dataset_manifest([server.url("data.beton")], remote=FAST)
        (directory / "train.json").write_bytes(manifest.to_json(server.url("train.json")))
        beton.Reader(server.url("data.beton"), remote=FAST).close()  # imports and sessions warm before measuring
        yield server, directory


@pytest.fixture
def server(hosted):
    server, _ = hosted
    server.attacks.clear()
    server.log.clear()
    yield server
    server.attacks.clear()


@contextlib.contextmanager
def traced() -> dict:
    """``{"peak": bytes}``: the most memory traced while the block ran."""
    result: dict = {}
    gc.collect()
    tracemalloc.start()
    try:
        yield result
    finally:
        result["peak"] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()


def _merge(url, tmp_path):
    return merge(str(tmp_path / "merged.beton"), [url], remote=FAST)


def _info(url, tmp_path):
    if cli(["info", url, *FAST_FLAGS]) != 0:
        raise StorageError("beton info failed")


ENTRIES = {
    "Reader": lambda url, tmp_path: beton.Reader(url, remote=FAST),
    "verify": lambda url, tmp_path: beton.verify(url, remote=FAST),
    "read_head": lambda url, tmp_path: read_head(url, remote=FAST),
    "merge": _merge,
    "info": _info,
    "read_manifest": lambda url, tmp_path: read_manifest(url, remote=FAST),
}


# ---- answers that are not the range asked for ----------------------------------------------------------------

@pytest.mark.parametrize("kind", list(REFUSED))
@pytest.mark.parametrize("entry", list(ENTRIES))
def test_every_entry_point_refuses_a_wrong_answer_at_opening_with_bounded_memory(server, entry, kind, tmp_path,
                                                                               capsys):
    name = "train.json" if entry == "read_manifest" else "data.beton"
    server.attacks.append(Attack(kind, times=100, method="GET"))
    with traced() as memory, pytest.raises(StorageError) as caught:
        ENTRIES[entry](server.url(name), tmp_path)
    message = capsys.readouterr().err if entry == "info" else str(caught.value)
    assert REFUSED[kind] in message and server.url(name) in message
    assert memory["peak"] < BOUND, f"{memory['peak']} bytes traced"
    retried = kind != "ignore-range"  # a server that ignores ranges will not start honouring them
    assert server.requests("GET") == (FAST.retries + 1 if retried else 1)


@pytest.mark.parametrize("kind", list(REFUSED))
def test_a_server_sending_50_mb_or_3_gib_or_an_endless_body_is_refused_early(server, kind):
    server.attacks.append(Attack(kind, times=100, method="GET"))
    with traced() as memory, pytest.raises(StorageError, match=REFUSED[kind]):
        beton.Reader(server.url("big.bin"), remote=FAST)
    assert memory["peak"] < BOUND, f"{memory['peak']} bytes traced"


def test_the_measure_sees_a_whole_body_read(server):
    """The control: fsspec's own cat_file of 64 KiB from a server that ignores ranges holds the whole 50 MB."""
    import fsspec

    server.attacks.append(Attack("ignore-range", method="GET"))
    filesystem = fsspec.filesystem("http")
    with traced() as memory:
        with contextlib.suppress(Exception):
            filesystem.cat_file(server.url("big.bin"), start=0, end=65536)
    assert memory["peak"] > BIG


@pytest.mark.parametrize("kind", list(REFUSED))
def test_a_wrong_answer_for_a_page_is_refused_with_bounded_memory(server, kind):
    with beton.Reader(server.url("data.beton"), remote=FAST) as reader:
        start = reader.page_bounds(3)[0]
        server.attacks.append(Attack(kind, times=100, method="GET"))
        with traced() as memory, pytest.raises(StorageError, match=REFUSED[kind]) as caught:
            reader.file_map[start : start + 10]
    assert "page 3" in str(caught.value) and memory["peak"] < BOUND


def test_an_endless_body_mid_epoch_reaches_the_training_loop(server):
    loader = beton.Loader(server.url("data.beton"), batch_size=20, num_workers=2, pipelines=PIPELINES, remote=FAST)
    server.attacks.append(Attack("endless-chunked", times=1000, method="GET"))
    with traced() as memory, pytest.raises(StorageError, match=REFUSED["endless-chunked"]):
        list(loader)
    loader.close()
    assert memory["peak"] < 8 * BOUND  # the loader's own slots and page pool besides


def test_a_manifest_larger_than_its_cap_is_refused_before_it_is_fetched(server):
    with pytest.raises(FormatError, match=f"at most {MAX_MANIFEST_BYTES} bytes"):
        read_manifest(server.url("huge.json"), remote=FAST)
    assert server.requests("GET") == 0


# ---- the size/identity request ----------------------------------------------------------------------------------

@pytest.mark.parametrize("kind, said", [("long-header", "Got more than 8190 bytes"),
                                        ("many-headers", "Too many headers")])
def test_oversized_headers_are_a_storage_error_after_the_retries(server, kind, said):
    server.attacks.append(Attack(kind, times=100))
    with traced() as memory, pytest.raises(StorageError, match=said) as caught:
        beton.Reader(server.url("data.beton"), remote=FAST)
    assert not isinstance(caught.value, FileNotFoundError)
    assert f"failed {FAST.retries + 1} times" in str(caught.value) and memory["peak"] < BOUND
    assert server.requests("HEAD") == FAST.retries + 1


def test_two_503_on_the_size_request_at_opening_and_at_a_later_epoch_are_retried(server, hosted):
    _, directory = hosted
    expected = [label for batch in beton.Loader(str(directory / "data.beton"), batch_size=20, pipelines=PIPELINES,
                                                 order=beton.OrderOption.SEQUENTIAL) for label in batch[0].tolist()]
    server.attacks.append(Attack("503", times=2, method="HEAD"))
    loader = beton.Loader(server.url("data.beton"), batch_size=20, num_workers=2, pipelines=PIPELINES, remote=FAST)
    assert server.requests("HEAD") == 3
    assert [label for batch in loader for label in batch[0].tolist()] == expected
    server.attacks.append(Attack("503", times=2, method="HEAD"))
    before = server.requests("HEAD")
    assert [label for batch in loader for label in batch[0].tolist()] == expected  # the epoch's identity check
    assert server.requests("HEAD") - before == 3
    loader.close()


def test_a_missing_file_fails_at_once_without_retries(server):
    with pytest.raises(ShardNotFoundError, match="404") as caught:
        beton.Reader(server.url("missing.beton"), remote=FAST)
    assert isinstance(caught.value, FileNotFoundError) and caught.value.path == server.url("missing.beton")
    assert server.requests() == 1


def test_a_file_gone_while_read_fails_at_once(server):
    with beton.Reader(server.url("data.beton"), remote=FAST) as reader:
        start = reader.page_bounds(5)[0]
        server.log.clear()
        server.attacks.append(Attack("404", times=100, method="GET"))
        with pytest.raises(ShardNotFoundError, match="page 5"):
            reader.file_map[start : start + 10]
    assert server.requests("GET") == 1


def test_a_poisoned_keep_alive_connection_is_retried_on_a_new_one(server, hosted):
    """Bytes sent after an answer wait on the idle connection and garble the next answer read from it: that
    request fails, and its retry goes on a new connection, so one retry always mends it."""
    _, directory = hosted
    with beton.Reader(server.url("data.beton"), remote=dataclasses.replace(FAST, retries=1)) as reader, \
            beton.Reader(str(directory / "data.beton")) as local:
        retries: list[int] = []
        reader.remote.fetcher.pause = retries.append
        server.attacks.append(Attack("junk-after", times=30))
        for i in range(len(local)):
            assert np.array_equal(reader[i][2], local[i][2]) and reader[i][3] == local[i][3]
    assert server.attacks[0].times == 0 and retries and set(retries) == {0}


# ---- redirects ------------------------------------------------------------------------------------------------

@pytest.fixture
def elsewhere(hosted):
    """A second server on another port serving the same files."""
    _, directory = hosted
    with HostileServer(directory) as other:
        yield other


def test_a_redirect_to_another_port_is_refused_by_default_and_followed_when_allowed(server, elsewhere, hosted):
    _, directory = hosted
    server.attacks.append(Attack("redirect", times=100, location=elsewhere.url("{name}")))
    with pytest.raises(StorageError) as caught:
        beton.Reader(server.url("data.beton"), remote=FAST)
    assert server.url("data.beton") in str(caught.value) and elsewhere.url("data.beton") in str(caught.value)
    assert "redirects='any'" in str(caught.value) and elsewhere.requests() == 0
    assert server.requests() == 1  # a refused redirect is not retried
    with beton.Reader(server.url("data.beton"), remote=dataclasses.replace(FAST, redirects="any")) as reader, \
            beton.Reader(str(directory / "data.beton")) as local:
        assert [reader[i][0] for i in range(len(local))] == [local[i][0] for i in range(len(local))]
    assert elsewhere.requests() > 0


@pytest.mark.parametrize("credentials", [{"headers": {"Authorization": "Bearer secret"}},
                                         {"client_kwargs": {"headers": {"Cookie": "session=secret"}}},
                                         {"client_kwargs": {"auth": "basic"}}],
                         ids=["header", "session-cookie", "session-auth"])
def test_credentials_never_follow_a_redirect_to_another_origin(server, elsewhere, credentials):
    import aiohttp

    if credentials.get("client_kwargs", {}).get("auth") == "basic":
        credentials = {"client_kwargs": {"auth": aiohttp.BasicAuth("user", "secret")}}
    server.attacks.append(Attack("redirect", times=100, location=elsewhere.url("{name}")))
    options = dataclasses.replace(FAST, redirects="any", storage_options=credentials)
    with pytest.raises(StorageError, match="credentials are configured") as caught:
        beton.Reader(server.url("data.beton"), remote=options)
    assert elsewhere.url("data.beton") in str(caught.value) and elsewhere.requests() == 0


def test_a_same_origin_redirect_is_followed_unless_redirects_are_off(server, hosted):
    server.attacks.append(Attack("redirect", times=100, name="alias.beton", location="/data.beton"))
    with beton.Reader(server.url("alias.beton"), remote=FAST) as reader:
        assert len(reader) == 200
    with pytest.raises(StorageError, match="does not follow") as caught:
        beton.Reader(server.url("alias.beton"), remote=dataclasses.replace(FAST, redirects="none"))
    assert server.url("data.beton") in str(caught.value)


def test_a_redirect_loop_ends_after_five_hops(server):
    server.attacks.append(Attack("redirect", times=100, location="/{name}"))
    with pytest.raises(StorageError, match="more than 5 redirects"):
        beton.Reader(server.url("data.beton"), remote=FAST)
    assert server.requests() == 6


@pytest.mark.parametrize("policy, target, allowed", [
    ("same-origin", "http://h:80/b", True), ("same-origin", "http://H/b", True), ("same-origin", "https://h/b", False),
    ("same-origin", "http://h:81/b", False), ("same-origin", "http://g/b", False), ("none", "http://h/b", False),
    ("any", "https://g:9/b", True), ("any", "file:///etc/passwd", False), ("any", "ftp://h/b", False),
])
def test_the_redirect_policy(policy, target, allowed):
    assert redirect_allowed(policy, "http://h/a", target) is allowed


def test_the_redirect_policy_is_checked_and_has_a_flag(server):
    with pytest.raises(ValueError, match="redirects must be one of"):
        RemoteOptions(redirects="all")
    assert cli(["info", server.url("data.beton"), "--redirects", "none", *FAST_FLAGS]) == 0
    with pytest.raises(SystemExit):
        cli(["info", server.url("data.beton"), "--redirects", "sometimes"])



# ---- S3: GetObject streamed ----------------------------------------------------------------------------------

class _EndlessBody:
    """An S3 body that never ends, counting what was asked of it."""

    def __init__(self) -> None:
        self.bytes_read = 0
        self.closed = False

    async def read(self, amount: int) -> bytes:
        self.bytes_read += amount
        return b"\0" * amount

    def close(self) -> None:
        self.closed = True


class _FakeS3:
    """The two things of s3fs that the streamed range read uses."""

    def __init__(self, length) -> None:
        self.length, self.body, self.calls = length, _EndlessBody(), []

    def split_path(self, path):
        bucket, key = path.split("/", 1)
        return bucket, key, None

    async def _call_s3(self, method, **kwargs):
        self.calls.append((method, kwargs))
        return {"ContentLength": self.length, "Body": self.body}


@pytest.mark.parametrize("length", [None, 3 * 2**30])
def test_an_s3_body_longer_than_its_range_is_cut_at_the_range(length):
    import asyncio

    from beton.storage.remote.answers import CHUNK, AnswerError
    from beton.storage.remote.fetch import read_s3_range

    fake = _FakeS3(length)
    with pytest.raises(AnswerError) as caught:
        asyncio.run(read_s3_range(fake, "bucket/key", 100, 100 + 7000))
    assert caught.value.transient and fake.body.closed
    assert fake.calls == [("get_object", {"Bucket": "bucket", "Key": "key", "Range": "bytes=100-7099"})]
    assert fake.body.bytes_read <= 7000 + CHUNK  # nothing read when the announced length is wrong


def test_s3_reads_go_through_the_streamed_get_object(tmp_path):
    from beton.storage.remote.fetch import RangeFetcher

    with moto_s3() as options:
        import s3fs

        store = s3fs.S3FileSystem(skip_instance_cache=True, **options)
        store.mkdir("bounds")
        store.pipe_file("bounds/blob", bytes(range(256)) * 40)
        fetcher = RangeFetcher("s3://bounds/blob", dataclasses.replace(FAST, storage_options=options))
        assert fetcher.store == "s3" and fetcher.size == 10240
        assert fetcher.fetch(300, 1300, "a range") == (bytes(range(256)) * 40)[300:1300]
        with pytest.raises(ShardNotFoundError):
            RangeFetcher("s3://bounds/missing", dataclasses.replace(FAST, storage_options=options))
