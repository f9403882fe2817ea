"""Side-by-side timing shared by the benchmarks: warm up each contender, then alternate epochs."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable, Mapping

__all__ = ["epoch_rate", "alternating_runs", "alternating_rates", "paired_ratio", "alternating_cpu_seconds",
           "ratio_quartiles"]


def epoch_rate(iterable: Iterable) -> float:
    """Samples per second over one pass; a batch's second element is its labels (their length counts)."""
    start = time.perf_counter()
    count = sum(len(batch[1]) for batch in iterable)
    return count / (time.perf_counter() - start)


def alternating_runs(contenders: Mapping[str, Iterable], repeats: int) -> dict[str, list[float]]:
    """Samples/s of each contender in each of ``repeats`` rounds (one epoch each, contenders in turn), after one
    warm-up epoch each. Round k of every contender ran within seconds of the others: compare within rounds."""
    for iterable in contenders.values():
        epoch_rate(iterable)  # warm-up: compilation, page cache, worker start
    rates: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(repeats):
        for name, iterable in contenders.items():
            rates[name].append(epoch_rate(iterable))
    return rates


def alternating_rates(contenders: Mapping[str, Iterable], repeats: int) -> dict[str, float]:
    """Median samples/s of each contender over ``repeats`` alternating epochs (see :func:`alternating_runs`)."""
    return {name: statistics.median(values) for name, values in alternating_runs(contenders, repeats).items()}


def paired_ratio(numerator: list[float], denominator: list[float]) -> float:
    """Median over rounds of numerator/denominator: on a machine whose speed drifts (shared hosts), a ratio taken
    within a round is steadier than the ratio of two medians taken over different moments."""
    return statistics.median(a / b for a, b in zip(numerator, denominator))


def alternating_cpu_seconds(runs: Mapping[str, Callable[[], object]], repeats: int,
                            clock: Callable[[], float] = time.process_time) -> dict[str, list[float]]:
    """CPU seconds (``clock``: the process's, or ``time.thread_time`` for one thread's) of each run in each of
    ``repeats`` rounds, after one warm-up call each: every run once a round, in turn, the order reversed every other
    round so that none always follows the same one. CPU time moves far less than wall time on a loaded host."""
    for run in runs.values():
        run()
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    for round_ in range(repeats):
        for name in list(runs) if round_ % 2 == 0 else list(reversed(runs)):
            start = clock()
            runs[name]()
            seconds[name].append(clock() - start)
    return seconds


def ratio_quartiles(numerator: list[float], denominator: list[float]) -> dict[str, object]:
    """The per-round ratios' median and quartiles (see :func:`paired_ratio`), rounded to 3 places."""
    ratios = sorted(a / b for a, b in zip(numerator, denominator))
    return {"median": round(statistics.median(ratios), 3),
            "quartiles": [round(value, 3) for value in statistics.quantiles(ratios, n=4)]}
