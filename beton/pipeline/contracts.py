"""Operations written to another library's contract, adapted where a pipeline is planned.

The planner (:mod:`beton.loader.pipelines`) takes beton operations only: an object written to a registered
:class:`OperationContract` (:mod:`beton.ffcv` registers FFCV's) is handed to it adapted, by :func:`as_operation`.
The table is a :class:`~beton.contracts.ContractTable`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from beton.contracts import ContractTable
from beton.pipeline.operation import Operation

__all__ = ["OperationContract", "register_operation_contract", "as_operation"]



@dataclasses.dataclass(frozen=True)
class OperationContract:
    """Another library's operation contract: which objects follow it, and the beton operation that runs one."""

    name: str
    follows: Callable[[Any], bool]
    adapt: Callable[[Any], Operation]


_contracts: ContractTable[OperationContract] = ContractTable()


def register_operation_contract(contract: OperationContract) -> None:
    """Adapt operations written to ``contract`` in every pipeline planned from now; the same name replaces."""
    _contracts.register(contract)


def as_operation(candidate: Any) -> Operation | None:
    """``candidate`` adapted by the first registered contract it follows; None when it follows none."""
    contract = _contracts.find(candidate)
    return None if contract is None else contract.adapt(candidate)
