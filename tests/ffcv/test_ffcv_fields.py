"""Fields written to FFCV's field contract are stored, checked and loaded like beton's own, with the class
vouched for as every user field; see tests/ffcv_style_fields.py for the fields, written as FFCV documents."""

from __future__ import annotations

import pathlib
import zlib

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import beton
from beton import Loader, OrderOption
from beton.errors import DecodeError, EncodeError, FieldError, FormatError, PipelineError
from beton.decoders import NDArrayDecoder
from beton.fields import IntField, UnknownField
from beton.ffcv.fields import FFCVField
from beton.pipeline.compiler import Compiler
from beton.ffcv.memory import POINTER_BASE
from beton.storage import format as fmt
from beton.storage.file_builder import header_bytes
from beton.transforms import ToTensor

from conftest import write
from ffcv_style_fields import AudioField, OffsetIntField, PaddedPCMDecoder, VectorField

NUM_SAMPLES = 47
CUSTOM = {"audio": AudioField, "vector": VectorField, "number": OffsetIntField}


def clip(i: int) -> np.ndarray:
    """Sample i's clip: 5 * (i % 9) frames (some empty), values telling the sample apart."""
    return ((np.arange(5 * (i % 9)) * 31 + i * 1000) % 65536 - 32768).astype(np.int16)


def vector(i: int) -> np.ndarray:
    return np.arange(4, dtype=np.float32) + i / 4


def sample(i: int) -> tuple:
    return clip(i), vector(i), 3 * i - 20, i


def write_file(path: pathlib.Path, **options) -> pathlib.Path:
    fields = {"audio": AudioField(22050), "vector": VectorField(4), "number": OffsetIntField(-5), "label": IntField()}
    return write(path, fields, [sample(i) for i in range(NUM_SAMPLES)], page_size=256, chunksize=7, **options)


@pytest.fixture(scope="module")
def ffcv_file(tmp_path_factory):
    return write_file(tmp_path_factory.mktemp("ffcv_fields") / "audio.beton")


def check_batches(batches: list) -> None:
    longest = max(len(clip(i)) for i in range(NUM_SAMPLES))
    seen = []
    for audio, vectors, numbers, labels in batches:
        assert audio.dtype == np.int16 and audio.shape[1:] == (longest,)
        for row, v, number, label in zip(audio, vectors, numbers, labels.tolist()):
            expected = np.zeros(longest, np.int16)
            expected[: len(clip(label))] = clip(label)
            np.testing.assert_array_equal(row, expected)  # padding included: zeros, never another batch's data
            np.testing.assert_array_equal(v, vector(label))
            assert number == 3 * label - 20
            seen.append(label)
    assert sorted(seen) == list(range(NUM_SAMPLES))


@pytest.mark.parametrize(("os_cache", "num_workers"), [(False, 0), (True, 1), (False, 3)])  # each layer, 0/1/many
def test_ffcv_style_fields_round_trip_through_the_loader(ffcv_file, os_cache, num_workers):
    with Loader(ffcv_file, batch_size=8, num_workers=num_workers, os_cache=os_cache, order=OrderOption.RANDOM,
                seed=3, custom_fields=CUSTOM) as loader:
        for _ in range(2):
            check_batches(list(loader))  # kept batches: each must stay valid


def test_their_decoders_are_compiled_and_run_as_python_when_compilation_is_off(ffcv_file):
    with Loader(ffcv_file, batch_size=8, num_workers=1, custom_fields=CUSTOM) as loader:
        steps = [step for stage in loader.plan.stages for step in stage.steps]
        assert [repr(step.operation) for step in steps[:3]] == [
            "PaddedPCMDecoder() (FFCV contract)", "VectorDecoder() (FFCV contract)", "OffsetDecoder() (FFCV contract)"]
        assert all(hasattr(step.operation._function, "signatures") for step in steps[:3])  # numba dispatchers
    Compiler.set_enabled(False)
    try:
        with Loader(ffcv_file, batch_size=8, num_workers=2, custom_fields=CUSTOM) as loader:
            check_batches(list(loader))
    finally:
        Compiler.set_enabled(True)


def test_a_decoder_given_in_pipelines_works_and_is_not_changed(ffcv_file):
    decoder = PaddedPCMDecoder()
    pipelines = {"audio": [decoder, ToTensor()], "vector": None, "number": None, "label": None}
    with Loader(ffcv_file, batch_size=10, num_workers=2, custom_fields=CUSTOM, pipelines=pipelines) as loader:
        for _ in range(2):
            for (audio,) in loader:
                assert audio.dtype == torch_int16()
    assert vars(decoder) == {}  # field, metadata and memory_read went to a copy


def torch_int16():
    import torch

    return torch.int16


def test_the_file_is_the_same_whatever_the_number_of_writer_processes(tmp_path):
    alone = write_file(tmp_path / "alone.beton")
    pooled = write_file(tmp_path / "pooled.beton", num_workers=2)
    assert alone.read_bytes() == pooled.read_bytes()


def test_the_reader_rebuilds_the_field_with_from_binary_when_the_class_is_vouched_for(ffcv_file):
    with beton.Reader(ffcv_file, custom_fields=CUSTOM) as reader:
        audio = reader.fields["audio"]
        assert isinstance(audio, FFCVField) and isinstance(audio.field, AudioField)
        assert audio.field.sample_rate == 22050 and reader.fields["number"].field.offset == -5
        assert reader.fields["vector"].field.length == 4
        record, payload = reader[9][0]  # no to_python of its own: the stored record and payload bytes
        assert record["frames"] == len(clip(9)) and record["ptr"] == POINTER_BASE + 9
        assert np.frombuffer(payload, "<i2").tolist() == clip(9).tolist()
        assert reader.descriptors["audio"].type_name == "ffcv_style_fields.AudioField"
    beton.fields.register(AudioField)
    try:
        with beton.Reader(ffcv_file, custom_fields={"vector": VectorField, "number": OffsetIntField}) as reader:
            assert reader.fields["audio"].field.sample_rate == 22050
    finally:
        beton.fields.unregister("ffcv_style_fields.AudioField")


def test_without_the_class_vouched_for_the_field_is_refused_clearly(ffcv_file):
    with beton.Reader(ffcv_file) as reader:
        assert isinstance(reader.fields["audio"], UnknownField)
        with pytest.raises(FieldError, match=r"not registered.*register\(AudioField\)"):
            reader[0]
    with pytest.raises(PipelineError, match="not registered"):
        Loader(ffcv_file, batch_size=4)
    with Loader(ffcv_file, batch_size=4, num_workers=1,  # the other fields still load
                pipelines={"audio": None, "vector": None, "number": None}) as loader:
        assert sum(len(labels) for (labels,) in loader) == NUM_SAMPLES


def resign_data_table(path: pathlib.Path, edit) -> pathlib.Path:
    """Apply ``edit`` to the data table and recompute its checksum and the header's, as an attacker can."""
    content = bytearray(path.read_bytes())
    header = np.frombuffer(bytes(content[: fmt.HEADER_SIZE]), fmt.HEADER_DTYPE).copy()[0]
    with beton.Reader(path) as reader:
        dtype = reader.data_table.dtype
    start, size = int(header["data_table"]["offset"]), int(header["data_table"]["size"])
    table = np.frombuffer(bytes(content[start : start + size]), dtype).copy()
    edit(table)
    content[start : start + size] = table.tobytes()
    header["data_table"]["crc32"] = zlib.crc32(table.tobytes())
    content[: fmt.HEADER_SIZE] = header_bytes(header)
    forged = path.with_name("forged-" + path.name)
    forged.write_bytes(bytes(content))
    return forged


@pytest.mark.parametrize(("field", "member", "value", "message"), [
    ("audio", "ptr", POINTER_BASE + 6, "metadata member 'ptr' holds the payload pointer of sample 6, not its own"),
    ("audio", "ptr", 4096, "20-byte payload but its metadata holds no pointer to it"),
    ("vector", None, POINTER_BASE + 40, "the metadata record holds the payload pointer of sample 40"),
    ("number", None, POINTER_BASE, "the metadata record holds the payload pointer of sample 0"),
])
def test_a_file_whose_pointer_points_elsewhere_is_refused_on_open(ffcv_file, field, member, value, message):
    def edit(table):
        if member is None:
            table[field][2] = value
        else:
            table[field][member][2] = value

    forged = resign_data_table(ffcv_file, edit)
    with pytest.raises(FormatError, match=message) as caught:
        beton.Reader(forged, custom_fields=CUSTOM)
    assert caught.value.sample == 2 and caught.value.field == field
    with beton.Reader(resign_data_table(ffcv_file, lambda table: None), custom_fields=CUSTOM):
        pass  # re-signing alone changes nothing


def test_a_pointer_of_no_sample_of_the_batch_is_a_decode_error(ffcv_file):
    """What reaches memory_read is checked again: a value outside the batch is never followed."""

    class Neighbour(PaddedPCMDecoder):  # reads the next sample's payload: a decoder bug, not a file lie
        def generate_code(self):
            mem_read = self.memory_read

            def decode(batch_indices, destination, metadata, storage_state):
                for i in range(batch_indices.shape[0]):
                    mem_read(metadata[batch_indices[i]]["ptr"] + 1, storage_state)
                return destination

            return decode

    pipelines = {"audio": [Neighbour()], "vector": None, "number": None, "label": None}
    with Loader(ffcv_file, batch_size=4, num_workers=1, custom_fields=CUSTOM, pipelines=pipelines,
                indices=[0, 2, 4, 6]) as loader:
        with pytest.raises(DecodeError, match="not the payload pointer of a sample of this batch"):
            list(loader)


def test_memcpy_refuses_to_write_past_its_destination(ffcv_file):
    class TooShort(PaddedPCMDecoder):  # rows shorter than the longest clip
        def declare_state_and_memory(self, previous_state):
            state, _ = super().declare_state_and_memory(previous_state)
            from beton.pipeline.allocation_query import AllocationQuery
            from dataclasses import replace
            return replace(state, shape=(3,)), AllocationQuery((3,), np.dtype("<i2"))

    pipelines = {"audio": [TooShort()], "vector": None, "number": None, "label": None}
    with Loader(ffcv_file, batch_size=4, num_workers=1, custom_fields=CUSTOM, pipelines=pipelines) as loader:
        with pytest.raises(DecodeError, match="more bytes than the destination holds"):
            list(loader)


def test_ffcv_decoders_read_only_fields_written_to_ffcv_contract(ffcv_file):
    with pytest.raises(PipelineError, match="must be written to FFCV's field contract; it is IntField"):
        Loader(ffcv_file, batch_size=4, custom_fields=CUSTOM, pipelines={"label": [PaddedPCMDecoder()]})
    with pytest.raises(PipelineError, match="NDArrayDecoder.*decodes NDArrayField"):
        Loader(ffcv_file, batch_size=4, custom_fields=CUSTOM, pipelines={"audio": [NDArrayDecoder()]})


class TwoMallocs(AudioField):
    def encode(self, destination, clip, malloc):
        super().encode(destination, clip, malloc)
        if len(clip) >= 15:  # from sample 3 on
            malloc(2)


class ForgetsPointer(AudioField):
    def encode(self, destination, clip, malloc):
        super().encode(destination, clip, malloc)
        if len(clip) >= 15:
            destination["ptr"] = 0


class StoresAnotherPointer(AudioField):
    def encode(self, destination, clip, malloc):
        super().encode(destination, clip, malloc)
        if len(clip) >= 15:
            destination["ptr"] += 1


class SmallPointer(AudioField):  # a 4-byte member cannot hold malloc's pointer
    @property
    def metadata_type(self):
        return np.dtype([("ptr", "<u4"), ("frames", "<u4")])

    def encode(self, destination, clip, malloc):
        pointer, _ = malloc(2)
        destination["ptr"] = np.uint64(pointer)  # numpy wraps it silently, as a C cast would


@pytest.mark.parametrize(("field", "sample", "message"), [
    (TwoMallocs(), 3, "malloc called a second time for one sample"),
    (ForgetsPointer(), 3, "called malloc but kept the pointer it returned in no 64-bit integer member"),
    (StoresAnotherPointer(), 3, "metadata member 'ptr' holds the payload pointer of sample 4"),
    (SmallPointer(), 0, "kept the pointer it returned in no 64-bit integer member"),
])
def test_a_field_that_breaks_the_one_payload_rules_is_an_encode_error(tmp_path, field, sample, message):
    with pytest.raises(EncodeError, match=message) as caught:
        write(tmp_path / "bad.beton", {"audio": field}, [(clip(i),) for i in range(6)])
    assert caught.value.field == "audio" and caught.value.sample == sample
    assert not list(tmp_path.iterdir())  # nothing left behind


def test_field_definitions_are_checked_when_the_writer_is_made(tmp_path):
    class BigEndian(AudioField):
        @property
        def metadata_type(self):
            return np.dtype([("ptr", ">u8")])

    class LongArguments(AudioField):
        def to_binary(self):
            return np.zeros(1025, np.uint8)

    with pytest.raises(FieldError, match="metadata_type must be a numpy dtype of little-endian numbers"):
        beton.DatasetWriter(tmp_path / "x.beton", {"audio": BigEndian()})
    with pytest.raises(FieldError, match="gave 1025 bytes; FFCV's ARG_TYPE holds 1024"):
        beton.DatasetWriter(tmp_path / "x.beton", {"audio": LongArguments()})


@pytest.mark.parametrize("arguments", [{}, {"binary": 3}, {"binary": "@@@@"}, {"binary": "AAAA", "x": 1},
                                       {"binary": "A" * 1400}])
def test_stored_arguments_that_are_not_ffcv_binary_arguments_are_refused(arguments):
    with pytest.raises(FieldError, match="AudioField"):
        FFCVField.from_binary_of(AudioField, arguments)


@given(st.lists(st.lists(st.integers(-32768, 32767), max_size=40), min_size=1, max_size=30),
       st.sampled_from([256, 1024]))
def test_any_clips_come_back_from_the_reader(tmp_path_factory, clips, page_size):
    path = tmp_path_factory.mktemp("clips") / "clips.beton"
    write(path, {"audio": AudioField(8000)}, [(np.array(c, np.int16),) for c in clips], page_size=page_size)
    with beton.Reader(path, custom_fields={"audio": AudioField}) as reader:
        for i, values in enumerate(clips):
            (record, payload), = reader[i]
            assert record["frames"] == len(values) and np.frombuffer(payload, "<i2").tolist() == values


class SometimesFailing:
    """Samples of audio, vector and number; reading every sample i with i % 7 == 3 raises."""

    def __len__(self) -> int:
        return 40

    def __getitem__(self, i: int) -> tuple:
        if i % 7 == 3:
            raise OSError(f"sample {i} is unreadable")
        return clip(i), vector(i), 3 * i - 20, i


@pytest.mark.parametrize("num_workers", [0, 2])
def test_skipping_bad_samples_renumbers_the_later_pointers(tmp_path, num_workers):
    """Pointers are handles of places in the file: a skipped sample moves the later ones, which are renumbered,
    so the file is the one written from the kept samples alone, byte for byte."""
    fields = {"audio": AudioField(22050), "vector": VectorField(4), "number": OffsetIntField(-5), "label": IntField()}
    skipping = tmp_path / "skipping.beton"
    report = beton.DatasetWriter(skipping, fields, on_error="skip", num_workers=num_workers, page_size=256,
                                 progress=False).from_indexed_dataset(SometimesFailing(), chunksize=4)
    kept = [i for i in range(40) if i % 7 != 3]
    assert [problem.index for problem in report.skipped] == [i for i in range(40) if i % 7 == 3]
    direct = write(tmp_path / "direct.beton", fields, [SometimesFailing()[i] for i in kept], page_size=256,
                   chunksize=4)
    assert skipping.read_bytes() == direct.read_bytes()
    with Loader(skipping, batch_size=8, num_workers=1, custom_fields=CUSTOM) as loader:  # pointers checked on open
        check_kept = [(list(labels), audio, vectors) for audio, vectors, _, labels in loader]
    labels = [int(label) for batch, _, _ in check_kept for label in batch]
    assert labels == kept
    for batch, audio, vectors in check_kept:
        for label, row, v in zip(batch, audio, vectors):
            np.testing.assert_array_equal(row[: len(clip(int(label)))], clip(int(label)))
            np.testing.assert_array_equal(v, vector(int(label)))
