"""A table of other libraries' contracts, by name, for a seam where their objects enter beton and are adapted.

The field registry, pipeline planning and the Loader's order resolution each keep one (:mod:`beton.ffcv`
registers FFCV's): the process's declared adapters, a deliberate module-level table like the field registry's,
changed only by :meth:`ContractTable.register`, under a lock so that threads see whole updates.
"""

from __future__ import annotations

import threading
from typing import Any, Generic, Protocol, TypeVar

__all__ = ["Contract", "ContractTable"]


class Contract(Protocol):
    name: str

    def follows(self, candidate: Any) -> bool: ...


C = TypeVar("C", bound=Contract)


class ContractTable(Generic[C]):
    """The registered contracts of one seam."""

    def __init__(self) -> None:
        self._contracts: dict[str, C] = {}
        self._lock = threading.Lock()

    def register(self, contract: C) -> None:
        """Adapt objects written to ``contract`` from now on; registering the same name again replaces it."""
        with self._lock:
            self._contracts[contract.name] = contract

    def find(self, candidate: Any) -> C | None:
        """The first registered contract ``candidate`` follows; None when it follows none."""
        with self._lock:
            contracts = tuple(self._contracts.values())
        return next((contract for contract in contracts if contract.follows(candidate)), None)
