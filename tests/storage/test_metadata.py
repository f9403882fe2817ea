"""File-level metadata: in every file (an empty object when none is given), read back equal, checked on open like
every table."""

from __future__ import annotations

import json
import pathlib
import zlib

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import beton
from beton.errors import CorruptDataError, FieldError, FormatError
from beton.fields import IntField, JSONField
from beton.storage import format as fmt
from beton.storage.file_builder import header_bytes
from beton.tools.cli import describe

from conftest import write
from forgery import resign_digests

FIELDS = {"label": IntField(), "meta": JSONField()}
SAMPLES = [(i, {"i": i}) for i in range(5)]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(), children, max_size=4),
    max_leaves=20)


def written(tmp_path, metadata, name="m.beton"):
    return write(tmp_path / name, FIELDS, SAMPLES, metadata=metadata)


def version_of(path) -> int:
    return int(np.frombuffer(pathlib.Path(path).read_bytes()[: fmt.HEADER_SIZE], fmt.HEADER_DTYPE)[0]["version"])


@given(metadata=st.dictionaries(st.text(min_size=1), json_values, min_size=1, max_size=5))
def test_metadata_round_trips(tmp_path, metadata):
    path = written(tmp_path, metadata)
    with beton.Reader(path) as reader:
        assert reader.metadata == metadata
        assert reader.format == "beton v3" and [reader[i] for i in range(5)] == [tuple(s) for s in SAMPLES]
    assert version_of(path) == fmt.FORMAT_VERSION
    beton.verify(path)


def test_without_metadata_the_table_holds_an_empty_object(tmp_path):
    plain = written(tmp_path, None, "plain.beton").read_bytes()
    assert written(tmp_path, {}, "empty.beton").read_bytes() == plain  # an empty object is no metadata
    assert version_of(tmp_path / "plain.beton") == fmt.FORMAT_VERSION
    ref = np.frombuffer(plain[: fmt.HEADER_SIZE], fmt.HEADER_DTYPE)[0]["metadata"]
    assert plain[int(ref["offset"]) :][: int(ref["size"])] == b"{}"
    assert plain[240:252] == bytes(12)  # the reserved bytes: zero
    with beton.Reader(tmp_path / "plain.beton") as reader:
        assert reader.metadata == {} and reader.format == "beton v3"


def test_the_metadata_table_comes_before_the_digest_table_and_adds_only_its_bytes(tmp_path):
    plain = written(tmp_path, None, "plain.beton").read_bytes()
    metadata = {"name": "digits", "classes": {"label": ["zero", "one"]}}
    with_metadata = written(tmp_path, metadata, "meta.beton").read_bytes()
    header = np.frombuffer(with_metadata[: fmt.HEADER_SIZE], fmt.HEADER_DTYPE)[0]
    ref, digests = header["metadata"], header["digest_table"]
    blob = json.dumps(metadata, separators=(",", ":")).encode()
    end = int(ref["offset"]) + int(ref["size"])
    assert int(ref["offset"]) % 64 == 0 and int(digests["offset"]) == end + (-end % 64)
    assert int(digests["offset"]) + int(digests["size"]) == len(with_metadata)
    assert with_metadata[int(ref["offset"]) : end] == blob and int(ref["crc32"]) == zlib.crc32(blob)
    plain_ref = np.frombuffer(plain[: fmt.HEADER_SIZE], fmt.HEADER_DTYPE)[0]["metadata"]
    assert with_metadata[fmt.HEADER_SIZE : int(ref["offset"])] == plain[fmt.HEADER_SIZE : int(plain_ref["offset"])]


def test_the_callers_metadata_is_read_once_and_never_changed(tmp_path):
    metadata = {"classes": {"label": ["a", "b"]}}
    writer = beton.DatasetWriter(tmp_path / "m.beton", FIELDS, num_workers=0, progress=False, metadata=metadata)
    metadata["classes"]["label"].append("changed later")
    writer.from_indexed_dataset(SAMPLES)
    assert metadata == {"classes": {"label": ["a", "b", "changed later"]}}
    with beton.Reader(tmp_path / "m.beton") as reader:
        assert reader.metadata == {"classes": {"label": ["a", "b"]}}
        reader.metadata["classes"]["label"].clear()  # a copy each time: the reader's own is untouched
        assert reader.metadata == {"classes": {"label": ["a", "b"]}}


@pytest.mark.parametrize("metadata, message", [
    (["a"], "must be a mapping"),
    ({1: "a"}, "keys must be strings"),
    ({"x": float("nan")}, "not strict JSON"),
    ({"x": object()}, "not strict JSON"),
    ({"x": b"bytes"}, "not strict JSON"),
])
def test_the_writer_refuses_metadata_a_reader_would_refuse(tmp_path, metadata, message):
    with pytest.raises(FieldError, match=message):
        beton.DatasetWriter(tmp_path / "m.beton", FIELDS, metadata=metadata)
    assert not (tmp_path / "m.beton").exists()


def test_the_writer_refuses_metadata_too_large_or_too_deep(tmp_path, monkeypatch):
    deep = {}
    for _ in range(250):
        deep = {"d": deep}
    with pytest.raises(FieldError, match="nests 251 levels"):
        beton.DatasetWriter(tmp_path / "m.beton", FIELDS, metadata=deep)
    monkeypatch.setattr(fmt, "MAX_METADATA_BYTES", 100)
    with pytest.raises(FieldError, match="more than the 100"):
        beton.DatasetWriter(tmp_path / "m.beton", FIELDS, metadata={"x": "y" * 100})


def resigned(path, out, metadata_blob=None, change_header=None, after_padding=b""):
    """``path`` (a file with metadata) with its metadata table replaced, every CRC32 and content digest recomputed,
    as an attacker would."""
    content = bytearray(pathlib.Path(path).read_bytes())
    header = np.frombuffer(bytes(content[: fmt.HEADER_SIZE]), fmt.HEADER_DTYPE).copy()[0]
    start = int(header["metadata"]["offset"])
    if metadata_blob is not None:
        content = content[:start] + after_padding + metadata_blob
        header["metadata"]["offset"] = start + len(after_padding)
        header["metadata"]["size"] = len(metadata_blob)
        header["metadata"]["crc32"] = zlib.crc32(metadata_blob)
        resign_digests(content, header)  # a version-3 file's digest table follows the metadata table
    if change_header is not None:
        change_header(header)
    content[: fmt.HEADER_SIZE] = header_bytes(header)
    out.write_bytes(bytes(content))
    return out


@pytest.mark.parametrize("blob, error, message", [
    (b"\xff\xfe{}", FormatError, "not valid JSON"),
    (b"[1, 2]", FormatError, "holds a JSON list, expected an object"),
    (b'"text"', FormatError, "holds a JSON str"),
    (b"{" + b'"a":[' * 300 + b"]" * 300 + b"}", FormatError, "levels deep"),
    (b'{"a": 1', FormatError, "not valid JSON"),
    (b'{"a": ' + b"9" * 5000 + b"}", FormatError, "not valid JSON"),
])
def test_hostile_metadata_tables_are_refused_on_open(tmp_path, blob, error, message):
    source = written(tmp_path, {"name": "x"})
    path = resigned(source, tmp_path / "bad.beton", blob)
    with pytest.raises(error, match=message) as raised:
        beton.Reader(path)
    assert raised.value.path == str(path)


def test_a_metadata_table_beyond_the_cap_is_refused_before_it_is_parsed(tmp_path, monkeypatch):
    source = written(tmp_path, {"name": "x" * 200})
    monkeypatch.setattr(fmt, "MAX_METADATA_BYTES", 100)
    with pytest.raises(FormatError, match="metadata table is 211 bytes, more than the 100 allowed"):
        beton.Reader(source)


def test_changed_metadata_bytes_fail_the_checksum_and_verify(tmp_path):
    source = written(tmp_path, {"name": "digits"})
    content = bytearray(source.read_bytes())
    ref = np.frombuffer(bytes(content[: fmt.HEADER_SIZE]), fmt.HEADER_DTYPE)[0]["metadata"]
    content[int(ref["offset"]) + int(ref["size"]) - 3] ^= 1
    damaged = tmp_path / "damaged.beton"
    damaged.write_bytes(bytes(content))
    with pytest.raises(CorruptDataError, match="checksum of the metadata does not match"):
        beton.verify(damaged)


def test_the_layout_around_the_metadata_table_is_checked(tmp_path):
    source = written(tmp_path, {"name": "digits"})
    blob = b'{"name":"digits"}'
    with pytest.raises(CorruptDataError, match="padding before the metadata"):
        beton.Reader(resigned(source, tmp_path / "a.beton", blob, after_padding=b"\1" * 64))
    trailing = tmp_path / "b.beton"
    trailing.write_bytes(source.read_bytes() + b"\0")
    with pytest.raises(FormatError, match="the header says it ends at"):
        beton.Reader(trailing)

    def overlap(header):
        header["metadata"]["offset"] = int(header["page_checksums"]["offset"])

    with pytest.raises(FormatError, match="metadata at offset .* overlaps the page_checksums"):
        beton.Reader(resigned(source, tmp_path / "c.beton", change_header=overlap))

    def beyond(header):
        header["metadata"]["size"] = 1 << 40

    with pytest.raises(FormatError, match="metadata ends at offset"):
        beton.Reader(resigned(source, tmp_path / "d.beton", change_header=beyond))


@pytest.mark.parametrize("version", [1, 2])
def test_files_of_the_unreleased_versions_1_and_2_are_refused_by_name(tmp_path, version):
    """Versions 1 and 2 had no digest table (version 1 no metadata table either): their content is pinned by nothing
    but CRC32s, which whoever edits a file keeps. They were never released, and are not read."""
    def as_version(header):
        header["version"] = version

    with pytest.raises(FormatError, match=f"format version {version} is not 3, the one this beton reads "
                                          r"\(versions 1 and 2 were never released\)"):
        beton.Reader(resigned(written(tmp_path, {"name": "x"}), tmp_path / "old.beton", change_header=as_version))


@pytest.mark.parametrize("where", ["header", "table reference", "field record"])
def test_reserved_fields_that_are_not_zero_are_refused(tmp_path, where):
    """Every file this version writes has zeros there; anything else was made by something else, checksums and
    digests recomputed as an editor would."""
    content = bytearray(written(tmp_path, {"name": "x"}).read_bytes())
    header = np.frombuffer(bytes(content[: fmt.HEADER_SIZE]), fmt.HEADER_DTYPE).copy()[0]
    if where == "header":
        header["reserved"] = b"\0" * 11 + b"\1"
    elif where == "table reference":
        header["allocation_table"]["reserved"] = 1
    else:
        record = int(header["field_table"]["offset"]) + fmt.FIELD_RECORD_DTYPE.fields["reserved"][1]
        content[record] = 1
        table = content[int(header["field_table"]["offset"]) :][: int(header["field_table"]["size"])]
        header["field_table"]["crc32"] = zlib.crc32(table)
        del content[int(header["digest_table"]["offset"]) :]
        resign_digests(content, header)
    content[: fmt.HEADER_SIZE] = header_bytes(header)
    (tmp_path / "edited.beton").write_bytes(bytes(content))
    with pytest.raises(FormatError, match="reserved"):
        beton.Reader(tmp_path / "edited.beton")


def test_info_prints_the_metadata_escaped_and_shortened(tmp_path):
    metadata = {"name": "\x1b[2J\u202edigits", "classes": {"label": [f"class {i}" for i in range(200)]}}
    with beton.Reader(written(tmp_path, metadata)) as reader:
        text = describe(reader)
    assert "metadata:    2 keys" in text and "\x1b" not in text and "\u202e" not in text
    assert "'name': \"\\u001b[2J\\u202edigits\"" in text
    assert '\'classes\': {"label": ["class 0", "class 1",' in text and "characters)" in text
    with beton.Reader(written(tmp_path, None, "plain.beton")) as reader:
        assert "metadata:    none" in describe(reader)


def test_the_loader_gives_the_files_metadata(tmp_path):
    path = written(tmp_path, {"classes": {"label": ["a", "b"]}})
    with beton.Loader(path, batch_size=2, num_workers=0, pipelines={"meta": None}) as loader:
        assert loader.metadata == {"classes": {"label": ["a", "b"]}}
