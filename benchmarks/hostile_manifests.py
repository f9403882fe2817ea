"""Hostile manifest files (issue #25 item 2): each shard entry of tests/manifest_entries.py, in a local manifest and
in one served by a loopback HTTP server, read as ``Loader`` reads a dataset (``dataset_manifest``). Prints each
case's outcome: refused (the error's class and message), opened, or hanging (the entries point at a FIFO, which
blocks whoever opens it), with the requests a second server (the "other host", serving the directory beside the
manifest's) saw. Then the opt-in, and what a non-beton file's error says.

    python benchmarks/hostile_manifests.py [--timeout 20]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))

from manifest_entries import EVERYWHERE, LOCAL, REMOTE, hostile_manifest, make_sandbox  # noqa: E402
from range_server import RangeServer  # noqa: E402

import beton  # noqa: E402
from beton.dataset.shards import dataset_manifest  # noqa: E402


def outcome(call, timeout: float) -> str:
    result: list[str] = []

    def run() -> None:
        try:
            manifest = call()
            result.append(f"ACCEPTED: {[shard.location for shard in manifest.shards]}")
        except Exception as error:  # noqa: BLE001 - reported
            result.append(f"refused: {type(error).__name__}: {error}")

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    return result[0] if result else f"HANGS (> {timeout:g} s): it opened the FIFO"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timeout", type=float, default=20.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root:
        sandbox = make_sandbox(root)
        with RangeServer(root) as here, RangeServer(sandbox["outside"]) as other:
            other_url = other.url("").rstrip("/")
            for where, table in (("local", {**EVERYWHERE, **LOCAL}), ("http", {**EVERYWHERE, **REMOTE})):
                for name, (template, _) in table.items():
                    entry = template.format(outside=sandbox["outside"],
                                            other=other_url if where == "http" else "http://127.0.0.1:1")
                    path = hostile_manifest(sandbox, entry)
                    source = path if where == "local" else here.url("data/hostile.json")
                    before = len(other.paths)
                    said = outcome(lambda: dataset_manifest(source), args.timeout)
                    print(f"[{where:5}] {name:32} {entry!r}\n        -> {said.replace(root, '<sandbox>')}\n"
                          f"        other host's requests: {len(other.paths) - before}")
            opted = hostile_manifest(sandbox, "../outside/outside.beton")
            said = outcome(lambda: dataset_manifest(opted, allow_outside=True), args.timeout)
            print(f"[opt-in] '../outside/outside.beton' with allow_outside=True -> {said.replace(root, '<sandbox>')}")
            passwd = os.path.join(sandbox["outside"], "passwd")
            for what, call in (("Reader", lambda: beton.Reader(passwd)),
                               ("Reader over HTTP", lambda: beton.Reader(other.url("passwd")))):
                try:
                    call()
                    print(f"[non-beton] {what}: opened?!")
                except Exception as error:  # noqa: BLE001 - reported
                    print(f"[non-beton] {what} of a file starting b'root:x:0': {type(error).__name__}: "
                          f"{str(error).replace(root, '<sandbox>')}")


if __name__ == "__main__":
    main()
