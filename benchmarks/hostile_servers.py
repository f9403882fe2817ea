"""Hostile HTTP servers against remote reads (issue #25 item 1): each case sets an attack on a loopback server
(tests/hostile_server.py, in this process) and reads from it in a child process of its own, which reports the
outcome (read, or the error's class and message), the requests the server saw, how far the child's peak resident
memory grew while reading (Linux: the peak is reset after beton and aiohttp are imported and a first file is read)
and its whole-life peak. A case still running after ``--timeout`` seconds is killed and reported as hanging.

    python benchmarks/hostile_servers.py [--only NAME,...] [--cap MIB] [--timeout 120] [--json results.json]

Endless bodies and headers are generated lazily and cut after ``--cap`` MiB (256 by default): a client that read
an answer whole holds that much. The ``before_*`` cases read the same answers as beton did before the fix
(fsspec's ``HTTPFileSystem.cat_file`` and ``info``), for comparison.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

from peak_memory import peak_growth_mb, reset_peak

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))

from hostile_server import Attack, HostileServer  # noqa: E402

BIG = 50 * 2**20


@dataclasses.dataclass(frozen=True)
class Case:
    what: str  # the attack, in words
    entry: str  # what the child does: Reader, Loader (two epochs), read_manifest, before_cat, before_info
    name: str  # the file read
    attacks: tuple  # functions (heap start, heap end, other server) -> Attack
    options: tuple = ()  # RemoteOptions fields


def _on_pages(kind: str, **more) -> object:
    return lambda low, high, other: Attack(kind, times=10**6, method="GET", from_byte=low, to_byte=high, **more)


def _always(kind: str, **more) -> object:
    return lambda low, high, other: Attack(kind, **{"times": 10**6, **more})


CASES = {
    "baseline_reader": Case("none: every sample read", "Reader", "data.beton", ()),
    "baseline_loader": Case("none: two epochs", "Loader", "data.beton", ()),
    "ignore_range_50mb": Case("200 and the whole 50 MB file for a 64 KiB range", "Reader", "big.bin",
                              (_always("ignore-range", method="GET"),)),
    "huge_length_at_open": Case("206, Content-Length 3 GiB, body sent lazily", "Reader", "data.beton",
                                (_always("huge-length", method="GET"),)),
    "endless_chunked_at_open": Case("206, chunked body without end", "Reader", "data.beton",
                                    (_always("endless-chunked", method="GET"),)),
    "endless_chunked_pages": Case("206, chunked body without end, for every page mid-epoch", "Loader", "data.beton",
                                  (_on_pages("endless-chunked"),)),
    "huge_length_manifest": Case("a manifest's GET answered with 3 GiB", "read_manifest", "train.json",
                                 (_always("huge-length", method="GET"),)),
    "manifest_over_cap": Case("a manifest whose HEAD says 64 MiB + 1", "read_manifest", "huge.json", ()),
    "long_header": Case("a header line without end (HEAD)", "Reader", "data.beton",
                        (_always("long-header", method="HEAD"),)),
    "many_headers": Case("header lines without end (HEAD)", "Reader", "data.beton",
                         (_always("many-headers", method="HEAD"),)),
    "head_503_twice_at_open": Case("two 503 at the size request at opening", "Loader", "data.beton",
                                   (_always("503", times=2),)),
    "head_503_twice_at_epoch_2": Case("two 503 at the second epoch's identity check", "Loader", "data.beton",
                                      (_always("503", times=2, method="HEAD", skip=2),)),
    "missing_404": Case("404", "Reader", "missing.beton", ()),
    "redirect_other_port": Case("302 to the same file on another port", "Reader", "data.beton",
                                (lambda low, high, other: Attack("redirect", times=10**6,
                                                                 location=other.url("{name}")),)),
    "redirect_other_port_any": Case("302 to another port, redirects='any'", "Reader", "data.beton",
                                    (lambda low, high, other: Attack("redirect", times=10**6,
                                                                     location=other.url("{name}")),),
                                    (("redirects", "any"),)),
    "poisoned_keep_alive": Case("bytes after each of 40 answers on the keep-alive connection", "Loader",
                                "data.beton", (_always("junk-after", times=40),)),
    "before_ignore_range_50mb": Case("fsspec cat_file (before): whole 50 MB file", "before_cat", "big.bin",
                                     (_always("ignore-range", method="GET"),)),
    "before_huge_length": Case("fsspec cat_file (before): 3 GiB announced", "before_cat", "data.beton",
                               (_always("huge-length", method="GET"),)),
    "before_endless_chunked": Case("fsspec cat_file (before): endless chunked", "before_cat", "data.beton",
                                   (_always("endless-chunked", method="GET"),)),
    "before_head_503": Case("fsspec info (before): two 503 at the size request", "before_info", "data.beton",
                            (_always("503", times=2),)),
}


def child(entry: str, url: str, warm_url: str, options: str) -> None:
    import fsspec

    import beton
    from beton.dataset import read_manifest

    remote = beton.RemoteOptions(retries=2, backoff=0.01, max_backoff=0.05, timeout=30.0, **json.loads(options))
    beton.Reader(warm_url, remote=remote).close()  # imports, the session and the loop ready before the peak reset
    filesystem = fsspec.filesystem("http")
    before = reset_peak()
    started = time.perf_counter()
    try:
        if entry == "Reader":
            with beton.Reader(url, remote=remote) as reader:
                outcome = f"read: {len(reader)} samples, {len([reader[i] for i in range(len(reader))])} checked"
        elif entry == "Loader":
            with beton.Loader(url, batch_size=50, num_workers=2, pipelines={"meta": None},
                              remote=remote) as loader:
                epochs = [sum(len(batch[0]) for batch in loader) for _ in range(2)]
            outcome = f"read: two epochs of {epochs} samples"
        elif entry == "read_manifest":
            outcome = f"read: {read_manifest(url, remote=remote).num_samples} samples"
        elif entry == "before_cat":
            outcome = f"read: {len(filesystem.cat_file(url, start=0, end=65536))} bytes"
        else:
            outcome = f"read: {filesystem.info(url)}"
    except Exception as error:  # noqa: BLE001 - the outcome is the report
        outcome = f"{type(error).__name__}: {error}"
    seconds = time.perf_counter() - started
    growth = peak_growth_mb(before)
    print(json.dumps({"outcome": outcome, "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
                                                                 / 1024, 1),
                      "peak_growth_mb": growth, "seconds": round(seconds, 2)}))


def _serve(directory: str) -> tuple[int, int]:
    """Write the served files; the heap's [start, end) of data.beton."""
    import numpy as np

    import beton
    from beton.fields import IntField, JSONField, NDArrayField

    fields = {"label": IntField(), "blob": NDArrayField(np.uint8, (2000,)), "meta": JSONField()}

    class Samples:
        def __len__(self) -> int:
            return 500

        def __getitem__(self, i: int) -> tuple:
            return i, np.random.default_rng(i).integers(0, 256, 2000, dtype=np.uint8), {"i": i}

    path = os.path.join(directory, "data.beton")
    beton.DatasetWriter(path, fields, page_size=8192, num_workers=0, progress=False).from_indexed_dataset(Samples())
    with open(os.path.join(directory, "big.bin"), "wb") as file:
        file.truncate(BIG)
    from beton.dataset.manifest import MAX_MANIFEST_BYTES

    with open(os.path.join(directory, "huge.json"), "wb") as file:
        file.truncate(MAX_MANIFEST_BYTES + 1)
    shutil.copyfile(path, os.path.join(directory, "warm.beton"))
    with beton.Reader(path) as reader:
        return reader.heap_offset, reader.heap_offset + reader.heap_size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default=None, help="comma-separated case names")
    parser.add_argument("--cap", type=int, default=256, help="MiB after which an endless answer is cut")
    parser.add_argument("--timeout", type=float, default=120)
    parser.add_argument("--json", default=None, help="also write the rows here")
    parser.add_argument("--child", nargs=4, metavar=("ENTRY", "URL", "WARM_URL", "OPTIONS"), help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    if arguments.child:
        child(*arguments.child)
        return
    rows = []
    with tempfile.TemporaryDirectory() as directory:
        low, high = _serve(directory)
        from beton import RemoteOptions
        from beton.dataset import dataset_manifest

        with HostileServer(directory, cap=arguments.cap * 2**20) as server, HostileServer(directory) as other:
            manifest = dataset_manifest([server.url("data.beton")], remote=RemoteOptions())
            with open(os.path.join(directory, "train.json"), "wb") as file:
                file.write(manifest.to_json(server.url("train.json")))
            for name in arguments.only.split(",") if arguments.only else CASES:
                case = CASES[name]
                server.attacks[:] = [make(low, high, other) for make in case.attacks]
                server.log.clear()
                other.log.clear()
                command = [sys.executable, __file__, "--child", case.entry, server.url(case.name),
                           other.url("warm.beton"), json.dumps(dict(case.options))]
                try:
                    result = subprocess.run(command, capture_output=True, text=True, timeout=arguments.timeout)
                    lines = result.stdout.strip().splitlines()
                    row = json.loads(lines[-1]) if lines else {"outcome": f"crashed: {result.stderr[-300:]}"}
                except subprocess.TimeoutExpired:
                    row = {"outcome": f"HUNG: killed after {arguments.timeout:.0f} s"}
                for running, said in ((server, "<server>"), (other, "<other>")):
                    row["outcome"] = row["outcome"].replace(f"http://127.0.0.1:{running.port}", said)
                redirected = sum(1 for logged in other.log if logged[1] != "warm.beton")  # not the warm-up's
                row = {"case": name, "attack": case.what, "requests": server.requests(),
                       "redirected_requests": redirected, **row}
                rows.append(row)
                print(f"{name:<28} {row['requests']:>4}+{redirected} req  +{row.get('peak_growth_mb', '-'):>6} MB  "
                      f"{row.get('peak_rss_mb', '-'):>6} MB peak  {row.get('seconds', '-'):>6} s  "
                      f"{row['outcome'][:220]}", flush=True)
    if arguments.json:
        with open(arguments.json, "w") as file:
            json.dump(rows, file, indent=2)


if __name__ == "__main__":
    main()
