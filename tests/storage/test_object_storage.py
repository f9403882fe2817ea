"""Object storage end to end, against an S3 server (moto) started here on loopback: writing to URLs (nothing
visible until complete, nothing left by a failure), one retry budget (the clients' own retries off, credential
errors at once), identity by ETag and size, stale cached versions removed, missing objects named."""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import socket
import tempfile
import threading
import time

import pytest

pytest.importorskip("fsspec", reason="remote reads need fsspec (the 'remote' extra)")

import beton  # noqa: E402
from beton.dataset.merge import merge  # noqa: E402
from beton.dataset.shards import dataset_manifest, index  # noqa: E402
from beton.dataset.union import open_dataset  # noqa: E402
from beton.errors import (BetonError, DatasetError, FormatError, ShardNotFoundError, StorageError,  # noqa: E402
                          WriterError)
from beton.storage.remote import RemoteOptions  # noqa: E402
from beton.storage.verify import verify_reader  # noqa: E402
from conftest import MIXED_FIELDS, ListDataset, mixed_sample, write  # noqa: E402
from processes import moto_s3  # noqa: E402

NUM_SAMPLES = 120
PAGE_SIZE = 1024
SAMPLES = [mixed_sample(i) for i in range(NUM_SAMPLES)]


@pytest.fixture(scope="module")
def store():
    """(fsspec file system, storage options) of a bucket ``objects`` on moto's server, one per module."""
    with moto_s3() as options:
        import fsspec

        fs = fsspec.filesystem("s3", skip_instance_cache=True, **options)
        fs.mkdir("objects")
        yield fs, options


@pytest.fixture
def staging(tmp_path, monkeypatch):
    """The directory where writes to URLs build their files (``TMPDIR``), empty at the start."""
    directory = tmp_path / "staging"
    directory.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(directory))
    return directory


def remote(options: dict, **settings) -> RemoteOptions:
    return RemoteOptions(storage_options=options, **{"retries": 2, "backoff": 0.01, **settings})


def writer(path: str, options: dict, **settings) -> beton.DatasetWriter:
    return beton.DatasetWriter(path, MIXED_FIELDS, num_workers=0, progress=False, page_size=PAGE_SIZE,
                               remote=remote(options), **settings)


def local_bytes(tmp_path, samples=SAMPLES) -> bytes:
    return open(write(str(tmp_path / "local.beton"), MIXED_FIELDS, samples, page_size=PAGE_SIZE), "rb").read()


# ---- writing to URLs -------------------------------------------------------------------------------------------

class WatchedDataset(ListDataset):
    """Looks at the URL while samples are read: the object must not be there yet."""

    def __init__(self, samples, fs, key):
        super().__init__(samples)
        self.fs, self.key, self.seen = fs, key, []

    def __getitem__(self, index):
        if index in (0, len(self) - 1):
            self.fs.invalidate_cache()
            self.seen.append(self.fs.exists(self.key))
        return super().__getitem__(index)


def test_writer_uploads_to_a_url_once_complete(store, staging, tmp_path):
    fs, options = store
    dataset = WatchedDataset(SAMPLES, fs, "objects/written.beton")
    report = writer("s3://objects/written.beton", options).from_indexed_dataset(dataset)
    assert dataset.seen == [False, False]  # nothing at the URL while samples were encoded
    assert fs.cat_file("objects/written.beton") == local_bytes(tmp_path)  # the file a local write makes
    assert (report.path, report.num_samples, report.size) == ("s3://objects/written.beton", NUM_SAMPLES,
                                                             len(local_bytes(tmp_path)))
    assert os.listdir(staging) == []  # the local file is gone once uploaded
    with beton.Reader("s3://objects/written.beton", remote=remote(options)) as reader:
        assert len(reader) == NUM_SAMPLES and reader[7][3] == SAMPLES[7][3]


class FailingDataset(ListDataset):
    def __getitem__(self, index):
        if index == NUM_SAMPLES // 2:
            raise RuntimeError("the source broke")
        return super().__getitem__(index)


def test_a_failed_write_leaves_the_url_as_it_was(store, staging, tmp_path):
    fs, options = store
    with pytest.raises(DatasetError):
        writer("s3://objects/never.beton", options).from_indexed_dataset(FailingDataset(SAMPLES))
    fs.invalidate_cache()
    assert not fs.exists("objects/never.beton")
    fs.pipe_file("objects/older.beton", b"an older object")
    with pytest.raises(DatasetError):
        writer("s3://objects/older.beton", options).from_indexed_dataset(FailingDataset(SAMPLES))
    assert fs.cat_file("objects/older.beton") == b"an older object"
    assert os.listdir(staging) == []


def test_a_missing_bucket_fails_before_encoding(store, staging):
    class Untouchable(ListDataset):
        def __getitem__(self, index):
            raise AssertionError("no sample may be read")

    _, options = store
    with pytest.raises(BetonError, match="no such bucket 'no-such-bucket'") as caught:
        writer("s3://no-such-bucket/data.beton", options).from_indexed_dataset(Untouchable(SAMPLES))
    assert str(caught.value).count("s3://no-such-bucket/data.beton") == 1
    assert os.listdir(staging) == []


def test_a_failed_upload_leaves_nothing(store, staging):
    fs, options = store

    class RemovingTheBucket(ListDataset):  # the bucket is there when the writer starts, gone by the upload
        def __getitem__(self, index):
            if index == len(self) - 1:
                fs.rmdir("vanishing")
            return super().__getitem__(index)

    fs.mkdir("vanishing")
    with pytest.raises(WriterError, match="no such bucket") as caught:
        writer("s3://vanishing/data.beton", options).from_indexed_dataset(RemovingTheBucket(SAMPLES))
    assert "s3://vanishing/data.beton" in str(caught.value)
    assert os.listdir(staging) == []


def test_a_url_that_is_not_a_store_fails_before_encoding(staging):
    class Untouchable(ListDataset):
        def __getitem__(self, index):
            raise AssertionError("no sample may be read")

    with pytest.raises(BetonError, match="nosuchscheme") as caught:
        beton.DatasetWriter("nosuchscheme://bucket/data.beton", MIXED_FIELDS, num_workers=0,
                            progress=False).from_indexed_dataset(Untouchable(SAMPLES))
    assert "nosuchscheme://bucket/data.beton" in str(caught.value)
    assert os.listdir(staging) == []


def test_shards_written_indexed_and_merged_in_a_bucket(store, staging, tmp_path):
    fs, options = store
    for k in range(3):
        writer(f"s3://objects/shards/part-{k}.beton", options).from_indexed_dataset(ListDataset(SAMPLES), shard=(k, 3))
    index("s3://objects/shards.json", "s3://objects/shards/part-*.beton", remote=remote(options))
    merge("s3://objects/merged.beton", "s3://objects/shards.json", remote=remote(options))
    assert fs.cat_file("objects/merged.beton") == local_bytes(tmp_path)  # byte for byte one whole write
    manifest = dataset_manifest("s3://objects/shards/part-*.beton", remote=remote(options))
    with manifest.open_shard(2) as reader:  # the options given to dataset_manifest reach the bucket
        assert reader[0][0] == SAMPLES[2 * NUM_SAMPLES // 3][0]
    assert os.listdir(staging) == []


# ---- missing objects --------------------------------------------------------------------------------------------

def test_an_object_deleted_while_read_is_named(store):
    fs, options = store
    fs.pipe_file("objects/deleted.beton", _bytes_of_a_file())
    reader = beton.Reader("s3://objects/deleted.beton", remote=remote(options, prefetch_bytes=PAGE_SIZE))
    with reader:
        fs.rm("objects/deleted.beton")
        with pytest.raises(ShardNotFoundError, match="no such remote file") as caught:
            reader[NUM_SAMPLES - 1]
    assert caught.value.path == "s3://objects/deleted.beton"


def test_a_local_shard_deleted_is_a_beton_error(tmp_path):
    path = write(str(tmp_path / "gone.beton"), MIXED_FIELDS, SAMPLES[:3])
    os.unlink(path)
    with pytest.raises(ShardNotFoundError) as caught:
        beton.Reader(path)
    assert caught.value.path == path


def _bytes_of_a_file() -> bytes:
    with tempfile.TemporaryDirectory() as directory:
        return open(write(os.path.join(directory, "a.beton"), MIXED_FIELDS, SAMPLES, page_size=PAGE_SIZE),
                    "rb").read()


# ---- identity and the page cache ----------------------------------------------------------------------------------

def _put_with_a_new_modification_time(fs, key: str, data: bytes) -> None:
    """Upload ``data`` again until the store reports another modification time (it counts in seconds)."""
    before = fs.info(key)["LastModified"]
    while True:
        fs.pipe_file(key, data)
        fs.invalidate_cache()
        if fs.info(key)["LastModified"] != before:
            return
        time.sleep(0.2)


def _cached_page_bytes(cache_dir) -> int:
    root = os.path.join(cache_dir, f"beton-pages-v1-{os.geteuid()}")
    return sum(os.path.getsize(os.path.join(folder, name)) for folder, _, names in os.walk(root)
               for name in names if name.isdigit())


def test_the_same_bytes_uploaded_again_keep_the_run_and_the_cache(store, tmp_path):
    fs, options = store
    data = _bytes_of_a_file()
    fs.pipe_file("objects/same.beton", data)
    settings = remote(options, cache_dir=str(tmp_path / "cache"))
    loader = beton.Loader("s3://objects/same.beton", batch_size=40, remote=settings, os_cache=False,
                          pipelines={"blob": None, "meta": None})
    first = [batch[0].tolist() for batch in loader]
    _put_with_a_new_modification_time(fs, "objects/same.beton", data)
    assert [batch[0].tolist() for batch in loader] == first  # the next epoch runs on: the object is the same
    loader.close()
    with beton.Reader("s3://objects/same.beton", remote=settings) as reader:
        verify_reader(reader)
        assert reader.remote.pages.pages_fetched == 0  # every page from the cache


def test_stale_cached_versions_are_removed_without_a_limit(store, tmp_path):
    fs, options = store
    settings = remote(options, cache_dir=str(tmp_path / "cache"), cache_limit=None)
    sizes = []
    for version in range(3):  # other bytes each time: the former version's pages can never be read again
        samples = [mixed_sample(i + version) for i in range(NUM_SAMPLES)]
        fs.pipe_file("objects/changing.beton", open(write(str(tmp_path / f"v{version}.beton"), MIXED_FIELDS, samples,
                                                          page_size=PAGE_SIZE), "rb").read())
        with beton.Reader("s3://objects/changing.beton", remote=settings) as reader:
            verify_reader(reader)  # reads every page, caching it
            sizes.append(reader.heap_size)
        assert _cached_page_bytes(tmp_path / "cache") == sizes[-1]  # this version's pages only
        usage = tmp_path / "cache" / f"beton-pages-v1-{os.geteuid()}" / "usage"
        assert int(usage.read_text()) == sizes[-1]


# ---- one retry budget ---------------------------------------------------------------------------------------------

class ClosingEndpoint:
    """A TCP port that accepts connections and closes them at once (a dead S3 endpoint), counting them."""

    def __init__(self) -> None:
        self._socket = socket.create_server(("127.0.0.1", 0))
        self._socket.settimeout(0.05)  # closing a socket does not wake a thread blocked in accept(): it polls
        self.url = f"http://127.0.0.1:{self._socket.getsockname()[1]}"
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                connection, _ = self._socket.accept()
            except TimeoutError:
                continue
            self.connections += 1
            connection.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._socket.close()


def test_a_dead_endpoint_costs_the_retry_budget_only():
    connections = {}
    for retries in (0, 2):
        endpoint = ClosingEndpoint()
        try:
            options = {"key": "k", "secret": "s", "endpoint_url": endpoint.url}
            with pytest.raises(StorageError, match="failed" + (" once" if not retries else " 3 times")):
                beton.Reader("s3://objects/data.beton", remote=remote(options, retries=retries))
        finally:
            endpoint.close()
        connections[retries] = endpoint.connections
    # botocore (5 attempts) and s3fs (5 more around each) no longer retry inside each of beton's attempts
    assert connections[0] <= 2 and connections[2] == 3 * connections[0]


class TokenRefused(http.server.BaseHTTPRequestHandler):
    """An S3 endpoint that knows the object (HEAD) and refuses to give its bytes: 403 InvalidToken, a code s3fs
    maps to no builtin error."""

    gets = 0

    def do_HEAD(self):
        self.send_response(200)
        self.send_header("Content-Length", "100000")
        self.send_header("ETag", '"0123456789abcdef0123456789abcdef"')
        self.end_headers()

    def do_GET(self):
        type(self).gets += 1
        body = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>InvalidToken</Code>'
                b"<Message>The provided token is malformed or otherwise invalid.</Message></Error>")
        self.send_response(403)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *arguments):
        pass


def test_credentials_refused_fail_at_once():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), TokenRefused)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        options = {"key": "k", "secret": "s", "endpoint_url": f"http://127.0.0.1:{server.server_address[1]}"}
        with pytest.raises(StorageError, match="failed: OSError") as caught:
            beton.Reader("s3://objects/data.beton", remote=remote(options, retries=3))
    finally:
        server.shutdown()
        thread.join()
    assert TokenRefused.gets == 1 and "InvalidToken" in repr(caught.value.__cause__.__cause__)


def test_missing_credentials_fail_at_once(store, monkeypatch, tmp_path):
    _, options = store
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # no instance metadata service to ask
    unsigned = {"endpoint_url": options["endpoint_url"]}
    with pytest.raises(StorageError, match="failed: NoCredentialsError"):
        beton.Reader("s3://objects/any.beton", remote=remote(unsigned, retries=3, backoff=1.0))


# ---- a manifest in a bucket with its tables file --------------------------------------------------------------------

def _served(source, options, **settings) -> list[tuple]:
    """Each sample's label, score and array, as a Loader serves them."""
    with beton.Loader(source, batch_size=16, remote=remote(options), pipelines={"blob": None, "meta": None},
                      **settings) as loader:
        return [(label, score, array) for labels, scores, arrays in loader
                for label, score, array in zip(labels.flatten().tolist(), scores.flatten().tolist(), arrays.tolist())]


def test_a_manifest_in_a_bucket_opens_from_its_tables_file(store, staging, monkeypatch):
    from beton.dataset import tables_file

    monkeypatch.setattr(tables_file, "FETCH_BYTES", 1000)  # fetched in many ranges, hashed as they arrive
    fs, options = store
    for k in range(3):
        writer(f"s3://objects/tabled/part-{k}.beton", options).from_indexed_dataset(ListDataset(SAMPLES), shard=(k, 3))
    index("s3://objects/tabled/shards.json", "s3://objects/tabled/part-*.beton", remote=remote(options))
    fs.invalidate_cache()
    listed = json.loads(fs.cat_file("objects/tabled/shards.json"))["tables"]
    assert listed["path"] == "shards.tables"  # beside the manifest, pinned by its SHA-256
    assert hashlib.sha256(fs.cat_file("objects/tabled/shards.tables")).hexdigest() == listed["sha256"]
    assert os.listdir(staging) == []
    expected = _served("s3://objects/tabled/part-*.beton", options)  # every shard's tables read
    assert _served("s3://objects/tabled/shards.json", options) == expected
    assert [label for label, _, _ in expected] == [sample[0] for sample in SAMPLES]
    fs.rm("objects/tabled/part-2.beton")  # opening reads the manifest and its tables file only
    first = 2 * NUM_SAMPLES // 3
    assert _served("s3://objects/tabled/shards.json", options, indices=list(range(first))) == expected[:first]
    with open_dataset("s3://objects/tabled/shards.json", remote=remote(options)) as opened:
        assert [value for (value,) in opened.data_table["label"].tolist()] == [sample[0] for sample in SAMPLES]


def test_a_tampered_tables_object_is_refused(store, staging):
    fs, options = store
    writer("s3://objects/tampered/part-0.beton", options).from_indexed_dataset(ListDataset(SAMPLES[:10]))
    index("s3://objects/tampered/shards.json", ["s3://objects/tampered/part-0.beton"], remote=remote(options))
    data = bytearray(fs.cat_file("objects/tampered/shards.tables"))
    data[len(data) // 2] ^= 1
    fs.pipe_file("objects/tampered/shards.tables", bytes(data))
    with pytest.raises(FormatError, match="SHA-256 differs") as caught:
        open_dataset("s3://objects/tampered/shards.json", remote=remote(options))
    assert caught.value.path == "s3://objects/tampered/shards.tables"
    fs.pipe_file("objects/tampered/shards.tables", bytes(data) + b"\0" * (1 << 20))  # refused before it is fetched
    with pytest.raises(FormatError, match=f"is {len(data) + (1 << 20)} bytes, the manifest lists {len(data)}"):
        open_dataset("s3://objects/tampered/shards.json", remote=remote(options))
    fs.rm("objects/tampered/shards.tables")
    with pytest.raises(FormatError, match="tables file is missing") as caught:
        open_dataset("s3://objects/tampered/shards.json", remote=remote(options))
    assert caught.value.path == "s3://objects/tampered/shards.tables"
