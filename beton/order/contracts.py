"""Orders written to another library's contract, adapted where the Loader resolves its ``order=``.

A class given as ``Loader(order=cls)`` is a beton :class:`~beton.order.Order` built with the order's keyword
arguments, or a class written to a registered :class:`OrderContract` (:mod:`beton.ffcv` registers FFCV's
``TraversalOrder``), which the contract builds into an Order. The table is a :class:`~beton.contracts.ContractTable`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from beton.contracts import ContractTable
from beton.order.base import Order

__all__ = ["OrderContract", "register_order_contract", "is_order_class", "build_order"]



@dataclasses.dataclass(frozen=True)
class OrderContract:
    """Another library's order contract: which classes follow it, and how one becomes a beton Order."""

    name: str
    follows: Callable[[type], bool]
    #: (the class, the Loader, the order's keyword arguments) -> the Order.
    build: Callable[[type, Any, Mapping[str, Any]], Order]


_contracts: ContractTable[OrderContract] = ContractTable()


def register_order_contract(contract: OrderContract) -> None:
    """Adapt order classes written to ``contract`` from now on; registering the same name again replaces it."""
    _contracts.register(contract)


def is_order_class(candidate: Any) -> bool:
    """Whether ``candidate`` is a class ``Loader(order=...)`` takes: an Order, or one of a registered contract."""
    return isinstance(candidate, type) and (issubclass(candidate, Order) or _contracts.find(candidate) is not None)


def build_order(cls: type, loader: Any, kwargs: Mapping[str, Any]) -> Order:
    """The Order for the class ``cls`` (see :func:`is_order_class`) of ``loader``."""
    contract = _contracts.find(cls)
    return cls(**kwargs) if contract is None else contract.build(cls, loader, kwargs)
