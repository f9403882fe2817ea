"""Side-by-side timing shared by the benchmarks: warm up each contender, then alternate epochs."""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterable, Mapping


def epoch_rate(iterable: Iterable) -> float:
    """Samples per second over one pass; a batch's second element is its labels (their length counts)."""
    start = time.perf_counter()
    count = sum(len(batch[1]) for batch in iterable)
    return count / (time.perf_counter() - start)


def alternating_rates(contenders: Mapping[str, Iterable], repeats: int) -> dict[str, float]:
    """Median samples/s of each contender over ``repeats`` alternating epochs, after one warm-up epoch each."""
    for iterable in contenders.values():
        epoch_rate(iterable)  # warm-up: compilation, page cache, worker start
    rates: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(repeats):
        for name, iterable in contenders.items():
            rates[name].append(epoch_rate(iterable))
    return {name: statistics.median(values) for name, values in rates.items()}
