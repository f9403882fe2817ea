"""The writer's samples/s, the benchmark suite's scenario f alone: ``python benchmarks/writer.py [--images N]
[--repeats R]``.

~256 px photo JPEGs (quality 90, 4:2:0) stored by ``DatasetWriter`` with 2 processes: with restart markers added
(the default: each JPEG checked, then transcoded losslessly), byte for byte (``restart_markers=False``), and
their pixels encoded to JPEG. Rounds alternate; medians are reported. Writes benchmarks/results/writer.json.
"""

from __future__ import annotations

import os
import statistics
import tempfile

from beton.tools.bench.data import make_jpegs
from beton.tools.bench.report import argument_parser, run_header, save_json
from beton.tools.bench.suite import writer_scenario

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "writer.json")


def main() -> None:
    arguments = argument_parser(__doc__, images=2000, repeats=3).parse_args()
    jpegs = make_jpegs(arguments.images, 256)
    with tempfile.TemporaryDirectory() as directory:
        writer_scenario(jpegs[:100], directory)  # warm-up: worker start, compiled kernels
        rounds = [writer_scenario(jpegs, directory)["samples_per_s"] for _ in range(arguments.repeats)]
    result = {**run_header(), "images": arguments.images, "load_average_1_5_15_min_at_end": os.getloadavg(),
              "samples_per_s_median": {name: round(statistics.median(r[name] for r in rounds)) for name in rounds[0]},
              "rounds": rounds}
    save_json(RESULTS, result)
    print(result)


if __name__ == "__main__":
    main()
