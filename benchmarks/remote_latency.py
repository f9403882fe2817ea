"""Does request latency reach the cold epoch? The same 200 MB/s link with 0, 20 and 100 ms added per request.

    python benchmarks/remote_latency.py [--images N] [--repeats R] [--workers W] [--no-disk-cache]

The set-up of benchmarks/remote.py (photo JPEGs ~256 px, 1 MiB pages, RandomResizedCrop-160, 2 threads,
QUASI_RANDOM with 8-page windows, tests/range_server.py in its own process), one server per latency. Each round
reads the local file through the process cache (as a remote file is read), then one cold epoch (fresh disk
cache) from each server; "x local" is the median of the per-round ratios. If the pages are read far enough
ahead, the ratio does not move with latency, and what is left of the gap is the CPU the remote path spends
(reported as this process's CPU milliseconds per image, all threads; the server's own CPU is not in it).
Writes benchmarks/results/remote_latency.json. To tell where the CPU goes: ``--workers 1`` decodes in one thread
(a core is left to the fetching and the server), ``--no-disk-cache`` reads without the disk page cache; those
runs write remote_latency_w<W>[_no_disk_cache].json. A longer epoch (``--images``) shows how much of the gap is the
epoch's start (adds ``_<N>_images`` to the name).
"""

from __future__ import annotations

import os
import statistics
import tempfile

import cv2

from beton import RemoteOptions
from beton.tools.bench.contenders import write_beton_images
from beton.tools.bench.data import make_jpegs
from beton.tools.bench.report import argument_parser, run_header, save_json

from remote import CPU_MS_PER_IMAGE, ServerProcess, epoch_rate, make_loader

RATE = 200e6
LATENCIES = {"0 ms": 0.0, "20 ms": 0.020, "100 ms": 0.100}
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "remote_latency.json")


def main() -> None:
    parser = argument_parser(__doc__, images=4000, repeats=5)
    parser.add_argument("--workers", type=int, default=2, help="decoding threads (default 2)")
    parser.add_argument("--no-disk-cache", action="store_true", help="read remote pages without the disk cache")
    arguments = parser.parse_args()
    workers, disk_cache = arguments.workers, not arguments.no_disk_cache
    suffix = ((f"_w{workers}" if (workers, disk_cache) != (2, True) else "")
              + ("" if disk_cache else "_no_disk_cache")
              + (f"_{arguments.images}_images" if arguments.images != parser.get_default("images") else ""))
    results = RESULTS.replace(".json", f"{suffix}.json")
    cv2.setNumThreads(1)
    result = {**run_header(), "images": arguments.images, "rate_bytes_per_second": RATE, "workers": workers,
              "disk_cache": disk_cache, "rounds": []}
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "photos.beton")
        write_beton_images(make_jpegs(arguments.images, 256), path, page_size=1 << 20)
        with make_loader(path) as loader:  # compile the kernels, warm the OS page cache
            epoch_rate(loader)
        servers = {name: ServerProcess(directory, RATE, latency) for name, latency in LATENCIES.items()}
        try:
            for _ in range(arguments.repeats):
                with make_loader(path, workers, os_cache=False) as loader:
                    row = {"local, process cache": epoch_rate(loader, "local, process cache")}
                for name, server in servers.items():
                    with tempfile.TemporaryDirectory() as cache:
                        remote = RemoteOptions(cache_dir=cache if disk_cache else None)
                        with make_loader(server.url("photos.beton"), workers, remote=remote) as loader:
                            row[f"cold, {name}"] = epoch_rate(loader, f"cold, {name}")
                row["cpu_ms_per_image"] = {k: round(v, 3) for k, v in CPU_MS_PER_IMAGE.items()}
                result["rounds"].append(row)
                print(row, flush=True)
        finally:
            for server in servers.values():
                server.stop()
    rounds = result["rounds"]
    names = [name for name in rounds[0] if name != "cpu_ms_per_image"]
    result["median_ratio_to_local"] = {name: statistics.median(r[name] / r["local, process cache"] for r in rounds)
                                       for name in names}
    result["median_cpu_ms_per_image"] = {name: statistics.median(r["cpu_ms_per_image"][name] for r in rounds)
                                         for name in names}
    save_json(results, result)
    print("| epoch | x local (median [range]) | CPU ms per image |\n|---|---|---|")
    for name in names:
        ratios = [r[name] / r["local, process cache"] for r in rounds]
        print(f"| {name} | {statistics.median(ratios):.2f} [{min(ratios):.2f}-{max(ratios):.2f}] | "
              f"{result['median_cpu_ms_per_image'][name]:.3f} |")


if __name__ == "__main__":
    main()
