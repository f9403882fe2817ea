"""beton.errors.locate / error_context: the one way location and notes reach an error."""

from __future__ import annotations

import pickle

import pytest

from beton.errors import DecodeError, FormatError, error_context, locate


def test_locate_fills_unset_location_and_keeps_the_message():
    error = locate(FormatError("bad record"), path="f.beton", sample=3)
    assert (error.path, error.sample, error.field, error.page) == ("f.beton", 3, None, None)
    assert str(error) == "file 'f.beton', sample 3: bad record" and error.args == ("bad record",)
    restored = pickle.loads(pickle.dumps(error))  # errors cross process boundaries (writer workers)
    assert (restored.path, restored.sample, str(restored)) == ("f.beton", 3, str(error))


def test_the_innermost_location_wins_through_nested_contexts():
    with pytest.raises(DecodeError) as caught:
        with error_context(path="outer.beton", sample=1, field="outer"):
            with error_context(field="inner", sample=None):
                raise locate(DecodeError("cannot decode"), sample=7)
    assert (caught.value.path, caught.value.field, caught.value.sample) == ("outer.beton", "inner", 7)


def test_a_foreign_error_gets_the_note_but_no_attributes():
    with pytest.raises(KeyError) as caught:
        with error_context(note="beton: while reading sample 4", sample=4):
            raise KeyError("x")
    assert caught.value.__notes__ == ["beton: while reading sample 4"]
    assert not hasattr(caught.value, "sample")


def test_a_note_on_a_beton_error_shows_in_its_message():
    error = locate(FormatError("bad"), note="beton: in pipeline 'image'", field="image")
    assert "beton: in pipeline 'image'" in "\n".join([str(error), *getattr(error, "__notes__", [])])
    assert error.field == "image"


def test_locate_refuses_names_that_are_not_locations():
    with pytest.raises(TypeError, match="names only path, field, sample, page"):
        locate(FormatError("x"), table="data")
