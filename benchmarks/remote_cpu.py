"""Where a cold remote epoch's CPU goes, per MiB of pages, and the speed that leaves on this machine.

    python benchmarks/remote_cpu.py [--images N] [--repeats R]

The set-up of benchmarks/remote.py: photo JPEGs ~256 px in 1 MiB pages, RandomResizedCrop-160, 2 decoding threads,
QUASI_RANDOM with 8-page windows, tests/range_server.py in its own process on a 200 MB/s link. Per round:

* the local epoch (process cache) and a cold remote epoch (fresh disk cache): this process's CPU per MiB of the
  file, and the server's;
* each part of the remote path alone, over the whole file: range requests of one page, 8 at once, through beton's
  fetcher (fsspec and aiohttp: what the loader uses) and, for comparison: the same requests as coroutines on
  fsspec's event loop, without a thread blocked per request; beton's fetcher from a second server whose link is
  not throttled (the bytes arrive as fast as loopback carries them instead of in 64 KiB pieces spaced out in
  time); the standard library's blocking ``http.client`` reading into a preallocated buffer (a floor for any
  client written in Python). The server's CPU during each; CRC32 of every page; storing every page in a fresh
  disk cache.

A cold epoch needs the local epoch's CPU plus the fetching, checking and caching, plus (on this machine) the
server's. When the local epoch already keeps every core busy, the cold epoch can be at most
local / (local + those extras) as fast; the table gives that bound for the parts as measured and for the floor
client. Medians over rounds. Writes benchmarks/results/remote_cpu.json.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import http.client
import os
import statistics
import tempfile
import threading
import time
import urllib.parse
import zlib

import cv2
import fsspec

from beton import Reader, RemoteOptions
from beton.storage.remote.cache import DiskPageCache
from beton.storage.remote.fetch import RangeFetcher
from beton.tools.bench.contenders import write_beton_images
from beton.tools.bench.data import make_jpegs
from beton.tools.bench.report import argument_parser, run_header, save_json

from remote import CPU_MS_PER_IMAGE, ServerProcess, epoch_rate, make_loader

RATE = 200e6
IN_FLIGHT = 8
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "remote_cpu.json")


def own_cpu() -> float:
    """This process's CPU seconds, every thread (nanosecond clock, not clock ticks)."""
    return time.process_time()


def page_ranges(path: str) -> list[tuple[int, int]]:
    with Reader(path) as reader:
        return [reader.page_bounds(page) for page in range(reader.num_pages)]


def fetch_with_beton(url: str, ranges: list[tuple[int, int]]) -> None:
    fetcher = RangeFetcher(url, RemoteOptions())
    with concurrent.futures.ThreadPoolExecutor(IN_FLIGHT) as pool:
        list(pool.map(lambda bounds: fetcher.fetch(*bounds, "page"), ranges))


def fetch_with_fsspec_async(url: str, ranges: list[tuple[int, int]]) -> None:
    """The same requests as :func:`fetch_with_beton`, issued as coroutines on fsspec's event loop (8 at once)
    instead of one blocked thread per request: what the threads and their hand-offs to the loop cost."""
    fs, path = fsspec.core.url_to_fs(url)

    async def everything() -> None:
        gate = asyncio.Semaphore(IN_FLIGHT)

        async def one(start: int, end: int) -> bytes:
            async with gate:
                return await fs._cat_file(path, start=start, end=end)

        await asyncio.gather(*(one(*bounds) for bounds in ranges))

    asyncio.run_coroutine_threadsafe(everything(), fs.loop).result()


def fetch_with_http_client(url: str, ranges: list[tuple[int, int]]) -> None:
    """One keep-alive connection per thread; each body read straight into a buffer of its size."""
    parsed = urllib.parse.urlsplit(url)
    connections = threading.local()

    def fetch(bounds: tuple[int, int]) -> bytearray:
        connection = getattr(connections, "connection", None)
        if connection is None:
            connection = connections.connection = http.client.HTTPConnection(parsed.hostname, parsed.port)
        start, end = bounds
        connection.request("GET", parsed.path, headers={"Range": f"bytes={start}-{end - 1}"})
        answer = connection.getresponse()
        body = bytearray(end - start)
        view, filled = memoryview(body), 0
        while filled < len(body):
            count = answer.readinto(view[filled:])
            if not count:
                raise OSError(f"short body for {bounds}")
            filled += count
        return body

    with concurrent.futures.ThreadPoolExecutor(IN_FLIGHT) as pool:
        list(pool.map(fetch, ranges))


def measured(server: ServerProcess, work, megabytes: float) -> tuple[float, float]:
    """(this process's, the server's) CPU milliseconds per MiB while ``work()`` runs."""
    before, cpu = server.stats()["cpu_seconds"], own_cpu()
    work()
    own, served = own_cpu() - cpu, server.stats()["cpu_seconds"] - before
    return own * 1e3 / megabytes, served * 1e3 / megabytes


def main() -> None:
    arguments = argument_parser(__doc__, images=4000, repeats=5).parse_args()
    cv2.setNumThreads(1)
    result = {**run_header(), "images": arguments.images, "rate_bytes_per_second": RATE, "rounds": []}
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "photos.beton")
        write_beton_images(make_jpegs(arguments.images, 256), path, page_size=1 << 20)
        ranges = page_ranges(path)
        with open(path, "rb") as file:
            pages = [(file.seek(start), file.read(end - start))[1] for start, end in ranges]
        megabytes = os.path.getsize(path) / 2**20
        heap_megabytes = sum(len(page) for page in pages) / 2**20
        result["file_mib"] = round(megabytes, 1)
        with make_loader(path) as loader:  # compile the kernels, warm the OS page cache
            epoch_rate(loader)
        server = ServerProcess(directory, RATE, 0.0)
        unthrottled = ServerProcess(directory, 0.0, 0.0)  # rate 0: as fast as loopback carries the bytes
        url = server.url("photos.beton")
        try:
            for _ in range(arguments.repeats):
                row: dict[str, float] = {}
                with make_loader(path, os_cache=False) as loader:
                    rate = epoch_rate(loader, "local")
                row["local epoch, images/s"] = rate
                row["local epoch"] = CPU_MS_PER_IMAGE["local"] * arguments.images / megabytes
                with tempfile.TemporaryDirectory() as cache:
                    with make_loader(url, remote=RemoteOptions(cache_dir=cache)) as loader:
                        before = server.stats()["cpu_seconds"]
                        rate = epoch_rate(loader, "cold")
                        row["cold epoch, server"] = (server.stats()["cpu_seconds"] - before) * 1e3 / megabytes
                row["cold epoch, images/s"] = rate
                row["cold epoch"] = CPU_MS_PER_IMAGE["cold"] * arguments.images / megabytes
                row["fetch (beton: fsspec, aiohttp)"], row["fetch (beton), server"] = measured(
                    server, lambda: fetch_with_beton(url, ranges), heap_megabytes)
                row["fetch (fsspec, async)"], row["fetch (fsspec, async), server"] = measured(
                    server, lambda: fetch_with_fsspec_async(url, ranges), heap_megabytes)
                row["fetch (beton), unthrottled"], row["fetch (beton), unthrottled, server"] = measured(
                    unthrottled, lambda: fetch_with_beton(unthrottled.url("photos.beton"), ranges), heap_megabytes)
                row["fetch (http.client)"], row["fetch (http.client), server"] = measured(
                    server, lambda: fetch_with_http_client(url, ranges), heap_megabytes)
                cpu = own_cpu()
                for page in pages:
                    zlib.crc32(page)
                row["crc32"] = (own_cpu() - cpu) * 1e3 / heap_megabytes
                with tempfile.TemporaryDirectory() as cache:
                    disk = DiskPageCache(cache, None, ("benchmark",))
                    cpu = own_cpu()
                    for number, page in enumerate(pages):
                        disk.put(number, page)
                    row["disk cache put"] = (own_cpu() - cpu) * 1e3 / heap_megabytes
                result["rounds"].append({name: round(value, 3) for name, value in row.items()})
                print(result["rounds"][-1], flush=True)
        finally:
            server.stop()
            unthrottled.stop()
    median = {name: statistics.median(r[name] for r in result["rounds"]) for name in result["rounds"][0]}
    local = median["local epoch"]
    checking = median["crc32"] + median["disk cache put"]
    result["median"] = median
    result["bound_cold_over_local"] = {
        "measured cold epoch (this process + server)":
            local / (median["cold epoch"] + median["cold epoch, server"]),
        "parts, beton's fetcher": local / (local + median["fetch (beton: fsspec, aiohttp)"] + checking
                                           + median["fetch (beton), server"]),
        "parts, http.client": local / (local + median["fetch (http.client)"] + checking
                                       + median["fetch (http.client), server"]),
        "parts, http.client, server elsewhere": local / (local + median["fetch (http.client)"] + checking),
    }
    result["measured_cold_over_local"] = statistics.median(
        r["cold epoch, images/s"] / r["local epoch, images/s"] for r in result["rounds"])
    save_json(RESULTS, result)
    print(markdown(result))


def markdown(result: dict) -> str:
    median = result["median"]
    lines = [f"{result['images']} photos, {result['file_mib']} MiB, 200 MB/s loopback link; {result['machine']}", "",
             "| CPU ms per MiB (medians) | this process | server |", "|---|---|---|",
             f"| local epoch (process cache) | {median['local epoch']:.2f} | |",
             f"| cold remote epoch | {median['cold epoch']:.2f} | {median['cold epoch, server']:.2f} |",
             f"| fetch, beton (fsspec, aiohttp) | {median['fetch (beton: fsspec, aiohttp)']:.2f} | "
             f"{median['fetch (beton), server']:.2f} |",
             f"| fetch, fsspec coroutines (no thread per request) | {median['fetch (fsspec, async)']:.2f} | "
             f"{median['fetch (fsspec, async), server']:.2f} |",
             f"| fetch, beton, unthrottled link | {median['fetch (beton), unthrottled']:.2f} | "
             f"{median['fetch (beton), unthrottled, server']:.2f} |",
             f"| fetch, http.client | {median['fetch (http.client)']:.2f} | "
             f"{median['fetch (http.client), server']:.2f} |",
             f"| CRC32 | {median['crc32']:.2f} | |",
             f"| disk cache put | {median['disk cache put']:.2f} | |", "",
             f"Cold epoch / local epoch, measured: {result['measured_cold_over_local']:.2f}", "",
             "| bound on cold / local when the local epoch keeps every core busy | |", "|---|---|"]
    lines += [f"| {name} | {value:.2f} |" for name, value in result["bound_cold_over_local"].items()]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
