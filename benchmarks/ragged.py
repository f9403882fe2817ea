"""Variable-length samples: token sequences padded to 512 with lengths, beton against the torch DataLoader and
WebDataset, side by side in one run.

    python benchmarks/ragged.py [--samples N] [--repeats R] [--quick]

Data: 200,000 int32 sequences (``--samples``), lengths 16..2048 from a long-tailed (Pareto) distribution, median
~100 tokens, as in tokenised text. Every contender delivers the same batches' content: 512 sequences in a random
order, each cut to its first 512 tokens and padded with 0 into a (512, 512) int32 tensor, with a (512,) tensor of
lengths; 2 worker threads or processes each:

* beton: ``RaggedDecoder(512)`` + ``ToTensor`` (one fused compiled stage), ``OrderOption.RANDOM``;
* torch DataLoader: a Dataset over a numpy memmap of the tokens (offsets in memory) returning each sequence's
  first 512 tokens, a ``collate_fn`` that pads them, ``shuffle=True``, persistent workers;
* WebDataset (if installed): tar shards of one ``.tokens`` member per sequence (raw int32), shard shuffle and a
  1000-sample shuffle buffer, batched by the same padding function, 2 workers.

After a warm-up epoch each, ``--repeats`` rounds of one epoch per contender in turn; the ratio to beton is the
median of the ratios within each round (the host's speed drifts between rounds). Writes
benchmarks/results/ragged.json and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import numpy as np
import torch

import beton
from beton import Loader, OrderOption
from beton.decoders import RaggedDecoder
from beton.fields import RaggedArrayField
from beton.tools.bench.report import run_header, save_json
from beton.tools.bench.timing import alternating_runs, paired_ratio
from beton.transforms import ToTensor

BATCH_SIZE = 512
MAX_LENGTH = 512
WORKERS = 2
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "ragged.json")


def sequence_lengths(count: int, seed: int = 0) -> np.ndarray:
    """Long-tailed lengths in 16..2048: a Pareto tail (shape 1.2) over a floor of 16 tokens."""
    rng = np.random.default_rng(seed)
    return np.minimum(16 + (rng.pareto(1.2, count) * 80).astype(np.int64), 2048)


class Sequences:
    """Sequence i: ``lengths[i]`` int32 tokens, a view into one flat array (as the writer wants them)."""

    def __init__(self, tokens: np.ndarray, offsets: np.ndarray) -> None:
        self.tokens, self.offsets = tokens, offsets

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, index: int) -> tuple[np.ndarray]:
        return (self.tokens[self.offsets[index] : self.offsets[index + 1]],)


def pad_collate(sequences: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(batch, 512) int32 padded with 0, and the lengths: what beton's Padded batch holds."""
    values = torch.zeros((len(sequences), MAX_LENGTH), dtype=torch.int32)
    lengths = torch.empty(len(sequences), dtype=torch.int64)
    for row, sequence in enumerate(sequences):
        values[row, : len(sequence)] = sequence
        lengths[row] = len(sequence)
    return values, lengths


class MemmapSequences(torch.utils.data.Dataset):
    """The torch contender's Dataset: the first 512 tokens of a sequence, read from a numpy memmap."""

    def __init__(self, path: str, offsets: np.ndarray) -> None:
        self.path, self.offsets, self.tokens = path, offsets, None

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, index: int) -> torch.Tensor:
        if self.tokens is None:  # opened in each worker process
            self.tokens = np.load(self.path, mmap_mode="r")
        start = self.offsets[index]
        end = min(self.offsets[index + 1], start + MAX_LENGTH)
        return torch.from_numpy(np.array(self.tokens[start:end]))


class BetonBatches:
    """beton's Loader, its Padded batches given as (values, lengths) like the other contenders'."""

    def __init__(self, path: str) -> None:
        self.loader = Loader(path, batch_size=BATCH_SIZE, num_workers=WORKERS, order=OrderOption.RANDOM, seed=0,
                             pipelines={"tokens": [RaggedDecoder(MAX_LENGTH), ToTensor()]})

    def __iter__(self):
        return ((padded.values, padded.lengths) for (padded,) in self.loader)


def webdataset_batches(tokens: np.ndarray, offsets: np.ndarray, directory: str):
    try:
        import webdataset as wds
    except ImportError:
        return "WebDataset is not installed (pip install webdataset)"
    shards = []
    for shard in range(WORKERS * 4):
        path = os.path.join(directory, f"tokens-{shard:03d}.tar")
        with wds.TarWriter(path) as sink:
            for index in range(shard, len(offsets) - 1, WORKERS * 4):
                sink.write({"__key__": f"{index:08d}", "tokens": tokens[offsets[index] : offsets[index + 1]].tobytes()})
        shards.append(path)

    def decode(sample):
        return torch.from_numpy(np.frombuffer(sample["tokens"], np.int32, count=min(
            MAX_LENGTH, len(sample["tokens"]) // 4)).copy())

    dataset = wds.WebDataset(shards, shardshuffle=len(shards), empty_check=False).map(decode).shuffle(1000)
    dataset = dataset.batched(BATCH_SIZE, collation_fn=pad_collate, partial=True)
    # No persistent workers: an iterable dataset's workers would not see the next epoch start.
    return wds.WebLoader(dataset, batch_size=None, num_workers=WORKERS)


def check_same_content(batches: dict[str, object]) -> None:
    """Every contender pads the same way: a batch's rows are sequences' first tokens, then zeros."""
    for name, iterable in batches.items():
        values, lengths = next(iter(iterable))
        for row, length in zip(values[:8].numpy(), lengths[:8].tolist()):
            if length == 0 or row[length:].any() or length > MAX_LENGTH:
                raise AssertionError(f"{name}: a row is not a padded sequence")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="20,000 samples, 3 repeats")
    arguments = parser.parse_args()
    samples = 20_000 if arguments.quick else arguments.samples
    torch.set_num_threads(1)
    lengths = sequence_lengths(samples)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    tokens = (np.arange(offsets[-1], dtype=np.int64) % 50_000).astype(np.int32)
    print(f"{samples} sequences, {offsets[-1]} tokens, lengths {lengths.min()}..{lengths.max()} "
          f"(median {int(np.median(lengths))}, mean {lengths.mean():.0f}, {np.mean(lengths > MAX_LENGTH):.1%} "
          f"longer than {MAX_LENGTH})")
    with tempfile.TemporaryDirectory() as directory:
        started = time.perf_counter()
        path = os.path.join(directory, "tokens.beton")
        beton.DatasetWriter(path, {"tokens": RaggedArrayField(np.int32, (None,))}, num_workers=WORKERS,
                            progress=False).from_indexed_dataset(Sequences(tokens, offsets))
        written = time.perf_counter() - started
        np.save(os.path.join(directory, "tokens.npy"), tokens)
        contenders: dict[str, object] = {
            "beton": BetonBatches(path),
            "torch DataLoader (memmap, pad collate_fn)": torch.utils.data.DataLoader(
                MemmapSequences(os.path.join(directory, "tokens.npy"), offsets), batch_size=BATCH_SIZE,
                shuffle=True, num_workers=WORKERS, persistent_workers=True, collate_fn=pad_collate),
        }
        webdataset = webdataset_batches(tokens, offsets, directory)
        if isinstance(webdataset, str):
            print(f"WebDataset skipped: {webdataset}")
        else:
            contenders["WebDataset (tar shards, pad collate)"] = webdataset
        check_same_content(contenders)
        load = os.getloadavg()[0]
        runs = alternating_runs(contenders, arguments.repeats)
        load_after = os.getloadavg()[0]
    rates = {name: statistics.median(values) for name, values in runs.items()}
    ratios = {name: round(paired_ratio(runs["beton"], values), 2) for name, values in runs.items()}
    result = {
        **run_header(),
        "samples": samples,
        "tokens": int(offsets[-1]),
        "lengths": {"min": int(lengths.min()), "median": float(np.median(lengths)),
                    "mean": round(float(lengths.mean()), 1), "max": int(lengths.max()),
                    "longer_than_max_length": round(float(np.mean(lengths > MAX_LENGTH)), 4)},
        "batch_size": BATCH_SIZE,
        "max_length": MAX_LENGTH,
        "workers": WORKERS,
        "repeats": arguments.repeats,
        "load_average_1min": {"before": round(load, 2), "after": round(load_after, 2)},
        "beton_write_samples_per_s": round(samples / written),
        "samples_per_s": {name: round(value) for name, value in rates.items()},
        "rounds_samples_per_s": {name: [round(v) for v in values] for name, values in runs.items()},
        "beton_is_x_faster_paired": ratios,
    }
    save_json(RESULTS, result)
    print(json.dumps(result, indent=2))
    print("\n| contender | samples/s | beton is × faster (paired) |\n|---|---|---|")
    for name, value in rates.items():
        print(f"| {name} | {value:,.0f} | {ratios[name]:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
