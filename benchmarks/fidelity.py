"""Progressive-JPEG fidelity: bytes read from storage and images/s per number of scans read.

    python benchmarks/fidelity.py [--images N] [--repeats R]

Writes ~500 px photo crops as progressive JPEGs, then for each fidelity k (and all scans) loads one epoch of
RandomResizedCrop-160 through the OS cache (memory map): with the file dropped from the page cache first
(bytes read from storage per /proc/self/io: what a slow disk or network file system would have to
deliver), with and without kernel readahead (``Loader(memory=OSCache(readahead=False))``), and warm (decode
cost only). Writes benchmarks/results/fidelity.json and prints a Markdown table.
The process cache still reads whole pages, so this measures the OS-cache path only.
"""

from __future__ import annotations

import os
import statistics
import tempfile

import cv2

from beton import DatasetWriter, Loader, OrderOption
from beton.memory import OSCache
from beton.tools.bench.data import make_jpegs
from beton.tools.bench.report import argument_parser, run_header, save_json
from beton.tools.bench.suite import measured_epoch
from beton.fields import IntField, RGBImageField
from beton.decoders import IntDecoder, RandomResizedCropRGBImageDecoder
from beton.transforms import ToTensor

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "fidelity.json")
FIDELITIES = (1, 2, 5, 8, None)


def one_epoch(path: str, fidelity: int | None, cold: bool, readahead: bool = True) -> tuple[float, int]:
    def make_loader() -> Loader:
        loader = Loader(path, batch_size=64, num_workers=2, order=OrderOption.RANDOM, seed=0, memory=OSCache(readahead),
                        pipelines={"image": [RandomResizedCropRGBImageDecoder((160, 160)), ToTensor()],
                                   "label": [IntDecoder(), ToTensor()]})
        loader.set_fidelity(fidelity)
        return loader

    return measured_epoch(make_loader, path, drop_page_cache=cold)


def main() -> None:
    parser = argument_parser(__doc__, images=1000, repeats=3)
    arguments = parser.parse_args()
    cv2.setNumThreads(1)
    jpegs = make_jpegs(arguments.images, 500)
    rows = {}
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "progressive.beton")
        DatasetWriter(path, {"image": RGBImageField(write_mode="progressive"), "label": IntField()},
                      num_workers=2, progress=False).from_indexed_dataset([(j, i) for i, j in enumerate(jpegs)])
        file_bytes = os.path.getsize(path)
        one_epoch(path, None, cold=False)  # compile and warm up
        runs: dict[str, dict[str, list]] = {}
        for _ in range(arguments.repeats):
            for fidelity in FIDELITIES:
                name = "all scans" if fidelity is None else f"{fidelity} scans"
                entry = runs.setdefault(name, {"cold_rate": [], "cold_bytes": [], "warm_rate": [],
                                               "no_readahead_rate": [], "no_readahead_bytes": []})
                rate, read = one_epoch(path, fidelity, cold=True)
                entry["cold_rate"].append(rate)
                entry["cold_bytes"].append(read)
                rate, read = one_epoch(path, fidelity, cold=True, readahead=False)
                entry["no_readahead_rate"].append(rate)
                entry["no_readahead_bytes"].append(read)
                entry["warm_rate"].append(one_epoch(path, fidelity, cold=False)[0])
        for name, entry in runs.items():
            rows[name] = {"bytes_read_per_epoch": int(statistics.median(entry["cold_bytes"])),
                          "images_per_s_cold": round(statistics.median(entry["cold_rate"])),
                          "bytes_read_per_epoch_no_readahead": int(statistics.median(entry["no_readahead_bytes"])),
                          "images_per_s_cold_no_readahead": round(statistics.median(entry["no_readahead_rate"])),
                          "images_per_s_warm": round(statistics.median(entry["warm_rate"]))}
    result = {**run_header(), "images": arguments.images, "file_bytes": file_bytes,
              "fidelities": rows}
    save_json(RESULTS, result)
    full = rows["all scans"]
    print(f"{arguments.images} progressive JPEGs (~500 px), file {file_bytes / 2**20:.1f} MiB\n")
    print("| scans read | read (readahead) | images/s | read (readahead=False) | vs all scans | images/s | "
          "images/s, warm |")
    print("|---|---|---|---|---|---|---|")
    for name, row in rows.items():
        print(f"| {name} | {row['bytes_read_per_epoch'] / 2**20:.1f} MiB | {row['images_per_s_cold']:,} | "
              f"{row['bytes_read_per_epoch_no_readahead'] / 2**20:.1f} MiB | "
              f"{row['bytes_read_per_epoch_no_readahead'] / max(full['bytes_read_per_epoch_no_readahead'], 1):.2f} | "
              f"{row['images_per_s_cold_no_readahead']:,} | {row['images_per_s_warm']:,} |")


if __name__ == "__main__":
    main()
