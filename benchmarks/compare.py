"""Every loader on the same data and pipelines, side by side: ``python benchmarks/compare.py [--quick]``.

The same as ``beton bench``; see beton/bench/suite.py for the scenarios. Results go to
benchmarks/results/compare/ (results.json, results.md, results.png), or with --quick to
benchmarks/results/compare-quick/ (not committed: a quick run never replaces the full one), unless --output
says otherwise.
"""

from __future__ import annotations

import argparse
import os

from beton.tools.bench import run_suite


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small datasets: under 3 minutes")
    parser.add_argument("--output", default=None, help="directory for results.json, results.md, results.png")
    arguments = parser.parse_args()
    if arguments.output is None:
        folder = "compare-quick" if arguments.quick else "compare"
        arguments.output = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", folder)
    run_suite(quick=arguments.quick, output_dir=arguments.output)


if __name__ == "__main__":
    main()
