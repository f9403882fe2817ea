"""Every loader on the same data and pipelines, side by side: ``python benchmarks/compare.py [--quick]``.

The same as ``beton bench``; see beton/bench/suite.py for the scenarios. Results go to
benchmarks/results/compare/ (results.json, results.md, results.png) unless --output says otherwise.
"""

from __future__ import annotations

import argparse
import os

from beton.bench import run_suite


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small datasets: under 3 minutes")
    parser.add_argument("--output", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                                         "compare"))
    arguments = parser.parse_args()
    run_suite(quick=arguments.quick, output_dir=arguments.output)


if __name__ == "__main__":
    main()
