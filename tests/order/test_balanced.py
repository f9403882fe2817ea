"""The balanced raw/JPEG mix: the planner, the rewrite, the BALANCED order, the throttled reader."""

from __future__ import annotations

import time

import numpy as np
import pytest
import simplejpeg
from hypothesis import given
from hypothesis import strategies as st

import beton
from beton import Loader, OrderOption
from beton.tools.bench.data import make_jpegs
from beton.errors import PipelineError
from beton.fields import IntField, RGBImageField
from beton.decoders import IntDecoder, RandomResizedCropRGBImageDecoder
from beton.memory import ProcessCache
from beton.order import BalancedOrder, OrderContext
from beton.order.balanced import batch_composition
from beton.transforms import ToTensor
from beton.tools.tune import HostProfile, plan_mix, tune, write_balanced
from beton.codecs.jpeg_restarts import with_restart_markers

from cli_runs import run_cli
from conftest import write

JPEGS = make_jpegs(150, 48)


@pytest.fixture(scope="module")
def jpeg_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("balanced") / "jpeg.beton"
    return write(path, {"image": RGBImageField(write_mode="jpg"), "label": IntField()},
                 [(jpeg, i) for i, jpeg in enumerate(JPEGS)], page_size=16384)


@pytest.fixture(scope="module")
def verbatim_jpeg_file(tmp_path_factory):
    """JPEGs without restart markers, as in FFCV's files."""
    path = tmp_path_factory.mktemp("balanced") / "verbatim.beton"
    return write(path, {"image": RGBImageField(write_mode="jpg", restart_markers=False), "label": IntField()},
                 [(jpeg, i) for i, jpeg in enumerate(JPEGS)], page_size=16384)


@given(raw=st.integers(0, 300), extra=st.integers(0, 300), batch_size=st.integers(1, 70))
def test_batch_composition_adds_up_and_stays_within_one_of_each_share(raw, extra, batch_size):
    total = raw + extra
    plan = batch_composition(raw, total, batch_size)
    assert sum(r for r, _ in plan) == raw and sum(size for _, size in plan) == total
    assert all(size == batch_size for _, size in plan[:-1]) and all(0 <= r <= size for r, size in plan)
    for r, size in plan:
        assert abs(r - raw * size / total) < 1 + 1e-9 if total else True


@given(per_batch=st.integers(0, 16), full=st.integers(1, 6), rest=st.integers(0, 15))
def test_aligned_counts_give_every_full_batch_the_same_count(per_batch, full, rest):
    batch_size = 16
    raw = per_batch * full + round(per_batch * rest / batch_size)
    plan = batch_composition(raw, full * batch_size + rest, batch_size)
    assert [r for r, _ in plan[:full]] == [per_batch] * full


@given(modes=st.lists(st.sampled_from((0, 1)), min_size=1, max_size=200), batch_size=st.integers(1, 40),
       seed=st.integers(0, 2**32), pages_per=st.integers(1, 30))
def test_balanced_order_is_a_permutation_with_the_planned_composition(modes, batch_size, seed, pages_per):
    modes = np.array(modes, np.uint8)
    indices = np.arange(len(modes))
    context = OrderContext(indices // pages_per, batch_size, {"image": modes})
    order = BalancedOrder().permutation(indices, seed, 3, context)
    assert sorted(order.tolist()) == indices.tolist()
    plan = batch_composition(int((modes == 0).sum()), len(modes), batch_size)
    start = 0
    for raw, size in plan:
        assert int((modes[order[start : start + size]] == 0).sum()) == raw
        start += size
    np.testing.assert_array_equal(order, BalancedOrder().permutation(indices, seed, 3, context))


def test_balanced_order_needs_an_image_field_to_balance():
    with pytest.raises(PipelineError, match="no image field"):
        BalancedOrder().permutation(np.arange(4), 0, 0, OrderContext(np.zeros(4, np.int64), 2))
    context = OrderContext(np.zeros(4, np.int64), 2, {"a": np.zeros(4, np.uint8), "b": np.ones(4, np.uint8)})
    with pytest.raises(PipelineError, match="name the image field"):
        BalancedOrder().permutation(np.arange(4), 0, 0, context)
    with pytest.raises(PipelineError, match="not an image field"):
        BalancedOrder(field="c").permutation(np.arange(4), 0, 0, context)


def profile(bandwidth: float) -> HostProfile:
    return HostProfile(cores=2, decode_seconds_per_pixel=4e-9, decode_seconds_per_byte=1e-8,
                       read_bytes_per_second=bandwidth, pipeline_seconds_per_image=2e-5)


def test_plan_follows_the_bandwidth_and_takes_the_best_images_first(jpeg_file):
    with beton.Reader(jpeg_file) as reader:
        fractions = [plan_mix(reader, "image", profile(bandwidth), batch_size=16).raw_fraction
                     for bandwidth in (1e5, 1e8, 3e8, 1e12)]
        plan = plan_mix(reader, "image", profile(2e8), batch_size=16)
        metadata = reader.data_table["image"]
        sizes = reader.allocation_table[:, 0]["size"].astype(float)
    assert fractions[0] == 0 and fractions[-1] == 1 and fractions == sorted(fractions)
    assert 0 < plan.raw_fraction < 1
    pixels = metadata["height"].astype(float) * metadata["width"].astype(float)
    benefit = (4e-9 * pixels + 1e-8 * sizes) / (3 * pixels - sizes)
    chosen = np.zeros(len(sizes), bool)
    chosen[plan.raw_samples] = True
    assert benefit[chosen].min() >= benefit[~chosen].max()
    rates = plan.predicted_images_per_s
    assert rates["balanced"] >= max(rates["all JPEG"], rates["all raw"]) * 0.99


def test_balanced_file_keeps_jpegs_as_they_are_and_stores_the_chosen_images_raw(jpeg_file, tmp_path):
    with beton.Reader(jpeg_file) as reader:
        plan = plan_mix(reader, "image", profile(2e8), batch_size=16)
    assert 0.2 < plan.raw_fraction < 0.5
    output = tmp_path / "balanced.beton"
    write_balanced(jpeg_file, output, "image", plan.raw_samples, num_workers=0, progress=False)
    with beton.Reader(jpeg_file) as source, beton.Reader(output) as balanced:
        modes = balanced.data_table["image"]["mode"]
        assert set(np.flatnonzero(modes == 0).tolist()) == set(plan.raw_samples.tolist())
        for i in range(len(JPEGS)):
            if modes[i] == 0:
                np.testing.assert_array_equal(balanced[i][0], source[i][0])
            else:
                assert bytes(balanced.payload(i, "image")) == with_restart_markers(JPEGS[i])
            assert balanced[i][1] == i
    with Loader(output, batch_size=16, order=OrderOption.BALANCED, seed=5, num_workers=2,
                pipelines={"image": [RandomResizedCropRGBImageDecoder((24, 24)), ToTensor()],
                           "label": [IntDecoder(), ToTensor()]}) as loader:
        for epoch in range(2):
            seen, counts = [], []
            for _, labels in loader:
                seen += labels.ravel().tolist()
                counts.append(int((modes[labels.numpy().ravel()] == 0).sum()))
            assert sorted(seen) == list(range(len(JPEGS)))
            assert counts[:-1] == [plan.raw_per_batch] * (len(counts) - 1)


def test_tune_measures_this_host_and_the_cli_writes_the_file(jpeg_file, tmp_path):
    measured, plan = tune(jpeg_file, batch_size=16, read_bandwidth=5e6)
    assert measured.decode_seconds_per_pixel + measured.decode_seconds_per_byte > 0
    assert measured.read_bytes_per_second == 5e6 and measured.pipeline_seconds_per_image > 0
    output = tmp_path / "cli.beton"
    done = run_cli("tune", jpeg_file, "-o", output, "--batch-size", "16", "--read-bandwidth", "5", "--num-workers", "0")
    assert done.returncode == 0, done.stderr
    assert "images raw" in done.stdout and "OrderOption.BALANCED" in done.stdout
    with beton.Reader(output) as reader:
        assert reader.fields["image"].write_mode == "balanced" and reader.num_samples == len(JPEGS)
    quiet = run_cli("tune", jpeg_file, "-o", output, "--batch-size", "16", "--read-bandwidth", "5", "--num-workers",
                    "0", "--no-progress")
    assert quiet.returncode == 0 and "samples/s" in done.stderr and "samples/s" not in quiet.stderr


def test_read_bandwidth_paces_the_process_cache(jpeg_file):
    rate = 2e6
    with Loader(jpeg_file, batch_size=32, memory=ProcessCache(read_bandwidth=rate), order=OrderOption.QUASI_RANDOM,
                pipelines={"image": [RandomResizedCropRGBImageDecoder((8, 8))], "label": [IntDecoder()]}) as loader:
        start = time.perf_counter()
        for _ in loader:
            pass
        elapsed = time.perf_counter() - start
        read = loader.memory_counters["bytes_read"]
    assert read > 0 and elapsed >= 0.9 * (read - 16384) / rate  # the first page may come before any pause
    with pytest.raises(ValueError, match="read_bandwidth"):
        ProcessCache(read_bandwidth=-rate)


def test_scan_grouped_progressive_sources_are_rewritten_whole_and_lossless_ones_refused(tmp_path):
    samples = [(jpeg, i) for i, jpeg in enumerate(JPEGS[:20])]
    grouped = write(tmp_path / "grouped.beton", {"image": RGBImageField(write_mode="progressive", scan_grouped=True),
                                                 "label": IntField()}, samples, page_size=4096)
    output = tmp_path / "balanced.beton"
    write_balanced(grouped, output, "image", np.array([0, 5]), num_workers=0, progress=False)
    with beton.Reader(grouped) as source, beton.Reader(output) as balanced:
        assert balanced.data_table["image"]["mode"].tolist() == [0 if i in (0, 5) else 1 for i in range(20)]
        for i in range(20):
            np.testing.assert_array_equal(balanced[i][0], source[i][0])
    lossless = write(tmp_path / "lossless.beton", {"image": RGBImageField(write_mode="lossless")},
                     [(np.zeros((8, 8, 3), np.uint8),)])
    with pytest.raises(beton.BetonError, match="lossless"):
        tune(lossless, read_bandwidth=1e8)


def test_every_rank_keeps_the_composition_when_its_part_is_whole_batches():
    from beton.order import shard

    modes = np.array([0, 1, 1, 1] * 32, np.uint8)  # 128 samples, a quarter raw
    context = OrderContext(np.arange(128) // 10, 16, {"image": modes})
    order = BalancedOrder().permutation(np.arange(128), 7, 0, context)
    for rank in range(2):
        mine = shard(order, rank, 2, drop_last=True)
        assert [int((modes[mine[b : b + 16]] == 0).sum()) for b in range(0, len(mine), 16)] == [4] * 4


@pytest.mark.parametrize("source", ["jpeg_file", "verbatim_jpeg_file"])
def test_plans_state_the_file_size_and_keep_a_size_bound(source, request, tmp_path):
    jpeg_file = request.getfixturevalue(source)
    with beton.Reader(jpeg_file) as reader:
        source_size = len(reader.file_map)
        unbounded = plan_mix(reader, "image", profile(1e12), batch_size=16)
        bound = int(source_size * 1.5)
        bounded = plan_mix(reader, "image", profile(1e12), batch_size=16, max_bytes=bound)
        nothing_fits = plan_mix(reader, "image", profile(1e12), batch_size=16, max_bytes=source_size // 2)
    assert unbounded.raw_fraction == 1 and unbounded.size_before == source_size and unbounded.growth > 2
    assert 0 < len(bounded.raw_samples) < len(JPEGS) and bounded.size_after <= bound
    assert bounded.max_bytes == bound and "(at most" in bounded.describe()
    assert len(nothing_fits.raw_samples) == 0
    for name, plan in (("all", unbounded), ("bounded", bounded), ("none", nothing_fits)):
        output = tmp_path / f"{name}.beton"
        write_balanced(jpeg_file, output, "image", plan.raw_samples, num_workers=0, progress=False)
        assert output.stat().st_size == plan.size_after, name  # the size is computed, not estimated
    with beton.Reader(jpeg_file) as reader:  # one more raw image per batch would not have fitted
        larger = plan_mix(reader, "image", profile(1e12), batch_size=16, max_bytes=bounded.size_after * 10)
        more = np.sort(np.concatenate([bounded.raw_samples, np.setdiff1d(larger.raw_samples,
                                                                          bounded.raw_samples)[:9]]))
        from beton.tools.tune import balanced_size

        assert balanced_size(reader, "image", more) > bound


def test_tune_says_when_the_file_grows_and_max_size_bounds_it(jpeg_file, tmp_path):
    grown = run_cli("tune", jpeg_file, "--batch-size", "16", "--read-bandwidth", "1000000")
    assert grown.returncode == 0, grown.stderr
    assert "file size: " in grown.stdout and "note: the balanced file is" in grown.stdout
    output = tmp_path / "bounded.beton"
    bounded = run_cli("tune", jpeg_file, "-o", output, "--batch-size", "16", "--read-bandwidth", "1000000",
                      "--max-size", "2x", "--num-workers", "0")
    assert bounded.returncode == 0, bounded.stderr
    assert "note:" not in bounded.stdout and output.stat().st_size <= 2 * jpeg_file.stat().st_size
    bad = run_cli("tune", jpeg_file, "--max-size", "0.5x")
    assert bad.returncode == 2 and "at least 1x" in bad.stderr


def test_tune_says_plainly_when_there_is_no_image_field(tmp_path):
    path = write(tmp_path / "labels.beton", {"label": IntField()}, [(i,) for i in range(4)])
    done = run_cli("tune", path)
    assert done.returncode == 1
    assert "has no image field to tune" in done.stderr and "'label' (IntField)" in done.stderr
    assert "image fields: []" not in done.stderr


def test_tune_says_plainly_when_every_image_is_raw_already(tmp_path):
    path = write(tmp_path / "raw.beton", {"image": RGBImageField(write_mode="raw"), "label": IntField()},
                 [(simplejpeg.decode_jpeg(jpeg), i) for i, jpeg in enumerate(JPEGS[:4])])
    done = run_cli("tune", path)
    assert done.returncode == 1 and "stored raw already" in done.stderr and "nothing to tune" in done.stderr


def test_the_balanced_file_keeps_the_metadata(tmp_path):
    source = write(tmp_path / "m.beton", {"image": RGBImageField(write_mode="jpg"), "label": IntField()},
                   [(jpeg, i) for i, jpeg in enumerate(JPEGS[:8])], metadata={"classes": {"label": ["a"] * 8}})
    write_balanced(source, tmp_path / "b.beton", "image", np.array([1, 2]), num_workers=0, progress=False)
    with beton.Reader(tmp_path / "b.beton") as reader:
        assert reader.metadata == {"classes": {"label": ["a"] * 8}}
