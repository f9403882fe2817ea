"""Shake the epoch engine: thousands of short epochs under random delays at every hand-off, each checked exactly.

    python benchmarks/stress.py --epochs 20000 [--seed S] [--minutes M] [--max-delay 0.02] [--probability 0.01]

The harness is tests/epoch_stress.py (tests/loader/test_stress.py runs a few hundred of its epochs in the suite):
sleeps of 0 to --max-delay seconds, each with --probability (else a sleep(0), a
thread switch, with --yields), before and after every hand-off of the engine (a
worker taking a batch and publishing it, the slot gate, the consumer's next(), close(), interrupt(), the process
cache's schedule and page reader) and around and inside its conditions' critical sections; epochs over 0-3
workers, the OS cache and the process cache, full, broken off, raising in the loop body, superseded by
iter(), closed, or with the Loader deleted, slow or fast loop bodies; every batch compared with
loader.epoch_batches(epoch), and no thread left behind. The seed picks the scenarios and the delays (the threads'
interleavings are the machine's). Prints the failures by kind, epochs/s and the seed; writes
benchmarks/results/stress.json; exits with status 1 on any failure (goal: none). --minutes stops early.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import random
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the harness is one of the suite's shared helpers

import epoch_stress  # noqa: E402

from beton.tools.bench.report import run_header, save_json  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "stress.json")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=20000)
    parser.add_argument("--seed", type=int, default=None, help="default: a new one, printed")
    parser.add_argument("--minutes", type=float, default=None, help="stop after this long")
    parser.add_argument("--max-delay", type=float, default=0.02, help="longest sleep at a hand-off, seconds")
    parser.add_argument("--probability", type=float, default=0.01, help="chance of a sleep at each hand-off")
    parser.add_argument("--yields", type=float, default=0.3, help="chance of a sleep(0) at each hand-off otherwise")
    parser.add_argument("--slow-step", type=float, default=0.02, help="longest sleep of a slow loop body")
    parser.add_argument("--no-save", action="store_true", help="do not write benchmarks/results/stress.json")
    arguments = parser.parse_args()
    seed = arguments.seed if arguments.seed is not None else random.SystemRandom().randrange(2**31)
    print(f"seed {seed}", flush=True)
    with tempfile.TemporaryDirectory() as directory:
        path = epoch_stress.write_file(os.path.join(directory, "stress.beton"))
        summary = epoch_stress.run(
            path, arguments.epochs, seed, max_delay=arguments.max_delay, probability=arguments.probability,
            yields=arguments.yields,
            slow_step=arguments.slow_step, seconds=arguments.minutes * 60 if arguments.minutes else None,
            progress=lambda s: print(f"{s.epochs} epochs, {s.failed} failures, {s.epochs / s.seconds:.1f}/s",
                                     flush=True))
    print(summary.report())
    print(f"rerun: python benchmarks/stress.py --epochs {arguments.epochs} --seed {seed}")
    if not arguments.no_save:
        save_json(RESULTS, {
            **run_header(), "seed": seed, "epochs": summary.epochs, "seconds": round(summary.seconds, 1),
            "epochs_per_s": round(summary.epochs / summary.seconds, 1), "failures": summary.failed,
            "by_kind": dict(summary.failures), "actions": dict(summary.actions),
            "max_delay": arguments.max_delay, "probability": arguments.probability,
            "yields": arguments.yields,
            "slow_step": arguments.slow_step})
    return 1 if summary.failed else 0


if __name__ == "__main__":
    sys.exit(main())
