"""Reader API, user-defined fields and how stored field types are found again."""

from __future__ import annotations

import numpy as np
import pytest

import beton
from beton.errors import FieldError
from beton.fields import IntField, UnknownField
from beton.tools.cli import describe

from conftest import write
from user_fields import AudioField, make_local_field


@pytest.fixture
def registered_audio_field():
    beton.fields.register(AudioField)
    yield AudioField
    beton.fields.unregister(AudioField.stored_type_name())


def test_a_registered_user_field_reads_back_by_type_name(tmp_path, registered_audio_field):
    clips = [np.arange(n, dtype=np.int16) * 3 for n in (0, 5, 1000)]
    path = write(tmp_path / "audio.beton", {"audio": AudioField(22050), "id": IntField()},
                 [(clip, i) for i, clip in enumerate(clips)], page_size=512)
    with beton.Reader(path) as reader:
        assert reader.descriptors["audio"].type_name == "user_fields.AudioField"
        assert reader.descriptors["audio"].arguments == {"sample_rate": 22050}
        assert reader.fields["audio"] == AudioField(22050)
        for i, clip in enumerate(clips):
            audio, index = reader[i]
            np.testing.assert_array_equal(audio, clip)
            assert index == i
        assert reader.data_table["audio"]["num_frames"].tolist() == [0, 5, 1000]
        # beton info prints what the field says of its samples (Field.summary) under the field's line
        described = describe(reader)
        assert "'audio': user_fields.AudioField {\"sample_rate\": 22050}\n" in described
        assert f"\n      audio: {1005 / 22050:.3f} s in all\n" in described


def test_an_unregistered_class_opens_as_unknown_and_says_how_to_register_it(tmp_path):
    Celsius = make_local_field()
    path = write(tmp_path / "t.beton", {"temp": Celsius(), "n": IntField()}, [(21.5, 1), (-4.0, 2)])
    with beton.Reader(path) as reader:  # still opens and describes itself
        assert isinstance(reader.fields["temp"], UnknownField)
        assert reader.descriptors["temp"].type_name.endswith("make_local_field.<locals>.Celsius")
        assert reader.data_table["temp"]["kelvin"][0] == pytest.approx(294.65)  # records stay readable
        with pytest.raises(FieldError, match=r"beton.fields.register\(Celsius\) or pass custom_fields") as caught:
            reader[0]
        assert caught.value.field == "temp" and caught.value.sample == 0
    for key in ("temp", Celsius.stored_type_name()):  # by field name (as FFCV) or by type name
        with beton.Reader(path, custom_fields={key: Celsius}) as reader:
            assert [reader[i] for i in range(2)] == [(21.5, 1), (-4.0, 2)]
    beton.fields.register(Celsius)
    try:
        with beton.Reader(path) as reader:
            assert [reader[i] for i in range(2)] == [(21.5, 1), (-4.0, 2)]
        with pytest.raises(FieldError, match="already registered"):
            beton.fields.register(make_local_field())  # another class under the same name
    finally:
        beton.fields.unregister(Celsius.stored_type_name())


def test_custom_fields_must_be_field_classes_matching_the_stored_dtype(tmp_path):
    path = write(tmp_path / "t.beton", {"x": make_local_field()()}, [(1.0,)])
    with pytest.raises(FieldError, match="not a Field subclass"):
        beton.Reader(path, custom_fields={"x": int})
    with pytest.raises(FieldError, match="does not match the stored field"):
        beton.Reader(path, custom_fields={"x": IntField})


def test_payload_and_page_accessors(mixed_file):
    with beton.Reader(mixed_file) as reader:
        assert reader.payload(5, "label") is None
        assert reader.payload(5, "blob").tobytes() == reader[5][3]
        start, end = reader.page_bounds(reader.num_pages - 1)
        assert end == reader.heap_offset + reader.heap_size and 0 < end - start <= reader.page_size
        assert repr(reader).startswith("Reader(") and len(reader) == 60


def test_arrays_read_back_do_not_depend_on_the_open_file(mixed_file):
    reader = beton.Reader(mixed_file)
    array = reader[9][2]
    reader.close()
    array[0, 0] = 1.0  # a private, writable copy
    assert array.sum() == 9 * 11 + 1


def test_arrays_taken_from_a_reader_stay_readable_after_it_closes(mixed_file):
    # Views outlive the reader; unmapping on close() would make reading them crash the process.
    with beton.Reader(mixed_file) as reader:
        table, allocation, payload = reader.data_table["label"], reader.allocation_table, reader.payload(5, "blob")
        expected = (table.copy(), allocation.copy(), payload.copy())
    for view, copy in zip((table, allocation, payload), expected):
        assert view.tobytes() == copy.tobytes()
