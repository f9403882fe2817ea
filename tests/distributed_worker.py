"""One rank of the torch.distributed tests: iterates every order and records the labels it saw.

Arguments: file, rendezvous file, rank, world size, output JSON, seed (an integer, or "none"). The file may be
several, separated by "|": each rank then opens its own (the one at its rank) and records only whether its Loader
opened, or the error it raised.
"""

from __future__ import annotations

import json
import sys

import torch.distributed as dist

from beton import Loader
from beton.errors import LoaderError

from conftest import ANY_FILE_ORDERS, window_of


def open_own(path: str, output: str, seed: int | None) -> None:
    try:
        with Loader(path, batch_size=16, seed=seed, distributed=True) as loader:
            outcome = {"batches": len(loader)}
    except LoaderError as error:
        outcome = {"error": str(error)}
    dist.destroy_process_group()
    with open(output, "w") as file:
        json.dump(outcome, file)


def main(path: str, rendezvous: str, rank: int, world_size: int, output: str, seed: int | None) -> None:
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world_size)
    if "|" in path:
        open_own(path.split("|")[rank], output, seed)
        return
    seen = {}
    for order in ANY_FILE_ORDERS:
        with Loader(path, batch_size=16, num_workers=2, order=order, seed=seed, distributed=True,
                    indices=range(202), order_kwargs=window_of(order)) as loader:
            seen[order.name] = {"len": len(loader), "seed": loader.seed,
                                "epochs": [[labels.tolist() for _, labels in loader] for _ in range(2)]}
    dist.barrier()
    dist.destroy_process_group()
    with open(output, "w") as file:
        json.dump(seen, file)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5],
         None if sys.argv[6] == "none" else int(sys.argv[6]))
