"""``convert parquet``: columns to fields, Hugging Face datasets' features honoured, bad rows named."""

from __future__ import annotations

import datetime
import io
import json

import numpy as np
import pytest
import simplejpeg
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

import beton
import beton.convert
from beton.fields import BytesField, FloatField, IntField, JSONField, NDArrayField, RaggedArrayField, RGBImageField
from beton.tools.convert import ConversionError
from beton.tools.convert.arrow_arrays import BadValue, fixed_arrays, ragged_arrays
from beton.tools.sample_photos import photo_crop
from beton.codecs.jpeg_restarts import with_restart_markers

from cli_runs import run_cli

pa = pytest.importorskip("pyarrow", reason="convert parquet needs pyarrow (the 'parquet' extra)")
import pyarrow.parquet as pq  # noqa: E402

N = 8


def jpeg(i: int) -> bytes:
    return simplejpeg.encode_jpeg(photo_crop(i, 30 + i, 40), quality=90)


def png(i: int) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(photo_crop(i, 24, 20 + i)).save(buffer, "PNG")
    return buffer.getvalue()


def boxes(i: int) -> list[list[float]]:
    return [[i + 0.25, k, -k, 1.5] for k in range(i % 3)]  # 0, 1 or 2 boxes


def table(first: int = 0, count: int = N) -> pa.Table:
    rows = range(first, first + count)
    return pa.table({
        "image": pa.array([jpeg(i) if i % 2 else png(i) for i in rows], pa.binary()),
        "label": pa.array([i % 3 for i in rows], pa.int16()),
        "flag": pa.array([i % 2 == 0 for i in rows]),
        "score": pa.array([i / 4 for i in rows], pa.float32()),
        "caption": pa.array([f"photo {i} ü" for i in rows]),
        "tokens": pa.array([list(range(i % 4)) for i in rows], pa.list_(pa.int32())),
        "boxes": pa.array([boxes(i) for i in rows], pa.list_(pa.list_(pa.float32(), 4))),
        "mask": pa.array([[k % 2 == 0 for k in range(i)] for i in rows], pa.large_list(pa.bool_())),
        "words": pa.array([["w"] * (i % 2) for i in rows], pa.list_(pa.string())),
        "grid": pa.array([[[i] * k for k in range(i % 3)] for i in rows], pa.list_(pa.list_(pa.uint8()))),
        "vector": pa.array([[i, -i, 0.5] for i in rows], pa.list_(pa.float32(), 3)),
        "blob": pa.array([bytes([i]) * i for i in rows], pa.binary()),
        "info": pa.array([{"id": i, "tags": ["a"] * (i % 2)} for i in rows]),
        "when": pa.array([datetime.datetime(2024, 1, 1 + i) for i in rows], pa.timestamp("s")),
    })


def test_columns_become_fields_and_round_trip(tmp_path):
    pq.write_table(table(), tmp_path / "t.parquet", row_group_size=3)
    report = beton.convert.parquet(tmp_path / "t.parquet", tmp_path / "t.beton", num_workers=2, progress=False)
    assert report.num_samples == N and not report.skipped
    with beton.Reader(tmp_path / "t.beton") as reader:
        kinds = {name: type(field) for name, field in reader.fields.items()}
        assert kinds == {"image": RGBImageField, "label": IntField, "flag": IntField, "score": FloatField,
                         "caption": JSONField, "tokens": RaggedArrayField, "boxes": RaggedArrayField,
                         "mask": RaggedArrayField, "words": JSONField, "grid": JSONField, "vector": NDArrayField,
                         "blob": BytesField, "info": JSONField, "when": JSONField}
        assert reader.fields["vector"] == NDArrayField(np.float32, (3,))
        assert reader.fields["tokens"] == RaggedArrayField(np.int32, (None,))
        assert reader.fields["boxes"] == RaggedArrayField(np.float32, (None, 4))
        assert reader.fields["mask"] == RaggedArrayField(np.bool_, (None,))
        assert reader.data_table["tokens"]["length"].tolist() == [i % 4 for i in range(N)]
        for i in range(N):
            image, label, flag, score, caption, tokens, boxes_, mask, words, grid, vector, blob, info, when = reader[i]
            if i % 2:
                assert bytes(reader.payload(i, "image")) == with_restart_markers(jpeg(i))  # not re-encoded
            else:
                assert np.abs(image.astype(int) - photo_crop(i, 24, 20 + i).astype(int)).mean() < 10
            assert (label, flag, score, caption) == (i % 3, i % 2 == 0, i / 4, f"photo {i} ü")
            assert tokens.dtype == np.int32 and tokens.tolist() == list(range(i % 4))  # sample 0: length 0
            assert boxes_.dtype == np.float32 and boxes_.shape == (i % 3, 4) and boxes_.tolist() == boxes(i)
            assert mask.dtype == np.bool_ and mask.tolist() == [k % 2 == 0 for k in range(i)]
            assert words == ["w"] * (i % 2) and grid == [[i] * k for k in range(i % 3)]  # stay JSON
            np.testing.assert_array_equal(vector, np.array([i, -i, 0.5], np.float32))
            assert blob == bytes([i]) * i and info == {"id": i, "tags": ["a"] * (i % 2)}
            assert when == f"2024-01-0{1 + i}T00:00:00"
        assert reader.metadata["source"] == {"format": "parquet", "files": [str(tmp_path / "t.parquet")]}


def test_binary_in_every_arrow_layout_is_bytes_and_text_in_every_layout_can_be(tmp_path):
    # fixed-size binary (UUIDs, hashes), binary views and dictionary-encoded binary were taken for JSON, and
    # every row failed ("bytes is not JSON serializable"); --type x=bytes refused them
    blobs = [bytes([i, 255 - i]) for i in range(N)]
    texts = [f"t{i % 3} ü" for i in range(N)]
    columns = {"fixed": pa.array(blobs, pa.binary(2)), "dictionary": pa.array(blobs).dictionary_encode(),
               "text": pa.array(texts).dictionary_encode()}
    if hasattr(pa, "binary_view"):  # pyarrow 16 and later
        columns["view"] = pa.array(blobs, pa.binary_view())
        columns["text_view"] = pa.array(texts, pa.string_view())
    pq.write_table(pa.table(columns), tmp_path / "t.parquet")
    texts_as_bytes = {name: "bytes" for name in columns if name.startswith("text")}
    beton.convert.parquet(tmp_path / "t.parquet", tmp_path / "t.beton", types=texts_as_bytes, num_workers=0,
                          progress=False)
    with beton.Reader(tmp_path / "t.beton") as reader:
        assert all(type(field) is BytesField for field in reader.fields.values())
        for i in range(N):
            expected = {name: texts[i].encode() if name.startswith("text") else blobs[i] for name in columns}
            assert dict(zip(reader.fields, reader[i])) == expected


def test_files_and_folders_in_order_with_columns_chosen_and_types_overridden(tmp_path):
    (tmp_path / "data" / "nested").mkdir(parents=True)
    pq.write_table(table(0, 3), tmp_path / "data" / "a.parquet")
    pq.write_table(table(3, 4), tmp_path / "data" / "nested" / "b.parquet")
    pq.write_table(table(7, 2), tmp_path / "c.parquet")
    result = run_cli("convert", "parquet", tmp_path / "data", tmp_path / "c.parquet", tmp_path / "o.beton",
                 "--columns", "label,caption,image,tokens,vector", "--type", "caption=bytes", "--type",
                 "label=float", "--type", "tokens=json", "--type", "vector=ragged", "--no-progress",
                 "--write-mode", "raw")
    assert result.returncode == 0, result.stderr
    with beton.Reader(tmp_path / "o.beton") as reader:
        assert reader.field_names == ["label", "caption", "image", "tokens", "vector"]
        assert reader.fields["tokens"] == JSONField()
        assert reader.fields["vector"] == RaggedArrayField(np.float32, (None,))
        assert [reader[i][0] for i in range(9)] == [float(i % 3) for i in range(9)]
        assert [reader[i][3] for i in range(9)] == [list(range(i % 4)) for i in range(9)]
        assert [reader[i][4].tolist() for i in range(9)] == [[i, -i, 0.5] for i in range(9)]
        assert reader[4][1] == "photo 4 ü".encode()
        assert set(reader.data_table["image"]["mode"].tolist()) == {0}


def test_hugging_face_datasets_keep_class_names_images_and_arrays(tmp_path):
    datasets = pytest.importorskip("datasets", reason="the Hugging Face datasets package is not installed")
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=["cat", "dog"]),
                                  "embedding": datasets.Array2D((2, 3), "float32"),
                                  "text": datasets.Value("string"),
                                  "tokens": datasets.Sequence(datasets.Value("int16")),
                                  "tags": datasets.Sequence(datasets.ClassLabel(names=["red", "green", "blue"])),
                                  "boxes": datasets.Array2D((None, 4), "float32"),
                                  "words": datasets.Sequence(datasets.Value("string"))})
    images = [Image.fromarray(photo_crop(i, 20, 24)) for i in range(4)]
    embeddings = [np.arange(6, dtype=np.float32).reshape(2, 3) * i for i in range(4)]
    box_arrays = [np.arange(4 * i, dtype=np.float32).reshape(i, 4) / 8 for i in range(4)]
    dataset = datasets.Dataset.from_dict({"image": images, "label": [0, 1, 1, 0], "embedding": embeddings,
                                          "text": ["a", "b", None, "d"], "tokens": [[1, -2], [], [300], [4] * 5],
                                          "tags": [[2, 0], [1], [], [0, 0, 2]], "boxes": box_arrays,
                                          "words": [["x"], [], ["y", "z"], []]}, features=features)
    dataset.to_parquet(str(tmp_path / "hf.parquet"))
    report = beton.convert.parquet(tmp_path / "hf.parquet", tmp_path / "hf.beton", write_mode="lossless",
                                   num_workers=0, progress=False)
    assert "classes of 'label': 0=cat, 1=dog" in report.summary()
    with beton.Reader(tmp_path / "hf.beton") as reader:
        assert reader.metadata["classes"] == {"label": ["cat", "dog"], "tags": ["red", "green", "blue"]}
        assert reader.fields["embedding"] == NDArrayField(np.float32, (2, 3))
        assert reader.fields["tokens"] == RaggedArrayField(np.int16, (None,))
        assert reader.fields["tags"] == RaggedArrayField(np.int64, (None,))
        assert reader.fields["boxes"] == RaggedArrayField(np.float32, (None, 4))
        assert reader.fields["words"] == JSONField()
        for i in range(4):
            image, label, embedding, text, tokens, tags, boxes_, words = reader[i]
            np.testing.assert_array_equal(image, np.asarray(dataset[i]["image"].convert("RGB")))
            np.testing.assert_array_equal(embedding, embeddings[i])
            assert label == dataset[i]["label"] and text == dataset[i]["text"]
            assert tokens.tolist() == dataset[i]["tokens"] and tags.tolist() == dataset[i]["tags"]
            assert boxes_.shape == (i, 4) and (boxes_ == box_arrays[i]).all()  # sample 0: no boxes
            assert words == dataset[i]["words"]


def test_nulls_a_field_cannot_hold_fail_or_are_skipped_with_file_and_row(tmp_path):
    broken = jpeg(5)[: len(jpeg(5)) * 4 // 5]
    data = pa.table({"image": pa.array([jpeg(0), None, jpeg(2), broken, jpeg(4)], pa.binary()),
                     "label": pa.array([0, 1, None, 3, 4], pa.int64()),
                     "note": pa.array([None, "x", "y", None, "z"])})
    pq.write_table(data, tmp_path / "n.parquet")
    with pytest.raises(ConversionError, match=r"n.parquet row 1: column 'image': the image is null"):
        beton.convert.parquet(tmp_path / "n.parquet", tmp_path / "n.beton", num_workers=0, progress=False)
    report = beton.convert.parquet(tmp_path / "n.parquet", tmp_path / "n.beton", on_error="skip", num_workers=2,
                                   progress=False)
    assert [(item.source.rsplit("/", 1)[1], item.reason) for item in report.skipped] == [
        ("n.parquet row 1", "column 'image': the image is null"),
        ("n.parquet row 2", "column 'label': the int value is null"),
        ("n.parquet row 3", "field 'image': JPEG is truncated or corrupt: Premature end of JPEG file")]
    with beton.Reader(tmp_path / "n.beton") as reader:
        assert [reader[i][1:] for i in range(len(reader))] == [(0, None), (4, "z")]  # JSON holds nulls


def test_every_row_skipped_fails_and_keeps_the_target(tmp_path):
    pq.write_table(pa.table({"label": pa.array([None, None], pa.int64())}), tmp_path / "nulls.parquet")
    (tmp_path / "o.beton").write_bytes(b"an older file")
    with pytest.raises(ConversionError, match="every row was skipped; the first: .*nulls.parquet row 0"):
        beton.convert.parquet(tmp_path / "nulls.parquet", tmp_path / "o.beton", on_error="skip", progress=False)
    assert (tmp_path / "o.beton").read_bytes() == b"an older file"


def test_a_worker_side_failure_after_skipped_rows_names_the_right_row(tmp_path):
    data = pa.table({"image": pa.array([None, None, jpeg(2), b"junk", jpeg(4)], pa.binary())})
    pq.write_table(data, tmp_path / "a.parquet")
    pq.write_table(pa.table({"image": pa.array([b"junk", jpeg(1)], pa.binary())}), tmp_path / "b.parquet")
    report = beton.convert.parquet([tmp_path / "a.parquet", tmp_path / "b.parquet"], tmp_path / "o.beton",
                                   on_error="skip", num_workers=0, progress=False)
    assert [item.source.rsplit("/", 1)[1] for item in report.skipped] == [
        "a.parquet row 0", "a.parquet row 1", "a.parquet row 3", "b.parquet row 0"]
    pq.write_table(pa.table({"image": pa.array([jpeg(0), jpeg(1), b"junk"], pa.binary())}), tmp_path / "c.parquet")
    with pytest.raises(ConversionError, match=r"c.parquet row 2: field 'image': not an image"):
        beton.convert.parquet([tmp_path / "c.parquet"], tmp_path / "o.beton", num_workers=2, progress=False)


@pytest.mark.parametrize("arguments, message", [
    (["--columns", "nope"], "no column 'nope'"),
    (["--type", "caption=int"], "column 'caption' is string, which cannot be stored as int"),
    (["--type", "label=image"], "images come from binary columns"),
    (["--type", "tokens=ndarray"], "an ndarray column needs fixed-size lists"),
    (["--type", "words=ragged"], "column 'words' is list<element: string>: a ragged column needs lists of numbers"),
    (["--type", "grid=ragged"], "a ragged column needs lists of numbers"),
    (["--type", "label=ragged"], "a ragged column needs lists of numbers"),
    (["--type", "label=number"], "expected NAME=KIND"),
])
def test_bad_choices_are_refused(tmp_path, arguments, message):
    pq.write_table(table(), tmp_path / "t.parquet")
    result = run_cli("convert", "parquet", tmp_path / "t.parquet", tmp_path / "o.beton", *arguments)
    assert result.returncode in (1, 2) and message in result.stderr, result.stderr
    assert not (tmp_path / "o.beton").exists()


def test_files_must_agree_on_their_columns(tmp_path):
    pq.write_table(table(), tmp_path / "a.parquet")
    pq.write_table(table().set_column(1, "label", pa.array(["x"] * N)), tmp_path / "b.parquet")
    with pytest.raises(ConversionError, match="b.parquet: column 'label' is string, in .*a.parquet it is int16"):
        beton.convert.parquet([tmp_path / "a.parquet", tmp_path / "b.parquet"], tmp_path / "o.beton",
                              progress=False)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConversionError, match="holds no .parquet files"):
        beton.convert.parquet(tmp_path / "empty", tmp_path / "o.beton", progress=False)


def test_a_file_that_is_not_parquet_is_named_and_an_arrow_folder_gets_a_hint(tmp_path):
    """pyarrow's own error ('Parquet magic bytes not found in footer') named no file; a folder written by
    datasets' save_to_disk (Arrow files) is what a new user most often hands over."""
    pq.write_table(table(), tmp_path / "a.parquet")
    (tmp_path / "notes.txt").write_text("not parquet")
    with pytest.raises(ConversionError, match=r"notes.txt: not a Parquet file pyarrow can read \(Parquet magic"):
        beton.convert.parquet([tmp_path / "a.parquet", tmp_path / "notes.txt"], tmp_path / "o.beton", progress=False)
    saved = tmp_path / "saved"
    saved.mkdir()
    arrow = saved / "data-00000-of-00001.arrow"
    with pa.OSFile(str(arrow), "wb") as sink, pa.ipc.new_stream(sink, table().schema) as out:
        out.write_table(table())
    for source in (saved, arrow):
        with pytest.raises(ConversionError, match=r"save_to_disk writes Arrow files, not Parquet: convert "):
            beton.convert.parquet(source, tmp_path / "o.beton", progress=False)
    assert not (tmp_path / "o.beton").exists()


def test_nan_in_a_json_column_is_refused_not_turned_into_null(tmp_path):
    pq.write_table(pa.table({"x": pa.array([1.0, float("nan")])}), tmp_path / "f.parquet")
    report = beton.convert.parquet(tmp_path / "f.parquet", tmp_path / "f.beton", types={"x": "json"},
                                   on_error="skip", num_workers=0, progress=False)
    (skipped,) = report.skipped  # Python's own words follow (3.13 adds the value: "...compliant: nan")
    assert skipped.reason.startswith("field 'x': value is not JSON-serialisable: Out of range float values are not "
                                     "JSON compliant")
    json.dumps(report.to_json())


def test_null_lists_and_nulls_inside_lists_are_bad_rows_named_by_file_row_and_item(tmp_path):
    tokens = pa.array([[1, 2], None, [3, None], [], [5]], pa.list_(pa.int64()))
    # row 0's second box is null; row 3's first box has a null coordinate
    box_values = pa.array([[0, 0, 1, 1], None, [1, 2, 3, 4], [5, 6, 7, 8], [1, None, 2, 2], [9, 9, 9, 9]],
                          pa.list_(pa.float64(), 4))
    boxes_ = pa.ListArray.from_arrays(pa.array([0, 2, 3, 4, 6, 6], pa.int32()), box_values)
    pq.write_table(pa.table({"tokens": tokens, "boxes": boxes_}), tmp_path / "n.parquet")
    try:
        pq.read_table(tmp_path / "n.parquet")
    except pa.ArrowException:  # some pyarrow versions (25) cannot read back null fixed-size lists in lists
        with pytest.raises(ConversionError, match=r"n.parquet: pyarrow \S+ cannot read the rows from row 0 on"):
            beton.convert.parquet(tmp_path / "n.parquet", tmp_path / "n.beton", num_workers=0, progress=False)
        return
    with pytest.raises(ConversionError, match=r"n.parquet row 0: column 'boxes': item \[1\] is null"):
        beton.convert.parquet(tmp_path / "n.parquet", tmp_path / "n.beton", num_workers=0, progress=False)
    report = beton.convert.parquet(tmp_path / "n.parquet", tmp_path / "n.beton", on_error="skip", num_workers=0,
                                   progress=False)
    assert [(item.source.rsplit("/", 1)[1], item.reason) for item in report.skipped] == [
        ("n.parquet row 0", "column 'boxes': item [1] is null"),
        ("n.parquet row 1", "column 'tokens': the list is null"),
        ("n.parquet row 2", "column 'tokens': item [1] is null"),
        ("n.parquet row 3", "column 'boxes': item [0][1] is null")]
    with beton.Reader(tmp_path / "n.beton") as reader:
        assert len(reader) == 1
        tokens_, boxes_ = reader[0]
        assert tokens_.tolist() == [5] and boxes_.shape == (0, 4) and boxes_.dtype == np.float64


def test_hugging_face_arrays_whose_inner_lists_are_the_wrong_length_are_bad_rows(tmp_path):
    metadata = {b"huggingface": json.dumps({"info": {"features": {"boxes": {
        "_type": "Array2D", "shape": [None, 2], "dtype": "int32"}}}}).encode()}
    data = pa.table({"boxes": pa.array([[[1, 2]], [[1, 2], [3]], [], [[5, 6], [7, 8]]],
                                       pa.list_(pa.list_(pa.int32())))}).replace_schema_metadata(metadata)
    pq.write_table(data, tmp_path / "a.parquet")
    report = beton.convert.parquet(tmp_path / "a.parquet", tmp_path / "a.beton", on_error="skip", num_workers=0,
                                   progress=False)
    assert [item.reason for item in report.skipped] == [
        "column 'boxes': item [1] has 1 items where the column's arrays have 2"]
    with beton.Reader(tmp_path / "a.beton") as reader:
        assert reader.fields["boxes"] == RaggedArrayField(np.int32, (None, 2))
        assert [reader[i][0].tolist() for i in range(3)] == [[[1, 2]], [], [[5, 6], [7, 8]]]


_LEAVES = [(pa.int8(), np.int8, st.integers(-128, 127)), (pa.uint64(), np.uint64, st.integers(0, 2**64 - 1)),
           (pa.float16(), np.float16, st.sampled_from([0.0, -1.5, 65504.0, float("inf")])),
           (pa.float64(), np.float64, st.floats(allow_nan=False)), (pa.bool_(), np.bool_, st.booleans())]


@st.composite
def list_columns(draw):
    """An Arrow list column of numbers (optionally of fixed-size rows), some lists and items null, sliced."""
    arrow_leaf, dtype, values = draw(st.sampled_from(_LEAVES))
    width = draw(st.sampled_from([None, 1, 3]))
    item = values if width is None else st.lists(values | st.none(), min_size=width, max_size=width)
    rows = draw(st.lists(st.none() | st.lists(item | st.none() if draw(st.booleans()) else item, max_size=6),
                         min_size=1, max_size=20))
    inner = arrow_leaf if width is None else pa.list_(arrow_leaf, width)
    before = draw(st.lists(st.none() | st.lists(item, min_size=1, max_size=2), min_size=1, max_size=3))
    column = pa.array([*before, *rows, [None]], draw(st.sampled_from([pa.list_, pa.large_list]))(inner))
    return column.slice(len(before), len(rows)), rows, dtype, () if width is None else (width,)


@settings(max_examples=60)
@given(list_columns())
def test_list_columns_convert_to_exact_arrays_in_the_fast_and_the_row_by_row_path(case):
    column, rows, dtype, row_shape = case
    found = ragged_arrays(column, np.dtype(dtype), row_shape, pa)
    assert len(found) == len(rows)
    for value, row in zip(found, rows):
        if row is None:
            assert value is None
        elif any(item is None or (row_shape and None in item) for item in row):
            assert isinstance(value, BadValue) and "is null" in value.reason
        else:
            assert value.dtype == dtype and value.shape == (len(row), *row_shape)
            assert value.tolist() == row


def test_fixed_size_list_columns_convert_exactly_when_sliced(tmp_path):
    column = pa.array([[1, 2], [3, 4], None, [5, None], [6, 7]], pa.list_(pa.int16(), 2))
    assert [value.tolist() for value in fixed_arrays(column.slice(0, 2), np.dtype(np.int16), (2,), pa)] == \
        [[1, 2], [3, 4]]
    assert [value.tolist() for value in fixed_arrays(column.slice(4, 1), np.dtype(np.int16), (2,), pa)] == [[6, 7]]
    found = fixed_arrays(column.slice(1, 3), np.dtype(np.int16), (2,), pa)
    assert found[0].tolist() == [3, 4] and found[1] is None and found[2].reason == "item [1] is null"
    assert [value.tolist() for value in ragged_arrays(column.slice(3, 2), np.dtype(np.int16), (), pa)[1:]] == [[6, 7]]
