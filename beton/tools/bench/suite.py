"""The benchmark suite behind ``beton bench`` and ``benchmarks/compare.py``.

Scenarios, each measured side by side in one run: a warm-up epoch each, then rounds of one epoch per contender
in turn. Rates are medians over the rounds; "beton is x faster" is the median of the ratios taken within each
round (paired: a shared host's speed drifts between rounds, less within one). results.json keeps every round.

a. RandomResizedCrop-160 + flip on ~256 px photo JPEGs      b. the same on ~500 px photos
c. CenterCrop-224 (validation) on ~256 px photos             d. raw 3x32x32 uint8 arrays (CIFAR-like), batch 512
e. time to the first batch in a fresh process, cold and warm kernel cache
f. writer samples/s (JPEG bytes with restart markers added, and byte for byte; arrays encoded to JPEG)
g. OS cache (RANDOM) vs process cache (QUASI_RANDOM) with the file dropped from the page cache before every
   epoch: bytes read from storage (/proc/self/io) and images/s

(a)-(c) also report four limits, beton's crop decoder's own steps alone in 2 threads (same crops, DCT scales
and decoder settings; no loader; see :class:`~beton.tools.bench.contenders.DecodeLimit`): the whole image
decoded (as the field stores it: restart markers make a whole decode 3-4 % slower), what any loader of whole
JPEGs needs; the MCU rows down to each crop's bottom of the JPEGs as given
(without the restart markers beton's field adds: how far decoding alone went before them); only the part of the
JPEG each crop needs, as the field stores it, the ceiling of beton's own approach to decoding; and that part
decoded and resized to the output, the least work of the task, whose share is what beton's loading costs beyond
it. ``beton_share`` is beton's paired ratio to each; ``work_share`` is the last limit's paired ratio to the
others: the most of each limit that any loader doing this work (beton's decode, OpenCV's resize) can reach, beton's
share of it included.
Contenders that are not installed (FFCV, DALI, WebDataset, Pillow, Mosaic Streaming, LitData) are skipped with
the reason printed. Contenders that read files of their own (beton, FFCV, Mosaic Streaming, LitData) write them
from the same JPEGs first; ``conversion_seconds`` keeps how long that took, timed apart from the epochs.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterable

import numpy as np

from beton.order import OrderOption
from beton.storage import DatasetWriter
from beton.tools.bench import contenders as c, peers
from beton.tools.bench.data import JpegDataset, make_jpegs, make_raw_images
from beton.tools.bench.report import run_header
from beton.tools.bench.timing import alternating_runs, epoch_rate, paired_ratio
from beton.fields import IntField, RGBImageField

__all__ = ["run_suite", "measure_contenders", "measured_epoch", "image_scenario", "first_batch_scenario",
           "writer_scenario"]


def measure_contenders(builders: dict[str, Callable[[], Iterable | c.Converted | str]], repeats: int) -> dict:
    """Build each contender (a string skips it, with that reason), then time them side by side
    (:func:`~beton.tools.bench.timing.alternating_runs`): medians, every round, paired ratios to beton, skip
    reasons and conversion seconds."""
    contenders, skipped, conversions = {}, {}, {}
    for name, build in builders.items():
        built = build()
        if isinstance(built, str):
            print(f"  {name}: skipped: {built}")
            skipped[name] = built
        elif isinstance(built, c.Converted):
            contenders[name], conversions[name] = built.loader, round(built.seconds, 2)
        else:
            contenders[name] = built
    runs = alternating_runs(contenders, repeats)
    result = {"images_per_s": {name: round(statistics.median(rates)) for name, rates in runs.items()},
              "rounds": {name: [round(rate) for rate in rates] for name, rates in runs.items()}, "skipped": skipped,
              "conversion_seconds": conversions}
    if "beton" in runs:  # ratios within each round, then their median (see paired_ratio)
        result["beton_over"] = {name: round(paired_ratio(runs["beton"], rates), 2)
                                for name, rates in runs.items() if name != "beton"}
    return result


#: beton_share's key -> the limit's name in the results, and DecodeLimit's rows, resize and restart markers
_LIMITS = {"whole": ("decode limit (whole image)", "whole", False, True),
           "crop rows": ("decode limit (crop rows, no restart markers)", "crop", False, False),
           "crop": ("decode limit (crop only)", "crop", False, True),
           "crop+resize": ("decode (crop only) + resize limit", "crop", True, True)}


def image_scenario(jpegs: list[bytes], directory: str, name: str, task: c.ImageTask, repeats: int) -> dict:
    """Scenarios (a)-(c): every image contender and the three limits on ``jpegs``, files written in
    ``directory`` under ``name``."""
    path = os.path.join(directory, f"{name}.beton")

    def files(kind: str) -> str:  # a contender's own folder for this scenario
        return os.path.join(directory, f"{kind}-{name}-{task.kind}")

    result = measure_contenders({
        "beton": lambda: c.converted(lambda: c.write_beton_images(jpegs, path), lambda: c.beton_images(path, task)),
        **{limit: (lambda rows=rows, resize=resize, markers=markers: c.DecodeLimit(
            jpegs, task, rows, resize=resize, restart_markers=markers)) for limit, rows, resize, markers in _LIMITS.values()},
        "FFCV 1.0.2": lambda: c.ffcv_images(jpegs, directory, task, name),
        "torch DataLoader (simplejpeg + cv2)": lambda: c.torch_images(jpegs, task, "simplejpeg"),
        "torch DataLoader (PIL)": lambda: c.torch_images(jpegs, task, "pil"),
        "DALI (CPU)": lambda: c.dali_images(jpegs, task),
        "WebDataset": lambda: c.webdataset_images(jpegs, task, files("wds")),
        "Mosaic Streaming": lambda: peers.mosaic_images(jpegs, task, files("mds")),
        "LitData": lambda: peers.litdata_images(jpegs, task, files("litdata")),
    }, repeats)
    result["mean_jpeg_bytes"] = round(float(np.mean([len(j) for j in jpegs])))
    result["beton_share"] = {key: result["beton_over"][limit] for key, (limit, *_) in _LIMITS.items()}
    work = result["rounds"][_LIMITS["crop+resize"][0]]
    result["work_share"] = {key: round(paired_ratio(work, result["rounds"][limit]), 2)
                            for key, (limit, *_) in _LIMITS.items() if key != "crop+resize"}
    return result



def _raw_scenario(count: int, directory: str, repeats: int) -> dict:
    images, labels = make_raw_images(count)
    path = c.write_beton_raw(images, labels, os.path.join(directory, "raw.beton"))
    return measure_contenders({
        "beton": lambda: c.beton_raw(path, 512),
        "FFCV 1.0.2": lambda: c.ffcv_raw(images, labels, directory, 512),
        "torch DataLoader (memmap)": lambda: c.torch_raw(images, labels, directory, 512),
    }, repeats)


_FIRST_BATCH = textwrap.dedent("""
    import sys, time
    start = time.perf_counter()
    from beton.tools.bench.contenders import ImageTask, beton_images
    imported = time.perf_counter()
    loader = beton_images(sys.argv[1], ImageTask("rrc", 160, 64))
    next(iter(loader))
    done = time.perf_counter()
    print(done - start, done - imported)
""")


def first_batch_scenario(path: str, directory: str) -> dict:
    """Seconds to the first RandomResizedCrop-160 batch of ``path`` in a fresh process. Cold: empty beton and numba
    caches, made in ``directory`` (every kernel compiles); warm: the second process, same caches."""
    cache = os.path.join(directory, "fresh-kernel-cache")
    environment = {**os.environ, "BETON_CACHE_DIR": cache, "NUMBA_CACHE_DIR": os.path.join(cache, "numba")}
    result = {}
    for label in ("cold", "warm"):
        run = subprocess.run([sys.executable, "-c", _FIRST_BATCH, path], capture_output=True, text=True,
                             check=True, env=environment)
        total, after_import = map(float, run.stdout.split())
        result[label] = {"seconds_total": round(total, 2), "seconds_after_imports": round(after_import, 2)}
    return result


def writer_scenario(jpegs: list[bytes], directory: str) -> dict:
    """Samples/s of the writer (2 processes) storing ``jpegs`` with restart markers added and byte for byte,
    and encoding their pixels to JPEG; ``directory`` holds the file written."""
    result = {}
    for name, dataset, markers in (("JPEG bytes, restart markers added (default)", JpegDataset(jpegs), True),
                                   ("JPEG bytes stored byte for byte", JpegDataset(jpegs), False),
                                   ("arrays encoded to JPEG q90", c.DecodedJpegDataset(jpegs), True)):
        path = os.path.join(directory, "writer.beton")
        start = time.perf_counter()
        field = RGBImageField(write_mode="jpg", restart_markers=markers)
        DatasetWriter(path, {"image": field, "label": IntField()}, num_workers=c.WORKERS,
                      progress=False).from_indexed_dataset(dataset)
        result[name] = round(len(jpegs) / (time.perf_counter() - start))
    return {"samples_per_s": result}


def _read_bytes() -> int:
    with open("/proc/self/io") as file:
        return next(int(line.split()[1]) for line in file if line.startswith("read_bytes"))


def measured_epoch(make_loader: Callable[[], Iterable], path: str, drop_page_cache: bool = True) -> tuple[float, int]:
    """One epoch of a fresh loader, by default after dropping the file from the page cache:
    (images/s, bytes read from storage).

    The loader is built first and closed after: a live memory map would keep its pages from being dropped.
    """
    loader = make_loader()
    if drop_page_cache:
        with open(path, "rb") as file:
            os.posix_fadvise(file.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    before = _read_bytes()
    rate = epoch_rate(loader)
    read = _read_bytes() - before
    loader.close()
    return rate, read


def _cache_scenario(jpegs: list[bytes], directory: str, repeats: int) -> dict:
    path = c.write_beton_images(jpegs, os.path.join(directory, "cache.beton"))
    task = c.ImageTask("rrc", 160, 64)
    makers = {
        "OS cache, RANDOM": lambda: c.beton_images(path, task, os_cache=True),
        "process cache, QUASI_RANDOM": lambda: c.beton_images(path, task, os_cache=False,
                                                              order=OrderOption.QUASI_RANDOM),
    }
    runs: dict[str, list[tuple[float, int]]] = {name: [] for name in makers}
    for _ in range(repeats):
        for name, make in makers.items():
            runs[name].append(measured_epoch(make, path))
    return {name: {"images_per_s": round(float(np.median([r for r, _ in values]))),
                   "file_bytes": os.path.getsize(path),
                   "median_bytes_read_per_epoch": int(np.median([b for _, b in values]))}
            for name, values in runs.items()}


def run_suite(quick: bool = False, output_dir: str | None = None) -> dict:
    """Run every scenario; write results.json, results.md and (with matplotlib) results.png."""
    import cv2

    # Forked DataLoader workers deadlock in OpenCV if its thread pool was started in this process (making the
    # test photos resizes with cv2): one OpenCV thread here keeps every contender's workers safe.
    cv2.setNumThreads(1)
    # Rounds (one epoch each) are cheap next to writing the files: 7 of them give medians that one slow moment
    # of a shared host does not move.
    count, raw_count, repeats = (150, 10_000, 2) if quick else (2000, 50_000, 7)
    output_dir = output_dir or os.path.join(os.getcwd(), "bench-results")
    os.makedirs(output_dir, exist_ok=True)
    result = {**run_header(), "quick": quick, "images": count, "scenarios": {}}
    scenarios = result["scenarios"]
    with tempfile.TemporaryDirectory() as directory:
        small, large = make_jpegs(count, 256), make_jpegs(count, 500)
        steps = [
            ("a. RRC-160, ~256 px JPEGs", lambda: image_scenario(small, directory, "small", c.ImageTask("rrc", 160, 64), repeats)),
            ("b. RRC-160, ~500 px JPEGs", lambda: image_scenario(large, directory, "large", c.ImageTask("rrc", 160, 64), repeats)),
            ("c. CenterCrop-224, ~256 px JPEGs", lambda: image_scenario(small, directory, "small", c.ImageTask("center", 224, 64), repeats)),
            ("d. raw 3x32x32, batch 512", lambda: _raw_scenario(raw_count, directory, repeats)),
            ("e. first batch in a fresh process", lambda: first_batch_scenario(os.path.join(directory, "small.beton"), directory)),
            ("f. writer", lambda: writer_scenario(small, directory)),
            ("g. OS vs process cache, page cache dropped", lambda: _cache_scenario(large, directory, repeats)),
        ]
        for title, step in steps:
            print(f"{title} ...", flush=True)
            scenarios[title] = step()
    _write_outputs(result, output_dir)
    return result


def _write_outputs(result: dict, output_dir: str) -> None:
    with open(os.path.join(output_dir, "results.json"), "w") as file:
        json.dump(result, file, indent=2)
    markdown = markdown_table(result)
    with open(os.path.join(output_dir, "results.md"), "w") as file:
        file.write(markdown)
    print(markdown)
    try:
        _plot(result, os.path.join(output_dir, "results.png"))
    except ImportError:
        print("results.png skipped: matplotlib is not installed (pip install matplotlib)")


def markdown_table(result: dict) -> str:
    lines = [f"Machine: {result['machine']}; date {result['date']}; "
             f"{'quick run' if result['quick'] else 'full run'}, {result['images']} images per image scenario.", "",
             "| scenario | contender | images/s | beton is × faster |", "|---|---|---|---|"]
    for title, values in result["scenarios"].items():
        if "images_per_s" in values and isinstance(values["images_per_s"], dict):
            for name, rate in values["images_per_s"].items():
                ratio = values.get("beton_over", {}).get(name, 1.0)
                lines.append(f"| {title} | {name} | {rate:,} | {ratio:.2f} |")
    shares = [f"- {title}: {share['whole']:.2f} of the whole-image limit, {share['crop rows']:.2f} of the crop-rows "
              f"limit (no restart markers), {share['crop']:.2f} of the crop-only limit, "
              f"{share['crop+resize']:.2f} of the crop-only + resize limit"
              for title, values in result["scenarios"].items() if (share := values.get("beton_share"))]
    if shares:
        lines += ["", "beton's share of the decode limits (paired ratios):", *shares]
    works = [f"- {title}: {share['whole']:.2f} of the whole-image limit, {share['crop rows']:.2f} of the crop-rows "
             f"limit, {share['crop']:.2f} of the crop-only limit"
             for title, values in result["scenarios"].items() if (share := values.get("work_share"))]
    if works:
        lines += ["", "The crop-only + resize limit's share of the others (the most any loader doing the work can "
                  "reach):", *works]
    conversions = [f"- {title}: " + ", ".join(f"{name} {seconds:.2f}" for name, seconds in values.items())
                   for title, scenario in result["scenarios"].items() if (values := scenario.get("conversion_seconds"))]
    if conversions:
        lines += ["", "Conversion (writing each contender's files from the JPEGs, before its epochs), seconds:",
                  *conversions]
    for title, values in result["scenarios"].items():
        if "images_per_s" not in values or not isinstance(values["images_per_s"], dict):
            lines += ["", f"{title}: `{json.dumps(values)}`"]
    return "\n".join(lines) + "\n"


def _plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(t, v["images_per_s"]) for t, v in result["scenarios"].items()
              if isinstance(v.get("images_per_s"), dict)]
    figure, axes = plt.subplots(len(panels), 1, figsize=(8, 2.2 * len(panels)))
    for axis, (title, rates) in zip(np.atleast_1d(axes), panels):
        names = list(rates)
        axis.barh(names, [rates[n] for n in names], color=["tab:orange" if n == "beton" else "tab:gray" for n in names])
        axis.set_title(title, fontsize=9)
        axis.tick_params(labelsize=8)
        axis.set_xlabel("per second", fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
