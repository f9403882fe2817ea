"""Scan-grouped pages (PCR's layout) against the plain progressive layout, through the process cache.

    python benchmarks/scan_groups.py [--images N] [--repeats R] [--bandwidth MB/s]

Writes ~500 px photo crops as progressive JPEGs twice: plain (each image's scans contiguous) and with
``scan_grouped=True`` (within each page, every image's first scan, then every image's second scan, ...). For
each fidelity, one epoch of RandomResizedCrop-160 (batch 64, 2 threads, QUASI_RANDOM with 4-page windows,
1 MiB pages) runs through the process cache, throttled to ``--bandwidth`` (default 50 MB/s, a slow network
file system) and unthrottled (pages come from the OS page cache). Reports bytes read per epoch and images/s,
medians over alternating repeats. Writes benchmarks/results/scan_groups.json and prints a Markdown table.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time

import cv2

from beton import DatasetWriter, Loader, OrderOption
from beton.memory import ProcessCache
from beton.tools.bench.data import make_jpegs
from beton.tools.bench.report import argument_parser, run_header, save_json
from beton.fields import IntField, RGBImageField
from beton.decoders import IntDecoder, RandomResizedCropRGBImageDecoder
from beton.transforms import ToTensor

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "scan_groups.json")
FIDELITIES = (1, 2, 5, None)
PAGE_SIZE = 1 << 20


def one_epoch(path: str, fidelity: int | None, bandwidth: float | None) -> tuple[float, int]:
    with Loader(path, batch_size=64, num_workers=2, order=OrderOption.QUASI_RANDOM, seed=0,
                memory=ProcessCache(read_bandwidth=bandwidth), order_kwargs={"window_pages": 4},
                pipelines={"image": [RandomResizedCropRGBImageDecoder((160, 160)), ToTensor()],
                           "label": [IntDecoder(), ToTensor()]}) as loader:
        loader.set_fidelity(fidelity)
        start = time.perf_counter()
        count = sum(len(labels) for _, labels in loader)
        return count / (time.perf_counter() - start), loader.memory_counters["bytes_read"]


def main() -> None:
    parser = argument_parser(__doc__, images=1000, repeats=3)
    parser.add_argument("--bandwidth", type=float, default=50.0, help="MB/s for the throttled runs")
    arguments = parser.parse_args()
    cv2.setNumThreads(1)
    jpegs = make_jpegs(arguments.images, 500)
    samples = [(jpeg, index) for index, jpeg in enumerate(jpegs)]
    rows: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as directory:
        paths = {}
        for layout, grouped in (("plain", False), ("scan-grouped", True)):
            paths[layout] = os.path.join(directory, f"{layout}.beton")
            DatasetWriter(paths[layout], {"image": RGBImageField(write_mode="progressive", scan_grouped=grouped),
                                          "label": IntField()},
                          num_workers=2, page_size=PAGE_SIZE, progress=False).from_indexed_dataset(samples)
        one_epoch(paths["plain"], None, None)  # compile, warm the page cache
        runs: dict[tuple, list] = {}
        for _ in range(arguments.repeats):
            for fidelity in FIDELITIES:
                for layout, path in paths.items():
                    for bandwidth in (arguments.bandwidth * 1e6, None):
                        runs.setdefault((fidelity, layout, bandwidth), []).append(one_epoch(path, fidelity, bandwidth))
        for (fidelity, layout, bandwidth), measured in runs.items():
            scans = "all scans" if fidelity is None else f"{fidelity} scans"
            row = rows.setdefault(f"{scans}, {layout}", {})
            key = "throttled" if bandwidth else "page_cache"
            row[f"images_per_s_{key}"] = round(statistics.median(rate for rate, _ in measured))
            row[f"mb_read_{key}"] = round(statistics.median(read for _, read in measured) / 1e6, 2)
        file_bytes = {layout: os.path.getsize(path) for layout, path in paths.items()}
    result = {**run_header(), "images": arguments.images, "file_bytes": file_bytes,
              "throttle_mb_per_s": arguments.bandwidth, "rows": rows}
    save_json(RESULTS, result)
    print(f"| fidelity, layout | MB read | images/s at {arguments.bandwidth:g} MB/s | images/s, page cache |")
    print("|---|---|---|---|")
    for name, row in rows.items():
        print(f"| {name} | {row['mb_read_throttled']} | {row['images_per_s_throttled']:,} | "
              f"{row['images_per_s_page_cache']:,} |")


if __name__ == "__main__":
    main()
