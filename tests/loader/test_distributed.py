"""Real processes under torch.distributed (gloo, CPU): the ranks' shares partition every epoch for every order,
with a seed and without one."""

from __future__ import annotations

import collections
import json
import subprocess
import sys

import pytest

from beton import Loader
from beton.dataset.shards import index
from beton.fields import IntField

from conftest import ANY_FILE_ORDERS, TESTS, window_of, write

SAMPLES = 202
BATCH_SIZE = 16


def run_ranks(image_file, tmp_path, world_size: int, seed: int | None) -> list[dict]:
    worker = str(TESTS / "distributed_worker.py")
    outputs = [tmp_path / f"rank{rank}.json" for rank in range(world_size)]
    processes = [
        subprocess.Popen([sys.executable, worker, str(image_file), str(tmp_path / "rendezvous"), str(rank),
                          str(world_size), str(outputs[rank]), "none" if seed is None else str(seed)],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for rank in range(world_size)
    ]
    for process in processes:
        output, _ = process.communicate(timeout=300)
        assert process.returncode == 0, output
    return [json.loads(path.read_text()) for path in outputs]


@pytest.mark.parametrize(("world_size", "seed"), [(2, 9), (3, None)])  # a seed given, and drawn by rank 0
def test_ranks_partition_every_epoch_of_every_order(image_file, tmp_path, world_size, seed):
    results = run_ranks(image_file, tmp_path, world_size, seed)
    per_rank = -(-SAMPLES // world_size)  # shards are padded to equal length (as DistributedSampler's)
    for order in ANY_FILE_ORDERS:
        ranks = [result[order.name] for result in results]
        agreed = {rank["seed"] for rank in ranks}
        assert len(agreed) == 1, f"{order.name}: the ranks used different seeds {agreed}"
        (used,) = agreed
        assert used == seed if seed is not None else isinstance(used, int)
        for rank in ranks:
            assert rank["len"] == -(-per_rank // BATCH_SIZE)
        for epoch in range(2):
            labels = [sum(rank["epochs"][epoch], []) for rank in ranks]
            assert all(len(mine) == per_rank for mine in labels)
            counts = collections.Counter(label for mine in labels for label in mine)
            assert set(counts) == set(range(SAMPLES)), f"{order.name} epoch {epoch} misses samples"
            padding = per_rank * world_size - SAMPLES  # only these are seen twice
            assert sorted(counts.values()) == [1] * (SAMPLES - padding) + [2] * padding
            # what each rank saw is what the same loader computes for that rank without torch.distributed
            for rank in range(world_size):
                with Loader(image_file, batch_size=BATCH_SIZE, num_workers=1, order=order, seed=used,
                            rank=rank, world_size=world_size, indices=range(SAMPLES),
                            order_kwargs=window_of(order)) as loader:
                    assert [b.tolist() for b in loader.epoch_batches(epoch)] == ranks[rank]["epochs"][epoch]


@pytest.mark.parametrize("what", ["dataset", "seed"])
def test_ranks_that_opened_different_data_are_refused_on_every_rank(tmp_path, what):
    """A glob listed while a writer still added shards: one rank saw a shard fewer. Each rank shuffled and cut
    its own dataset, so their shares overlapped and left samples out, and they got different numbers of batches
    (a job hangs at the epoch's end). Seeds given by hand that differ did the same."""
    shards = [write(tmp_path / f"part-{k}.beton", {"label": IntField()}, [(i,) for i in range(50 * k, 50 * k + 50)])
              for k in range(4)]
    sources, seeds = ([shards[:3], shards], ["7", "7"]) if what == "dataset" else ([shards, shards], ["7", "8"])
    manifests = [str(tmp_path / f"rank{rank}.json") for rank in range(2)]
    for manifest, source in zip(manifests, sources):
        index(manifest, source)
    outputs = [tmp_path / f"rank{rank}.out.json" for rank in range(2)]
    processes = [subprocess.Popen([sys.executable, str(TESTS / "distributed_worker.py"), "|".join(manifests),
                                   str(tmp_path / "rendezvous"), str(rank), "2", str(outputs[rank]), seeds[rank]],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for rank in range(2)]
    for process in processes:
        output, _ = process.communicate(timeout=300)
        assert process.returncode == 0, output
    for rank in range(2):
        outcome = json.loads(outputs[rank].read_text())
        assert "error" in outcome, f"rank {rank} opened {outcome}"
        assert f"the ranks did not open the same data: rank 1 has {what} " in outcome["error"]


def test_distributed_without_a_process_group_is_a_clear_error(image_file):
    from beton.errors import PipelineError

    with pytest.raises(PipelineError, match="torch.distributed"):
        Loader(image_file, batch_size=4, distributed=True)


@pytest.mark.parametrize("world_size", [2, 3])
def test_ranks_given_by_hand_agree_on_a_seed_without_one(image_file, world_size):
    """No process group to broadcast through: every rank falls back to the same fixed seed."""
    from beton import OrderOption

    seen = []
    for rank in range(world_size):
        with Loader(image_file, batch_size=8, num_workers=1, order=OrderOption.RANDOM, rank=rank,
                    world_size=world_size) as loader:
            seen.append([int(i) for batch in loader.epoch_batches(0) for i in batch])
    assert set().union(*seen) == set(range(203))
    assert all(len(mine) == -(-203 // world_size) for mine in seen)
