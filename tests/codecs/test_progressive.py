"""Progressive-JPEG fidelity: scans recorded at write time, prefixes read at load time."""

from __future__ import annotations

import math
import re

import cv2
import numpy as np
import pytest
import simplejpeg
from hypothesis import given, settings
from hypothesis import strategies as st

import beton
from beton import Loader
from beton.fields import IntField, RGBImageField
from beton.decoders import CenterCropRGBImageDecoder, RandomResizedCropRGBImageDecoder
from beton.codecs.jpeg_scans import progressive_prefix
from beton.tools.sample_photos import photo_crop
from beton.transforms import ToTensor

from cli_runs import run_cli
from conftest import write

PHOTOS = [photo_crop(i, 96 + 8 * (i % 3), 128) for i in range(12)]


def psnr(a, b):
    error = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return 99.0 if error == 0 else 10 * math.log10(255**2 / error)


@pytest.fixture(scope="module")
def progressive_files(tmp_path_factory):
    directory = tmp_path_factory.mktemp("progressive")
    colour = write(directory / "colour.beton", {"image": RGBImageField(write_mode="progressive"), "label": IntField()},
                   [(p, i) for i, p in enumerate(PHOTOS)])
    grey = write(directory / "grey.beton", {"image": RGBImageField(write_mode="progressive", channels=1)},
                 [(cv2.cvtColor(p, cv2.COLOR_RGB2GRAY),) for p in PHOTOS[:4]])
    return {"colour": colour, "grey": grey}


def test_scans_are_recorded(progressive_files):
    for name, expected_scans in (("colour", 10), ("grey", 6)):
        with beton.Reader(progressive_files[name]) as reader:
            table = reader.data_table["image"]
            assert (table["mode"] == 2).all() and (table["num_scans"] == expected_scans).all()
            for i in range(len(reader)):
                ends = table["scan_ends"][i][:expected_scans]
                payload = reader.payload(i, "image")
                assert (np.diff(ends.astype(np.int64)) > 0).all()
                assert ends[-1] == payload.size - 2 and payload[-2:].tobytes() == b"\xff\xd9"


def test_every_fidelity_reads_its_prefix_and_quality_grows(progressive_files):
    with beton.Reader(progressive_files["colour"]) as reader:
        for i in range(len(reader)):
            record, payload = reader.data_table["image"][i], reader.payload(i, "image")
            full = simplejpeg.decode_jpeg(payload)
            sizes, qualities = [], []
            for k in range(1, 11):
                prefix = progressive_prefix(payload, record, k, lambda n: np.empty(n, np.uint8))
                expected = int(record["scan_ends"][k - 1]) + 2  # the scans, then an EOI marker
                assert prefix.size == expected and prefix[-2:].tobytes() == b"\xff\xd9"
                sizes.append(prefix.size)
                image = simplejpeg.decode_jpeg(prefix)
                qualities.append(psnr(image, full))
            assert all(b > a for a, b in zip(sizes, sizes[1:]))
            assert qualities[-1] == 99.0  # all scans: bit-identical to the full progressive JPEG
            assert all(b >= a - 0.5 for a, b in zip(qualities, qualities[1:])) and qualities[0] < qualities[4] < 99
            assert psnr(full, PHOTOS[i]) > 30


def test_loader_fidelity_from_the_decoder_and_changed_between_epochs(progressive_files):
    path = progressive_files["colour"]

    def epoch(decoder, fidelity=None):
        with Loader(path, batch_size=12, num_workers=2, pipelines={"image": [decoder, ToTensor()]}) as loader:
            loader.set_fidelity(fidelity)
            images, labels = next(iter(loader))
            return images.numpy().copy()

    full = epoch(CenterCropRGBImageDecoder((64, 64)))
    low = epoch(CenterCropRGBImageDecoder((64, 64), fidelity=1))
    scheduled = epoch(CenterCropRGBImageDecoder((64, 64)), fidelity=1)
    np.testing.assert_array_equal(low, scheduled)
    assert not np.array_equal(full, low)
    assert np.mean([psnr(a, b) for a, b in zip(low, full)]) < np.mean(
        [psnr(a, b) for a, b in zip(epoch(CenterCropRGBImageDecoder((64, 64), fidelity=5)), full)])
    with Loader(path, batch_size=12, num_workers=1,
                pipelines={"image": [RandomResizedCropRGBImageDecoder((32, 32)), ToTensor()]}) as loader:
        shapes = []
        for fidelity in (1, 3, None):  # a schedule: one fidelity per epoch, same loader, no rewrite
            loader.set_fidelity(fidelity)
            shapes += [tuple(images.shape) for images, _ in loader]
        assert shapes == [(12, 32, 32, 3)] * 3
    with pytest.raises(ValueError):
        loader.set_fidelity(0)


def scan_ends_of(jpeg: bytes) -> list[int]:
    """Where each scan's entropy-coded data ends, found by this test's own walk: after each SOS segment, the
    first marker that is not a stuffed byte, a restart marker or fill."""
    ends = []
    for sos in (match.start() for match in re.finditer(rb"\xff\xda", jpeg)):
        data = sos + 2 + int.from_bytes(jpeg[sos + 2 : sos + 4], "big")
        ends.append(re.compile(rb"\xff[^\x00\xd0-\xd7\xff]").search(jpeg, data).start())
    return ends


def test_info_prints_bytes_per_fidelity(progressive_files):
    path = progressive_files["colour"]
    result = run_cli("info", path)
    assert result.returncode == 0, result.stderr
    assert "progressive fidelity" in result.stdout
    printed = {int(k): (mean, speedup)
               for k, mean, speedup in re.findall(r"^ +(\d+): +([\d.]+) B +x([\d.]+)$", result.stdout, re.M)}
    with beton.Reader(path) as reader:
        jpegs = [reader.payload(i, "image").tobytes() for i in range(len(reader))]
    ends = [scan_ends_of(jpeg) for jpeg in jpegs]
    assert {len(e) for e in ends} == {10} and sorted(printed) == list(range(1, 11))
    whole = np.mean([len(jpeg) for jpeg in jpegs])
    for k, (mean, speedup) in printed.items():  # k scans and an end marker; all of a JPEG with no more scans
        expected = np.mean([e[k - 1] + 2 if k < len(e) else len(jpeg) for e, jpeg in zip(ends, jpegs)])
        assert (mean, speedup) == (f"{expected:.1f}", f"{whole / expected:.2f}")


# ---- scan-grouped pages (PCR's layout) ---------------------------------------------------------------------

GROUPED_PHOTOS = [photo_crop(i, 60 + 5 * (i % 7), 80 + 7 * (i % 5)) for i in range(48)]


@pytest.fixture(scope="module")
def grouped_files(tmp_path_factory):
    directory = tmp_path_factory.mktemp("grouped")
    samples = [(p, i) for i, p in enumerate(GROUPED_PHOTOS)]
    return {grouped: write(directory / f"{grouped}.beton",
                           {"image": RGBImageField(write_mode="progressive", scan_grouped=grouped), "label": IntField()},
                           samples, page_size=16384)
            for grouped in (False, True)}


def scan_positions(reader, i):
    """Absolute file offsets of sample i's scans, and their lengths."""
    record = reader.data_table["image"][i]
    offset = int(reader.allocation_table[i, 0]["offset"])
    count = int(record["num_scans"])
    ends = record["scan_ends"][:count].astype(np.int64)
    return offset + record["scan_starts"][:count].astype(np.int64), np.diff(ends, prepend=0)


def test_grouped_pages_store_each_scan_of_a_page_after_the_previous_scan_of_every_image(grouped_files):
    with beton.Reader(grouped_files[True]) as reader, beton.Reader(grouped_files[False]) as plain:
        assert beton.verify(grouped_files[True]).checksummed
        by_page: dict[int, list] = {}
        for i in range(len(reader)):
            # the gathered JPEG is byte for byte the one the plain layout stores
            gathered = progressive_prefix(reader.payload(i, "image"), reader.data_table["image"][i], None,
                                          lambda n: np.empty(n, np.uint8))
            assert gathered.tobytes() == plain.payload(i, "image").tobytes()
            np.testing.assert_array_equal(reader[i][0], plain[i][0])
            starts, lengths = scan_positions(reader, i)
            by_page.setdefault(int(starts[0] - reader.heap_offset) // reader.page_size, []).append((starts, lengths))
        for images in by_page.values():
            for scan in range(1, 10):
                assert min(s[scan] for s, _ in images) >= max(s[scan - 1] + n[scan - 1] for s, n in images)


@pytest.mark.parametrize("os_cache", [True, False])
def test_grouped_pages_give_the_same_batches_as_the_plain_layout(grouped_files, os_cache):
    def batches(path, fidelity):
        with Loader(path, batch_size=8, num_workers=2, order=beton.OrderOption.QUASI_RANDOM, seed=2, copy=True,
                    os_cache=os_cache, pipelines={"image": [RandomResizedCropRGBImageDecoder((24, 24)), ToTensor()]}) as loader:
            loader.set_fidelity(fidelity)
            return [images.numpy() for images, _ in loader]

    for fidelity in (1, 4, None):
        for grouped, plain in zip(batches(grouped_files[True], fidelity), batches(grouped_files[False], fidelity)):
            np.testing.assert_array_equal(grouped, plain)


def test_process_cache_reads_the_page_prefixes_a_fidelity_needs(grouped_files):
    with beton.Reader(grouped_files[True]) as reader:
        def expected_bytes(k):
            need: dict[int, int] = {}
            for i in range(len(reader)):
                starts, lengths = scan_positions(reader, i)
                last = min(k, len(starts)) - 1
                end = int(starts[last] + lengths[last]) - reader.heap_offset
                page = end // reader.page_size if end % reader.page_size else end // reader.page_size - 1
                need[page] = max(need.get(page, 0), end - page * reader.page_size)
            return sum(need.values())

        read = {}
        for k in range(1, 11):
            with Loader(grouped_files[True], batch_size=8, os_cache=False, order=beton.OrderOption.QUASI_RANDOM,
                        pipelines={"image": [CenterCropRGBImageDecoder((16, 16), fidelity=k)], "label": None}) as loader:
                for _ in loader:
                    pass
                read[k] = loader.memory_counters["bytes_read"]
            assert read[k] == expected_bytes(k)
    assert all(read[k] < read[k + 1] for k in range(1, 10))
    assert read[1] < 0.25 * read[10]


def test_os_cache_counts_the_bytes_of_the_scans_read(grouped_files):
    with beton.Reader(grouped_files[True]) as reader:
        table = reader.data_table["image"]
        expected = {k: int(table["scan_ends"][:, k - 1].astype(np.int64).sum()) for k in (1, 3, 10)}
    for k, total in expected.items():
        with Loader(grouped_files[True], batch_size=8, pipelines={"image": [CenterCropRGBImageDecoder((16, 16))],
                                                                 "label": None}) as loader:
            loader.set_fidelity(k)
            for _ in loader:
                pass
            assert loader.memory_counters["bytes_read"] == total


def test_scan_grouping_needs_progressive_jpegs():
    with pytest.raises(beton.BetonError, match="progressive"):
        RGBImageField(write_mode="jpg", scan_grouped=True)


def test_converting_baseline_jpegs_costs_one_small_generation_of_loss(tmp_path):
    # No pip-only lossless transcoder exists, so JPEG bytes are decoded and re-encoded: measure what it costs.
    jpegs = [simplejpeg.encode_jpeg(photo, quality=90, colorsubsampling=("444", "420")[i % 2])
             for i, photo in enumerate(PHOTOS[:6])]
    path = write(tmp_path / "converted.beton", {"image": RGBImageField(write_mode="progressive", jpeg_quality=90)},
                 [(jpeg,) for jpeg in jpegs])
    with beton.Reader(path) as reader:
        for i, jpeg in enumerate(jpegs):
            assert psnr(reader[i][0], simplejpeg.decode_jpeg(jpeg)) > 40


@pytest.mark.parametrize("os_cache", [True, False])
def test_grouped_images_larger_than_a_page_span_pages_and_still_read_back(tmp_path, os_cache):
    photos = [photo_crop(i, 160, 200) for i in range(6)]  # each progressive JPEG is larger than a 4 KiB page
    files = {grouped: write(tmp_path / f"{grouped}.beton",
                            {"image": RGBImageField(write_mode="progressive", scan_grouped=grouped)},
                            [(p,) for p in photos], page_size=4096)
             for grouped in (False, True)}
    with beton.Reader(files[True]) as reader:
        assert (reader.allocation_table[:, 0]["size"] > reader.page_size).all()
        for i, photo in enumerate(photos):
            assert psnr(reader[i][0], photo) > 30

    def batches(path, fidelity):
        with Loader(path, batch_size=4, os_cache=os_cache, copy=True,
                    pipelines={"image": [CenterCropRGBImageDecoder((32, 32), fidelity=fidelity), ToTensor()]}) as loader:
            return [images.numpy() for (images,) in loader]

    for fidelity in (2, None):
        for grouped, plain in zip(batches(files[True], fidelity), batches(files[False], fidelity)):
            np.testing.assert_array_equal(grouped, plain)


def test_grouped_records_keep_other_payload_fields_intact(tmp_path):
    from beton.fields import BytesField
    from beton.decoders import BytesDecoder

    blobs = [bytes([i]) * size for i, size in enumerate((0, 10, 3000, 9000, 1, 500))]
    samples = [(photo_crop(i, 48, 64), blob) for i, blob in enumerate(blobs)]
    path = write(tmp_path / "mixed.beton", {"image": RGBImageField(write_mode="progressive", scan_grouped=True),
                                            "blob": BytesField()}, samples, page_size=4096)
    assert beton.verify(path).checksummed
    with beton.Reader(path) as reader:
        for i, (photo, blob) in enumerate(samples):
            image, stored = reader[i]
            assert stored == blob and psnr(image, photo) > 30
    with Loader(path, batch_size=3, os_cache=False, pipelines={"image": [CenterCropRGBImageDecoder((16, 16), fidelity=1)],
                                                               "blob": [BytesDecoder(exact=True)]}) as loader:
        assert [bytes(b) for _, batch in loader for b in batch] == blobs


def test_info_counts_the_stored_bytes_of_grouped_images(grouped_files):
    from beton.tools.cli import describe

    lines = {}
    for grouped, path in grouped_files.items():
        with beton.Reader(path) as reader:
            lines[grouped] = next(line for line in describe(reader).splitlines() if "payload bytes" in line)
    mean = {grouped: float(line.split("mean ")[1].split(",")[0]) for grouped, line in lines.items()}
    assert mean[True] == pytest.approx(mean[False] - 2)  # the end marker is not stored, scans are counted once


@settings(max_examples=15)
@given(sizes=st.lists(st.tuples(st.integers(8, 96), st.integers(8, 96)), min_size=1, max_size=10),
       page_size=st.sampled_from([256, 1024, 4096, 65536]))
def test_grouped_layout_round_trips_for_any_sizes_and_page_size(tmp_path_factory, sizes, page_size):
    directory = tmp_path_factory.mktemp("grouped_any")
    samples = [(photo_crop(i, h, w), i) for i, (h, w) in enumerate(sizes)]
    paths = [write(directory / f"{grouped}.beton", {"image": RGBImageField(write_mode="progressive",
                                                                           scan_grouped=grouped),
                                                   "label": IntField()}, samples, page_size=page_size)
             for grouped in (False, True)]
    with beton.Reader(paths[0]) as plain, beton.Reader(paths[1]) as grouped:
        for i in range(len(samples)):
            assert grouped[i][1] == i
            np.testing.assert_array_equal(grouped[i][0], plain[i][0])
    assert beton.verify(paths[1]).checksummed
