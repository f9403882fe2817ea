"""``convert parquet``: columns to fields, Hugging Face datasets' features honoured, bad rows named."""

from __future__ import annotations

import datetime
import io
import json
import subprocess
import sys

import numpy as np
import pytest
import simplejpeg
from PIL import Image

import beton
import beton.convert
from beton.fields import BytesField, FloatField, IntField, JSONField, NDArrayField, RGBImageField
from beton.tools.convert import ConversionError
from beton.tools.sample_photos import photo_crop

pa = pytest.importorskip("pyarrow", reason="convert parquet needs pyarrow (the 'parquet' extra)")
import pyarrow.parquet as pq  # noqa: E402

N = 8


def run(*arguments):
    return subprocess.run([sys.executable, "-m", "beton.tools.cli", *map(str, arguments)], capture_output=True,
                          text=True, timeout=300)


def jpeg(i: int) -> bytes:
    return simplejpeg.encode_jpeg(photo_crop(i, 30 + i, 40), quality=90)


def png(i: int) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(photo_crop(i, 24, 20 + i)).save(buffer, "PNG")
    return buffer.getvalue()


def table(first: int = 0, count: int = N) -> pa.Table:
    rows = range(first, first + count)
    return pa.table({
        "image": pa.array([jpeg(i) if i % 2 else png(i) for i in rows], pa.binary()),
        "label": pa.array([i % 3 for i in rows], pa.int16()),
        "flag": pa.array([i % 2 == 0 for i in rows]),
        "score": pa.array([i / 4 for i in rows], pa.float32()),
        "caption": pa.array([f"photo {i} ü" for i in rows]),
        "tokens": pa.array([list(range(i % 4)) for i in rows], pa.list_(pa.int32())),
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
                         "caption": JSONField, "tokens": JSONField, "vector": NDArrayField, "blob": BytesField,
                         "info": JSONField, "when": JSONField}
        assert reader.fields["vector"] == NDArrayField(np.float32, (3,))
        for i in range(N):
            image, label, flag, score, caption, tokens, vector, blob, info, when = reader[i]
            if i % 2:
                assert bytes(reader.payload(i, "image")) == jpeg(i)  # stored as it is
            else:
                assert np.abs(image.astype(int) - photo_crop(i, 24, 20 + i).astype(int)).mean() < 10
            assert (label, flag, score, caption, tokens) == (i % 3, i % 2 == 0, i / 4, f"photo {i} ü",
                                                              list(range(i % 4)))
            np.testing.assert_array_equal(vector, np.array([i, -i, 0.5], np.float32))
            assert blob == bytes([i]) * i and info == {"id": i, "tags": ["a"] * (i % 2)}
            assert when == f"2024-01-0{1 + i}T00:00:00"
        assert reader.metadata["source"] == {"format": "parquet", "files": [str(tmp_path / "t.parquet")]}


def test_files_and_folders_in_order_with_columns_chosen_and_types_overridden(tmp_path):
    (tmp_path / "data" / "nested").mkdir(parents=True)
    pq.write_table(table(0, 3), tmp_path / "data" / "a.parquet")
    pq.write_table(table(3, 4), tmp_path / "data" / "nested" / "b.parquet")
    pq.write_table(table(7, 2), tmp_path / "c.parquet")
    result = run("convert", "parquet", tmp_path / "data", tmp_path / "c.parquet", tmp_path / "o.beton",
                 "--columns", "label,caption,image", "--type", "caption=bytes", "--type", "label=float",
                 "--no-progress", "--write-mode", "raw")
    assert result.returncode == 0, result.stderr
    with beton.Reader(tmp_path / "o.beton") as reader:
        assert reader.field_names == ["label", "caption", "image"]
        assert [reader[i][0] for i in range(9)] == [float(i % 3) for i in range(9)]
        assert reader[4][1] == "photo 4 ü".encode()
        assert set(reader.data_table["image"]["mode"].tolist()) == {0}


def test_hugging_face_datasets_keep_class_names_images_and_arrays(tmp_path):
    datasets = pytest.importorskip("datasets", reason="the Hugging Face datasets package is not installed")
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=["cat", "dog"]),
                                  "embedding": datasets.Array2D((2, 3), "float32"),
                                  "text": datasets.Value("string")})
    images = [Image.fromarray(photo_crop(i, 20, 24)) for i in range(4)]
    embeddings = [np.arange(6, dtype=np.float32).reshape(2, 3) * i for i in range(4)]
    dataset = datasets.Dataset.from_dict({"image": images, "label": [0, 1, 1, 0], "embedding": embeddings,
                                          "text": ["a", "b", None, "d"]}, features=features)
    dataset.to_parquet(str(tmp_path / "hf.parquet"))
    report = beton.convert.parquet(tmp_path / "hf.parquet", tmp_path / "hf.beton", write_mode="lossless",
                                   num_workers=0, progress=False)
    assert "classes of 'label': 0=cat, 1=dog" in report.summary()
    with beton.Reader(tmp_path / "hf.beton") as reader:
        assert reader.metadata["classes"] == {"label": ["cat", "dog"]}
        assert reader.fields["embedding"] == NDArrayField(np.float32, (2, 3))
        for i in range(4):
            image, label, embedding, text = reader[i]
            np.testing.assert_array_equal(image, np.asarray(dataset[i]["image"].convert("RGB")))
            np.testing.assert_array_equal(embedding, embeddings[i])
            assert label == dataset[i]["label"] and text == dataset[i]["text"]


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
    (["--type", "label=number"], "expected NAME=KIND"),
])
def test_bad_choices_are_refused(tmp_path, arguments, message):
    pq.write_table(table(), tmp_path / "t.parquet")
    result = run("convert", "parquet", tmp_path / "t.parquet", tmp_path / "o.beton", *arguments)
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


def test_nan_in_a_json_column_is_refused_not_turned_into_null(tmp_path):
    pq.write_table(pa.table({"x": pa.array([1.0, float("nan")])}), tmp_path / "f.parquet")
    report = beton.convert.parquet(tmp_path / "f.parquet", tmp_path / "f.beton", types={"x": "json"},
                                   on_error="skip", num_workers=0, progress=False)
    assert [item.reason for item in report.skipped] == [
        "field 'x': value is not JSON-serialisable: Out of range float values are not JSON compliant"]
    json.dumps(report.to_json())
