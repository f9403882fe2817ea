"""The benchmark suite's scenarios e (first batch in a fresh process) and f (writer) alone, repeated:
``python benchmarks/startup_and_writer.py [--images N] [--repeats R]``.

e: seconds to the first RandomResizedCrop-160 batch of ~256 px photo JPEGs in a fresh process, with empty beton
and numba caches (cold: every kernel compiles) and then with those caches (warm); a new cache each round.
f: samples/s of ``DatasetWriter`` with 2 processes storing the JPEGs with restart markers added (the default:
each JPEG checked, then transcoded losslessly), byte for byte (``restart_markers=False``), and encoding their
pixels to JPEG. Rounds alternate; medians are reported. Writes benchmarks/results/startup_and_writer.json.
"""

from __future__ import annotations

import os
import statistics
import tempfile

from beton.tools.bench.contenders import write_beton_images
from beton.tools.bench.data import make_jpegs
from beton.tools.bench.report import argument_parser, run_header, save_json
from beton.tools.bench.suite import first_batch_scenario, writer_scenario

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "startup_and_writer.json")


def main() -> None:
    arguments = argument_parser(__doc__, images=2000, repeats=3).parse_args()
    jpegs = make_jpegs(arguments.images, 256)
    first_batch, writer = [], []
    with tempfile.TemporaryDirectory() as directory:
        path = write_beton_images(jpegs, os.path.join(directory, "small.beton"))
        writer_scenario(jpegs[:100], directory)  # warm-up: worker start, compiled kernels
        for round_ in range(arguments.repeats):
            caches = os.path.join(directory, f"caches-{round_}")
            os.makedirs(caches)
            first_batch.append(first_batch_scenario(path, caches))
            writer.append(writer_scenario(jpegs, directory)["samples_per_s"])
    result = {**run_header(), "images": arguments.images,
              "load_average_1_5_15_min_at_end": [round(value, 1) for value in os.getloadavg()],
              "first_batch_seconds_median": {
                  f"{label}, {part}": statistics.median(r[label][part] for r in first_batch)
                  for label in ("cold", "warm") for part in ("seconds_total", "seconds_after_imports")},
              "writer_samples_per_s_median": {name: statistics.median(r[name] for r in writer) for name in writer[0]},
              "rounds": {"first_batch": first_batch, "writer": writer}}
    save_json(RESULTS, result)
    print(result)


if __name__ == "__main__":
    main()
