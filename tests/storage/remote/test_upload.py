"""Uploading a finished file to a URL (beton.storage.remote.upload): whatever the store's client raises on the way
(reaching the store, uploading, moving the temporary file onto its name) is a BetonError naming the URL, and
nothing of the failed upload stays visible, at the target or beside it."""

from __future__ import annotations

import pytest

fsspec = pytest.importorskip("fsspec", reason="uploads need fsspec (the 'remote' extra)")

from fsspec.implementations.memory import MemoryFileSystem  # noqa: E402

from beton.errors import BetonError  # noqa: E402
from beton.storage.remote import RemoteOptions  # noqa: E402
from beton.storage.remote import upload  # noqa: E402

OPTIONS = RemoteOptions(retries=1, backoff=0.0)
URL = "memory://bucket/data.beton"


def foreign(module: str, name: str) -> type[Exception]:
    """An exception class as a client library defines it (judged by its module, as beton judges them)."""
    return type(name, (Exception,), {"__module__": module})


FAILURES = {
    "OSError": lambda: OSError(5, "Input/output error"),
    "PermissionError": lambda: PermissionError(13, "Permission denied"),
    "botocore": lambda: foreign("botocore.exceptions", "ClientError")("An error occurred (AccessDenied)"),
    "aiohttp": lambda: foreign("aiohttp.client_exceptions", "ClientPayloadError")("Response payload is not completed"),
    "ValueError": lambda: ValueError("something the client did not expect"),
}


class Store(MemoryFileSystem):
    """A memory file system of its own (not fsspec's shared one) whose ``fail`` methods raise."""

    protocol = ("memory",)

    def __init__(self, fail: dict[str, Exception], **kwargs) -> None:
        super().__init__(**kwargs)
        self.store, self.pseudo_dirs = {}, [""]
        self.fail = fail

    def put_file(self, lpath, rpath, **kwargs):
        self._maybe_fail("put_file")
        return super().put_file(lpath, rpath, **kwargs)

    def mv(self, path1, path2, **kwargs):
        self._maybe_fail("mv")
        return super().mv(path1, path2, **kwargs)

    def rm_file(self, path):
        self._maybe_fail("rm_file")
        return super().rm_file(path)

    def _maybe_fail(self, method: str) -> None:
        if method in self.fail:
            raise self.fail[method]

    def names(self) -> list[str]:
        return sorted(self.store)


@pytest.fixture
def local(tmp_path):
    path = tmp_path / "built.beton"
    path.write_bytes(b"finished file")
    return str(path)


def use(monkeypatch, store: Store) -> Store:
    monkeypatch.setattr(upload, "filesystem", lambda url, options: (store, url.split("://", 1)[1]))
    return store


@pytest.mark.parametrize("failure", FAILURES)
@pytest.mark.parametrize("method", ["put_file", "mv"])
def test_a_failed_upload_or_move_is_a_beton_error_and_leaves_nothing(local, monkeypatch, failure, method):
    store = use(monkeypatch, Store({method: FAILURES[failure]()}, skip_instance_cache=True))
    with pytest.raises(BetonError) as caught:
        upload.upload_file(local, URL, OPTIONS, sleep=lambda seconds: None)
    assert caught.value.path == URL
    assert store.names() == []  # neither the target nor a temporary file


def test_a_move_that_copied_then_failed_leaves_no_target(local, monkeypatch):
    """A store whose move is a copy and a delete, failing between the two: the copy at the target goes too."""

    class CopyThenFail(Store):
        def mv(self, path1, path2, **kwargs):
            self.copy(path1, path2)
            raise OSError(5, "Input/output error")

    store = use(monkeypatch, CopyThenFail({}, skip_instance_cache=True))
    with pytest.raises(BetonError):
        upload.upload_file(local, URL, OPTIONS, sleep=lambda seconds: None)
    assert store.names() == []


def test_a_failed_move_keeps_the_former_file(local, monkeypatch):
    store = use(monkeypatch, Store({"mv": OSError(5, "Input/output error")}, skip_instance_cache=True))
    store.pipe_file("/bucket/data.beton", b"former file")
    with pytest.raises(BetonError):
        upload.upload_file(local, URL, OPTIONS, sleep=lambda seconds: None)
    assert store.names() == ["/bucket/data.beton"] and store.cat_file("/bucket/data.beton") == b"former file"


def test_a_temporary_file_that_cannot_be_removed_is_named(local, monkeypatch):
    store = use(monkeypatch, Store({"mv": OSError(5, "Input/output error"), "rm_file": OSError(13, "denied")},
                                   skip_instance_cache=True))
    with pytest.raises(BetonError) as caught:
        upload.upload_file(local, URL, OPTIONS, sleep=lambda seconds: None)
    (left,) = store.names()
    said = "\n".join([str(caught.value), *getattr(caught.value, "__notes__", [])])  # the note: in the traceback
    assert ".tmp-" in left and URL + left[len("/bucket/data.beton"):] in said and "remove it by hand" in said


@pytest.mark.parametrize("failure", FAILURES)
def test_a_store_that_cannot_be_reached_is_a_beton_error(local, monkeypatch, failure):
    def unreachable(url, options):
        raise FAILURES[failure]()

    monkeypatch.setattr(upload, "filesystem", unreachable)
    with pytest.raises(BetonError) as caught:
        upload.upload_file(local, URL, OPTIONS, sleep=lambda seconds: None)
    assert caught.value.path == URL


def test_an_upload_that_succeeds_leaves_only_the_file(local, monkeypatch):
    store = use(monkeypatch, Store({}, skip_instance_cache=True))
    upload.upload_file(local, URL, OPTIONS, sleep=lambda seconds: None)
    assert store.names() == ["/bucket/data.beton"] and store.cat_file(URL) == b"finished file"


def test_a_move_whose_answer_was_lost_is_not_undone(local, monkeypatch):
    """The move happened but its answer was lost (a dropped connection): the retry finds the file at its name and
    the temporary gone, which is success, not "the uploaded temporary file is gone" and a removed file."""

    class MovedThenDropped(Store):
        def mv(self, path1, path2, **kwargs):
            super().mv(path1, path2, **kwargs)
            if not getattr(self, "dropped", False):
                self.dropped = True
                raise ConnectionResetError(104, "Connection reset by peer")

    store = use(monkeypatch, MovedThenDropped({}, skip_instance_cache=True))
    upload.upload_file(local, URL, OPTIONS, sleep=lambda seconds: None)
    assert store.names() == ["/bucket/data.beton"] and store.cat_file(URL) == b"finished file"


class ObjectStore(Store):
    """An object store (objects appear whole) whose buckets are the top-level names."""

    protocol = ("s3",)

    def __init__(self, buckets: dict[str, Exception | None], **kwargs) -> None:
        super().__init__({}, **kwargs)
        self.buckets = buckets

    def info(self, path, **kwargs):
        if path not in self.buckets:
            raise FileNotFoundError(path)
        if self.buckets[path] is not None:
            raise self.buckets[path]
        return {"name": path, "type": "directory", "size": 0}


@pytest.mark.parametrize(("buckets", "refused"), [
    ({"bucket": None}, None),
    ({}, "no such bucket 'bucket'"),
    ({"bucket": PermissionError(13, "Access Denied")}, None),  # may put objects without asking about the bucket
    ({"bucket": foreign("botocore.exceptions", "NoCredentialsError")("Unable to locate credentials")},
     "NoCredentialsError"),
])
def test_the_destination_is_checked_before_anything_is_written(monkeypatch, buckets, refused):
    use(monkeypatch, ObjectStore(buckets, skip_instance_cache=True))
    if refused is None:
        upload.check_destination("s3://bucket/data.beton", OPTIONS, sleep=lambda seconds: None)
        return
    with pytest.raises(BetonError, match=refused) as caught:
        upload.check_destination("s3://bucket/data.beton", OPTIONS, sleep=lambda seconds: None)
    assert caught.value.path == "s3://bucket/data.beton"
