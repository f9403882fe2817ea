"""How long opening (validating) a large file takes: the target is < 1 s for 1,000,000 samples.

    python benchmarks/open_time.py [--samples N]

Writes a file of N samples (an int label and a small bytes payload each), then times Reader() (all table
checksums and the allocation bounds check) and verify() (every page checksum), best of 5.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import beton
from beton.fields import BytesField, IntField


class Labels:
    def __init__(self, count: int) -> None:
        self.count = count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> tuple[int, bytes]:
        return index % 1000, index.to_bytes(8, "little")


def best_of(repeats: int, action) -> float:
    timings = []
    for _ in range(repeats):
        start = time.perf_counter()
        action()
        timings.append(time.perf_counter() - start)
    return min(timings)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=1_000_000)
    arguments = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "open_time.beton")
        start = time.perf_counter()
        beton.DatasetWriter(path, {"label": IntField(), "key": BytesField()}, num_workers=2,
                            progress=False).from_indexed_dataset(Labels(arguments.samples), chunksize=5000)
        write_seconds = time.perf_counter() - start
        result = {
            "samples": arguments.samples,
            "file_bytes": os.path.getsize(path),
            "write_samples_per_s": round(arguments.samples / write_seconds),
            "open_s": round(best_of(5, lambda: beton.Reader(path).close()), 4),
            "verify_s": round(best_of(5, lambda: beton.verify(path)), 4),
        }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
