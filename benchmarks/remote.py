"""Remote reads: RandomResizedCrop-160 from a loopback HTTP server with a throttled link, against the local file.

    python benchmarks/remote.py [--images N] [--repeats R] [--page-size BYTES]

Writes ~256 px photo JPEGs (quality 90) to one .beton file and serves its directory from a loopback HTTP server
(tests/range_server.py) whose link carries at most 50 MB/s, then 200 MB/s with 20 ms added before every answer.
Per link and round, in turn: one epoch of the local file (OS page cache, warm), the remote file's first epoch
(fresh disk cache: every page comes over the link) and its second (pages from the disk cache), and WebDataset
streaming tar shards of the same images from the same server when it is installed. The local file is also read
through the process cache (as a remote file always is), to tell the remote path's cost from the process
cache's. The server runs in a process of its own. RandomResizedCrop-160 +
flip, ToTensor, ToTorchImage, batch 64, 2 threads (WebDataset: 2 worker processes), QUASI_RANDOM with 8-page
windows for beton. Reports images/s (medians over rounds) and, per round, each contender's ratio to the local
epoch of the same round (their median), plus what the link alone allows (images / (file bytes / rate)) and how
busy the machine was (all cores, from /proc/stat) while it ran, and the server process's CPU time in each
first epoch (on this machine the server shares the client's cores). Writes benchmarks/results/remote.json.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

import cv2

from beton import Loader, OrderOption, RemoteOptions
from beton.decoders import IntDecoder, RandomResizedCropRGBImageDecoder
from beton.tools.bench.contenders import ImageTask, webdataset_images, write_beton_images
from beton.tools.bench.data import make_jpegs
from beton.tools.bench.report import argument_parser, run_header, save_json
from beton.transforms import RandomHorizontalFlip, ToTensor, ToTorchImage

SERVER = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "range_server.py")

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "remote.json")
LINKS = {"50 MB/s": (50e6, 0.0), "200 MB/s + 20 ms": (200e6, 0.020)}
WINDOW_PAGES = 8


def make_loader(path: str, num_workers: int = 2, **options) -> Loader:
    return Loader(path, batch_size=64, num_workers=num_workers, order=OrderOption.QUASI_RANDOM, seed=0,
                  order_kwargs={"window_pages": WINDOW_PAGES},
                  pipelines={"image": [RandomResizedCropRGBImageDecoder((160, 160)), RandomHorizontalFlip(), ToTensor(),
                                       ToTorchImage()],
                             "label": [IntDecoder(), ToTensor()]}, **options)


CPU_MS_PER_IMAGE: dict[str, float] = {}  # filled per epoch by epoch_rate, read right after it (one thread)


def epoch_rate(batches, name: str = "") -> float:
    """Images per second of one epoch; also records this process's CPU milliseconds per image (user + system,
    every thread): on a shared machine that moves much less than the rate with other jobs' load."""
    cpu, start = sum(os.times()[:2]), time.perf_counter()
    count = sum(len(labels) for _, labels in batches)
    elapsed = time.perf_counter() - start
    CPU_MS_PER_IMAGE[name] = (sum(os.times()[:2]) - cpu) * 1e3 / count
    return count / elapsed


class ServerProcess:
    """tests/range_server.py in a process of its own (its Python does not share this interpreter's lock)."""

    def __init__(self, directory: str, rate: float, latency: float) -> None:
        self._process = subprocess.Popen([sys.executable, SERVER, directory, "--rate", str(rate), "--latency",
                                          str(latency)], stdout=subprocess.PIPE, text=True)
        self.port = int(self._process.stdout.readline())

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.port}/{name}"

    def stats(self) -> dict:
        """Requests answered, body bytes sent and the server process's CPU seconds so far."""
        with urllib.request.urlopen(self.url(".stats")) as answer:
            return json.load(answer)

    def stop(self) -> None:
        self._process.terminate()
        self._process.wait()


@contextlib.contextmanager
def serving(directory: str, rate: float, latency: float):
    server = ServerProcess(directory, rate, latency)
    try:
        yield server
    finally:
        server.stop()


class CpuMeter:
    """How busy the whole machine was between start() and stop(), from /proc/stat (Linux), and this process."""

    @staticmethod
    def _read() -> tuple[int, int]:
        with open("/proc/stat") as file:
            values = [int(v) for v in file.readline().split()[1:]]
        idle = values[3] + values[4]  # idle + iowait
        return sum(values) - idle, sum(values)

    def start(self) -> None:
        self._busy, self._total = self._read()
        self._own = sum(os.times()[:4])
        self._wall = time.perf_counter()

    def stop(self) -> dict:
        busy, total = self._read()
        cores = os.cpu_count() or 1
        wall = time.perf_counter() - self._wall
        machine = (busy - self._busy) / max(1, total - self._total)
        own = (sum(os.times()[:4]) - self._own) / (wall * cores)
        return {"machine_busy": round(machine, 3), "this_benchmark": round(own, 3),
                "others": round(max(0.0, machine - own), 3), "load_average": os.getloadavg()}


def main() -> None:
    parser = argument_parser(__doc__, images=4000, repeats=3)
    parser.add_argument("--page-size", type=int, default=1 << 20, help="heap page size of the file (bytes)")
    arguments = parser.parse_args()
    cv2.setNumThreads(1)
    jpegs = make_jpegs(arguments.images, 256)
    task = ImageTask("rrc", 160, 64)
    meter = CpuMeter()
    result = {**run_header(), "images": arguments.images, "page_size": arguments.page_size, "links": {}}
    with tempfile.TemporaryDirectory() as directory:
        served = os.path.join(directory, "served")
        os.makedirs(served)
        path = os.path.join(served, "photos.beton")
        write_beton_images(jpegs, path, page_size=arguments.page_size)
        file_bytes = os.path.getsize(path)
        result["file_bytes"] = file_bytes
        with make_loader(path) as loader:  # compile the kernels, warm the OS page cache
            epoch_rate(loader)
        meter.start()
        for link, (rate, latency) in LINKS.items():
            rounds = []
            with serving(served, rate, latency) as server:
                wds = webdataset_images(jpegs, task, served,
                                        shard_url=lambda shard: server.url(os.path.basename(shard)))
                for _ in range(arguments.repeats):
                    row = {}
                    with make_loader(path) as loader:
                        row["local"] = epoch_rate(loader, "local")
                    with make_loader(path, os_cache=False) as loader:
                        row["local, process cache"] = epoch_rate(loader, "local, process cache")
                    with tempfile.TemporaryDirectory() as cache:
                        opened = time.perf_counter()
                        with make_loader(server.url("photos.beton"), remote=RemoteOptions(cache_dir=cache)) as loader:
                            row["open_seconds"] = time.perf_counter() - opened
                            before = server.stats()
                            row["remote, first epoch"] = epoch_rate(loader, "remote, first epoch")
                            after = server.stats()
                            row["bytes_over_link"] = after["bytes_sent"] - before["bytes_sent"]
                            row["requests"] = after["requests"] - before["requests"]
                            row["server_cpu_seconds"] = after["cpu_seconds"] - before["cpu_seconds"]
                            row["remote, second epoch"] = epoch_rate(loader, "remote, second epoch")
                            row["bytes_over_link_second"] = server.stats()["bytes_sent"] - after["bytes_sent"]
                    if not isinstance(wds, str):
                        row["WebDataset"] = epoch_rate(wds)  # its CPU is in worker processes: not comparable
                    row["cpu_ms_per_image"] = {k: round(v, 3) for k, v in CPU_MS_PER_IMAGE.items() if k}
                    rounds.append(row)
                    print(link, row, flush=True)
            contenders = [name for name in rounds[0] if name not in ("open_seconds", "requests") and
                          not name.startswith(("bytes", "server", "cpu"))]
            result["links"][link] = {
                "rounds": rounds,
                "link_limit_images_per_second": arguments.images / (file_bytes / rate),
                "median_images_per_second": {name: statistics.median(r[name] for r in rounds) for name in contenders},
                "median_ratio_to_local": {name: statistics.median(r[name] / r["local"] for r in rounds)
                                          for name in contenders},
                "median_cpu_ms_per_image": {name: statistics.median(r["cpu_ms_per_image"][name] for r in rounds)
                                            for name in rounds[0]["cpu_ms_per_image"]},
                "webdataset": None if not isinstance(wds, str) else wds,
            }
        result["cpu"] = meter.stop()
    save_json(RESULTS, result)
    print(markdown(result))


def markdown(result: dict) -> str:
    lines = [f"{result['images']} photo JPEGs ~256 px, file {result['file_bytes'] / 1e6:.1f} MB, "
             f"{result['page_size'] // 1024} KiB pages; {result['machine']}; machine busy "
             f"{result['cpu']['machine_busy']:.0%} (this benchmark {result['cpu']['this_benchmark']:.0%})", "",
             "| link | contender | images/s | × local (median of rounds) | CPU ms per image |",
             "|---|---|---|---|---|"]
    for link, data in result["links"].items():
        for name, rate in data["median_images_per_second"].items():
            cpu = data["median_cpu_ms_per_image"].get(name)
            lines.append(f"| {link} | {name} | {rate:,.0f} | {data['median_ratio_to_local'][name]:.2f} | "
                         f"{'' if cpu is None else f'{cpu:.3f}'} |")
        lines.append(f"| {link} | link limit | {data['link_limit_images_per_second']:,.0f} | | |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
