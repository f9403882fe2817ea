"""Two real processes under torch.distributed (gloo, CPU): shards partition the data for every order."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from beton import Loader

from conftest import ANY_FILE_ORDERS


def test_two_process_gloo_run_partitions_every_order(image_file, tmp_path):
    worker = os.path.join(os.path.dirname(__file__), "distributed_worker.py")
    outputs = [tmp_path / f"rank{rank}.json" for rank in range(2)]
    processes = [
        subprocess.Popen([sys.executable, worker, str(image_file), str(tmp_path / "rendezvous"), str(rank), "2",
                          str(outputs[rank])], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for rank in range(2)
    ]
    for process in processes:
        output, _ = process.communicate(timeout=300)
        assert process.returncode == 0, output
    results = [json.loads(path.read_text()) for path in outputs]
    for order in ANY_FILE_ORDERS:
        ranks = [result[order.name] for result in results]
        assert ranks[0]["len"] == ranks[1]["len"] == 7  # 101 samples per rank -> 7 batches each
        for epoch in range(2):
            batches = [rank["epochs"][epoch] for rank in ranks]
            assert len(batches[0]) == len(batches[1]) == 7
            labels = [sum(rank_batches, []) for rank_batches in batches]
            assert not set(labels[0]) & set(labels[1])
            assert sorted(labels[0] + labels[1]) == list(range(202))
            # what each rank saw is what the same loader computes for that rank without torch.distributed
            for rank in range(2):
                with Loader(image_file, batch_size=16, num_workers=1, order=order, seed=9, rank=rank,
                            world_size=2, indices=range(202), quasi_random_window=2) as loader:
                    assert [b.tolist() for b in loader.epoch_batches(epoch)] == batches[rank]


def test_distributed_without_a_process_group_is_a_clear_error(image_file):
    from beton.errors import PipelineError

    with pytest.raises(PipelineError, match="torch.distributed"):
        Loader(image_file, batch_size=4, distributed=True)
