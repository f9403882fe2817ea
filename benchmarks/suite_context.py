"""beton against its decode (crop only) + resize limit, alone and with other contenders run between them: does the
suite's company change beton's share of the limit? (Issue #28: ``rrc_ratios.py`` put beton at 0.76-0.81 of that
limit, and 7-round runs of this script at 0.95-0.97 alone and 0.81-0.86 in company; 25-round runs then gave
0.88-0.91 alone and 0.85-0.91 in company: no effect beyond the noise.)

    PYTHONPATH=. FFCV_PYTHON benchmarks/suite_context.py [--images N] [--repeats R] [--company NAMES]
                                                         [--limit-first] [--output F]

RandomResizedCrop-160 + flip on the suite's ~256 px photos. ``--company``: a comma-separated subset of torch, pil,
ffcv, wds (the suite's torch DataLoaders with simplejpeg and with PIL, FFCV 1.0.2, WebDataset), run after beton and
the limit in each round, as in the suite; empty for the two alone. ``--limit-first`` runs the limit before beton, so
that it, not beton, follows the company. Per contender: the median epoch time, the CPU time of this process during
it (its own threads; the DataLoaders' work runs in worker processes), and its minor page faults; then beton's paired
speed over the limit's. Writes benchmarks/results/suite_context.json.
"""

from __future__ import annotations

import os
import resource
import statistics
import tempfile
import time

from beton.tools.bench import contenders as c
from beton.tools.bench.data import make_jpegs
from beton.tools.bench.report import argument_parser, run_header, save_json
from beton.tools.bench.timing import paired_ratio

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "suite_context.json")


def main() -> None:
    parser = argument_parser(__doc__, images=1000, repeats=7)
    parser.add_argument("--company", default="torch,pil,ffcv,wds")
    parser.add_argument("--limit-first", action="store_true", help="the limit before beton in each round")
    parser.add_argument("--output", default=RESULTS)
    arguments = parser.parse_args()
    company = [name for name in arguments.company.split(",") if name]
    jpegs = make_jpegs(arguments.images, 256)
    task = c.ImageTask("rrc", 160, 64)
    with tempfile.TemporaryDirectory() as directory:
        path = c.write_beton_images(jpegs, os.path.join(directory, "photos.beton"))
        builders = {"torch": lambda: c.torch_images(jpegs, task, "simplejpeg"),
                    "pil": lambda: c.torch_images(jpegs, task, "pil"),
                    "ffcv": lambda: c.ffcv_images(jpegs, directory, task, "photos"),
                    "wds": lambda: c.webdataset_images(jpegs, task, os.path.join(directory, "wds"))}
        contenders = {"beton": c.beton_images(path, task),
                      "crop+resize limit": c.DecodeLimit(jpegs, task, "crop", resize=True)}
        if arguments.limit_first:
            contenders = dict(reversed(contenders.items()))
        for name in company:
            built = builders[name]()
            if isinstance(built, str):
                raise SystemExit(f"{name}: {built}")
            contenders[name] = built.loader if isinstance(built, c.Converted) else built
        times = {name: {"wall": [], "cpu": [], "faults": []} for name in contenders}
        for iterable in contenders.values():  # warm-up
            for _ in iterable:
                pass
        for _ in range(arguments.repeats):
            for name, iterable in contenders.items():
                faults, cpu, wall = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.process_time(), \
                    time.perf_counter()
                for _ in iterable:
                    pass
                times[name]["wall"].append(time.perf_counter() - wall)
                times[name]["cpu"].append(time.process_time() - cpu)
                times[name]["faults"].append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults)
    result = {**run_header(), "images": arguments.images, "repeats": arguments.repeats, "company": company,
              "median_ms": {name: {kind: round(statistics.median(values) * 1e3, 1) for kind, values in kinds.items()
                                   if kind != "faults"} for name, kinds in times.items()},
              "median_minor_faults": {name: statistics.median(kinds["faults"]) for name, kinds in times.items()},
              # a speed ratio: the limit's epoch time over beton's, within each round
              "beton_over_limit": round(paired_ratio(times["crop+resize limit"]["wall"], times["beton"]["wall"]), 3),
              "rounds": {name: {kind: [round(value * 1e3, 1) for value in values] for kind, values in kinds.items()
                                if kind != "faults"} for name, kinds in times.items()}}
    print({key: result[key] for key in ("company", "median_ms", "median_minor_faults", "beton_over_limit")})
    save_json(arguments.output, result)


if __name__ == "__main__":
    main()
