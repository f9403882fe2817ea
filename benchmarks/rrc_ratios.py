"""RandomResizedCrop-160 + flip against FFCV 1.0.2 and the decode limits, at ~256 and ~500 px (issue #28's ratios).

    PYTHONPATH=. FFCV_PYTHON benchmarks/rrc_ratios.py [--images N] [--repeats R] [--output FILE]

The suite's scenarios a and b (``beton bench``) alone: the same photo JPEGs, every contender in turn each round,
"beton is x faster" the median of the ratios within each round. FFCV_PYTHON: a Python where FFCV 1.0.2 is
installed next to beton (for benchmarks only, never a dependency); without FFCV its row is skipped and the
limits are still measured.
Writes benchmarks/results/rrc_ratios.json (``--output`` another file), each run's rounds included.
"""

from __future__ import annotations

import os
import tempfile

from beton.tools.bench import contenders as c, suite
from beton.tools.bench.data import make_jpegs
from beton.tools.bench.report import argument_parser, run_header, save_json

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "rrc_ratios.json")


def main() -> None:
    parser = argument_parser(__doc__, images=1000, repeats=7)
    parser.add_argument("--output", default=RESULTS)
    arguments = parser.parse_args()
    result = {**run_header(), "load_average_1min_at_start": round(os.getloadavg()[0], 1),
              "images": arguments.images, "repeats": arguments.repeats, "scenarios": {}}
    for side, name in ((256, "small"), (500, "large")):
        with tempfile.TemporaryDirectory() as directory:
            scenario = suite.image_scenario(make_jpegs(arguments.images, side), directory, name,
                                             c.ImageTask("rrc", 160, 64), arguments.repeats)
        result["scenarios"][f"RRC-160 + flip, ~{side} px"] = scenario
        print(f"~{side} px: beton is x faster: {scenario['beton_over']}", flush=True)
        print(f"~{side} px: the crop-only + resize limit's share of the others: {scenario['work_share']}", flush=True)
    save_json(arguments.output, result)


if __name__ == "__main__":
    main()
