"""What a write returns: samples written, samples skipped (on_error="skip") and samples that warned."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import beton
from beton.errors import DatasetError, EncodeError
from beton.fields import IntField, NDArrayField
from beton.storage.writer import SampleWarning, warn_sample

FIELDS = {"label": IntField(), "array": NDArrayField(np.float32, (2,))}


class Flaky:
    """Sample i is (i, array); every 7th raises in the dataset, every 5th has an array of the wrong dtype, every
    4th reports a warning with warn_sample, every 9th issues a plain UserWarning."""

    def __len__(self):
        return 40

    def __getitem__(self, index):
        if index % 7 == 3:
            raise FileNotFoundError(f"no file for {index}")
        if index % 4 == 1:
            warn_sample(f"sample {index} was resized")
        if index % 9 == 2:
            warnings.warn(f"plain warning {index}", UserWarning)
        dtype = np.float64 if index % 5 == 4 else np.float32
        return index, np.full(2, index, dtype)


BAD_DATASET = [i for i in range(40) if i % 7 == 3]
BAD_ENCODING = [i for i in range(40) if i % 5 == 4 and i % 7 != 3]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_skip_leaves_bad_samples_out_and_reports_each(tmp_path, num_workers):
    path = tmp_path / f"w{num_workers}.beton"
    writer = beton.DatasetWriter(path, FIELDS, num_workers=num_workers, progress=False, on_error="skip")
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        report = writer.from_indexed_dataset(Flaky(), chunksize=6)
    kept = [i for i in range(40) if i not in BAD_DATASET + BAD_ENCODING]
    assert report.num_samples == len(kept) and report.seconds > 0 and report.path == str(path)
    assert [p.index for p in report.skipped] == sorted(BAD_DATASET + BAD_ENCODING)
    by_index = {p.index: p for p in report.skipped}
    assert by_index[3].kind == "FileNotFoundError" and by_index[3].message == "no file for 3"
    assert by_index[3].describe() == "FileNotFoundError: no file for 3"
    assert by_index[4].kind == "EncodeError" and by_index[4].field == "array" and "dtype <f4" in by_index[4].message
    assert by_index[4].describe().startswith("field 'array': expected an array of dtype <f4")
    warned = [i for i in range(40) if i % 4 == 1 and i % 7 != 3]  # one that warned and then failed (9) counts too
    assert [p.index for p in report.warnings] == warned and 9 in warned and 9 in BAD_ENCODING
    assert all(p.kind == "SampleWarning" and p.message == f"sample {p.index} was resized" for p in report.warnings)
    if num_workers == 0:  # other warnings are shown as usual (workers show them in their own process)
        assert sorted(str(w.message) for w in shown if w.category is UserWarning) == \
            sorted(f"plain warning {i}" for i in range(40) if i % 9 == 2 and i % 7 != 3)
        assert not [w for w in shown if w.category is SampleWarning]
    with beton.Reader(path) as reader:
        assert [reader[i][0] for i in range(len(reader))] == kept
        np.testing.assert_array_equal(reader[5][1], np.full(2, kept[5], np.float32))


@pytest.mark.filterwarnings("ignore:plain warning")
def test_skipping_does_not_make_the_file_depend_on_num_workers(tmp_path):
    for workers in (0, 2):
        beton.DatasetWriter(tmp_path / f"{workers}.beton", FIELDS, num_workers=workers, progress=False,
                            on_error="skip").from_indexed_dataset(Flaky(), chunksize=6)
    assert (tmp_path / "0.beton").read_bytes() == (tmp_path / "2.beton").read_bytes()


def test_skip_works_for_iterables_with_positions_as_indices(tmp_path):
    def samples():
        for i in range(12):
            yield (i, np.full(2, i, np.float64 if i in (2, 9) else np.float32))

    report = beton.DatasetWriter(tmp_path / "it.beton", FIELDS, num_workers=2, progress=False,
                                 on_error="skip").from_iterable(samples(), chunksize=5)
    assert [p.index for p in report.skipped] == [2, 9] and report.num_samples == 10
    with beton.Reader(tmp_path / "it.beton") as reader:
        assert [reader[i][0] for i in range(10)] == [i for i in range(12) if i not in (2, 9)]


@pytest.mark.filterwarnings("ignore:plain warning")
def test_fail_is_the_default_and_names_the_sample(tmp_path):
    with pytest.raises(DatasetError, match="sample 3: the dataset raised FileNotFoundError"):
        beton.DatasetWriter(tmp_path / "f.beton", FIELDS, num_workers=0, progress=False).from_indexed_dataset(Flaky())
    assert not (tmp_path / "f.beton").exists()
    with pytest.raises(EncodeError, match="sample 4"):
        beton.DatasetWriter(tmp_path / "f.beton", FIELDS, num_workers=0, progress=False).from_indexed_dataset(
            Flaky(), indices=[4])
    with pytest.raises(ValueError, match="on_error must be one of"):
        beton.DatasetWriter(tmp_path / "f.beton", FIELDS, on_error="ignore")


def test_warn_sample_outside_a_write_is_a_warning():
    with pytest.warns(SampleWarning, match="not during a write"):
        warn_sample("not during a write")


def test_writers_in_threads_collect_their_own_warnings(tmp_path):
    import threading

    class Named:
        def __init__(self, name):
            self.name = name

        def __len__(self):
            return 30

        def __getitem__(self, index):
            warn_sample(f"{self.name} {index}")
            return index, np.zeros(2, np.float32)

    reports = {}

    def write(name):
        reports[name] = beton.DatasetWriter(tmp_path / f"{name}.beton", FIELDS, num_workers=0, progress=False
                                            ).from_indexed_dataset(Named(name), chunksize=1)

    threads = [threading.Thread(target=write, args=(name,)) for name in ("a", "b", "c")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for name, report in reports.items():
        assert [(p.index, p.message) for p in report.warnings] == [(i, f"{name} {i}") for i in range(30)]


def test_skipping_every_sample_fails_and_keeps_the_target(tmp_path):
    target = tmp_path / "kept.beton"
    target.write_bytes(b"an older file")
    with pytest.raises(beton.WriterError, match="every one of the 2 samples was skipped") as raised:
        beton.DatasetWriter(target, FIELDS, num_workers=0, progress=False, on_error="skip").from_indexed_dataset(
            [(0, np.zeros(2, np.float64)), (1, "not an array")])
    assert [p.index for p in raised.value.skipped] == [0, 1]
    assert target.read_bytes() == b"an older file"


def test_a_write_that_skips_nothing_reports_nothing(tmp_path):
    report = beton.DatasetWriter(tmp_path / "ok.beton", FIELDS, num_workers=0, progress=False,
                                 on_error="skip").from_indexed_dataset([(i, np.zeros(2, np.float32)) for i in range(3)])
    assert report.num_samples == 3 and report.skipped == () and report.warnings == ()
