"""Operations written to another library's contract, adapted where a pipeline is planned.

The planner (:mod:`beton.loader.pipelines`) takes beton operations only: an object written to a registered
:class:`OperationContract` (:mod:`beton.ffcv` registers FFCV's) is handed to it adapted, by :func:`as_operation`.
The table is the process's declared adapters, like the field registry's: changed only by
:func:`register_operation_contract`, under a lock.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from typing import Any

from beton.pipeline.operation import Operation

__all__ = ["OperationContract", "register_operation_contract", "as_operation"]

_contracts: dict[str, OperationContract] = {}
_lock = threading.Lock()


@dataclasses.dataclass(frozen=True)
class OperationContract:
    """Another library's operation contract: which objects follow it, and the beton operation that runs one."""

    name: str
    follows: Callable[[Any], bool]
    adapt: Callable[[Any], Operation]


def register_operation_contract(contract: OperationContract) -> None:
    """Adapt operations written to ``contract`` in every pipeline planned from now; the same name replaces."""
    with _lock:
        _contracts[contract.name] = contract


def as_operation(candidate: Any) -> Operation | None:
    """``candidate`` adapted by the first registered contract it follows; None when it follows none."""
    with _lock:
        contracts = tuple(_contracts.values())
    for contract in contracts:
        if contract.follows(candidate):
            return contract.adapt(candidate)
    return None
