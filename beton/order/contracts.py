"""Orders written to another library's contract, adapted where the Loader resolves its ``order=``.

A class given as ``Loader(order=cls)`` is a beton :class:`~beton.order.Order` built with the order's keyword
arguments, or a class written to a registered :class:`OrderContract` (:mod:`beton.ffcv` registers FFCV's
``TraversalOrder``), which the contract builds into an Order. The table is the process's declared adapters,
like the field registry's: changed only by :func:`register_order_contract`, under a lock.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Mapping
from typing import Any

from beton.order.base import Order

__all__ = ["OrderContract", "register_order_contract", "is_order_class", "build_order"]

_contracts: dict[str, OrderContract] = {}
_lock = threading.Lock()


@dataclasses.dataclass(frozen=True)
class OrderContract:
    """Another library's order contract: which classes follow it, and how one becomes a beton Order."""

    name: str
    follows: Callable[[type], bool]
    #: (the class, the Loader, the order's keyword arguments) -> the Order.
    build: Callable[[type, Any, Mapping[str, Any]], Order]


def register_order_contract(contract: OrderContract) -> None:
    """Adapt order classes written to ``contract`` from now on; registering the same name again replaces it."""
    with _lock:
        _contracts[contract.name] = contract


def _contract_of(cls: type) -> OrderContract | None:
    with _lock:
        contracts = tuple(_contracts.values())
    return next((contract for contract in contracts if contract.follows(cls)), None)


def is_order_class(candidate: Any) -> bool:
    """Whether ``candidate`` is a class ``Loader(order=...)`` takes: an Order, or one of a registered contract."""
    return isinstance(candidate, type) and (issubclass(candidate, Order) or _contract_of(candidate) is not None)


def build_order(cls: type, loader: Any, kwargs: Mapping[str, Any]) -> Order:
    """The Order for the class ``cls`` (see :func:`is_order_class`) of ``loader``."""
    contract = _contract_of(cls)
    return cls(**kwargs) if contract is None else contract.build(cls, loader, kwargs)
