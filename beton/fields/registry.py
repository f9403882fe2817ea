"""Which classes a stored field type name may become: the only road from a name in a file to code.

A ``.beton`` file is untrusted input, so the type name it stores is never imported. A reader instantiates a
field only from a class the program vouched for:

1. ``custom_fields=`` given to the Reader or Loader (by field name, then by stored type name); a field instance
   given there stands for its class (FFCV programs pass instances, and FFCV uses only the class): the stored
   arguments build the field, never the instance's own;
2. beton's own fields;
3. classes registered in this process with :func:`register` (``beton.fields.register(AudioField)``);
4. classes that installed packages declare in the ``beton.fields`` entry-point group, whose entry name is
   the stored type name (``[project.entry-points."beton.fields"]`` ``"mypkg.AudioField" =
   "mypkg.fields:AudioField"``): installing a package is the user's decision, and only the entry that
   matches the name is loaded.

Anything else opens as :class:`~beton.fields.base.UnknownField`: its records and raw payload bytes stay
readable, and decoding it raises a :class:`~beton.errors.FieldError` saying how to register the class.

Fields written to another library's field contract enter here too: a :class:`FieldContract` registered with
:func:`register_contract` (:mod:`beton.ffcv` registers FFCV's) adapts such a field where it enters, written
(:func:`as_beton_field`) or rebuilt from a file (:func:`field_from_arguments`); storage sees beton fields only.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Mapping
from importlib import metadata as importlib_metadata
from typing import Any, TypeVar

from beton.contracts import ContractTable
from beton.errors import FieldError
from beton.fields.base import Field

__all__ = ["register", "unregister", "registered_fields", "FieldClasses", "ENTRY_POINT_GROUP", "FieldContract",
           "register_contract", "as_beton_field", "field_from_arguments"]

ENTRY_POINT_GROUP = "beton.fields"

FieldClass = TypeVar("FieldClass", bound=type[Field])

# The process's declared trust, like the codecs registry: a deliberate module-level table, changed only by
# register() and unregister(), under a lock so that threads opening files see whole updates.
_registered: dict[str, type[Field]] = {}
_lock = threading.Lock()


@dataclasses.dataclass(frozen=True)
class FieldContract:
    """Another library's field contract, adapted onto beton's where a field enters (module docstring)."""

    name: str
    #: Whether a field object or class is written to this contract rather than beton's.
    follows: Callable[[Any], bool]
    #: The beton field that stores and reads such a field object.
    adapt: Callable[[Any], Field]
    #: The beton field for such a class (vouched for by the program) and the arguments a file stores for it.
    rebuild: Callable[[type, Mapping[str, Any]], Field]


_contracts: ContractTable[FieldContract] = ContractTable()


def register_contract(contract: FieldContract) -> None:
    """Adapt fields written to ``contract`` wherever fields enter; registering the same name again replaces it."""
    _contracts.register(contract)


def as_beton_field(field: Field) -> Field:
    """``field`` itself, or the beton field that adapts it when it is written to a registered contract."""
    contract = _contracts.find(field)
    return field if contract is None else contract.adapt(field)


def field_from_arguments(cls: type[Field], arguments: Mapping[str, Any]) -> Field:
    """A field of class ``cls`` (vouched for by the program) from the arguments a file stores for it."""
    contract = _contracts.find(cls)
    return cls.from_arguments(arguments) if contract is None else contract.rebuild(cls, arguments)


def register(cls: FieldClass, name: str | None = None) -> FieldClass:
    """Allow readers in this process to open fields stored under ``name`` as ``cls``; returns ``cls``.

    ``name`` defaults to ``cls.stored_type_name()`` (what the writer stored). Usable as a class decorator.
    Registering another class under a name already taken raises FieldError.
    """
    _check_field_class(cls, name or "?")
    key = name or cls.stored_type_name()
    with _lock:
        known = _registered.get(key)
        if known is not None and known is not cls:
            raise FieldError(f"field type {key!r} is already registered as {known.__module__}.{known.__qualname__}")
        _registered[key] = cls
    return cls


def unregister(name: str) -> None:
    """Forget the class registered under ``name`` (no error when there is none)."""
    with _lock:
        _registered.pop(name, None)


def registered_fields() -> dict[str, type[Field]]:
    """A copy of the classes registered with :func:`register`, by stored type name."""
    with _lock:
        return dict(_registered)


class FieldClasses:
    """The classes the program vouches for (the sources the module docstring lists), gathered once - per
    opened file - so that resolving each stored name costs no scan of the installed packages."""

    def __init__(self, builtins: Mapping[str, type[Field]], custom_fields: Mapping[str, type[Field]] | None) -> None:
        self._builtins = dict(builtins)
        # an instance stands for its class: the file's stored arguments build the field, as for a class
        self._custom = {key: type(value) if isinstance(value, Field) else value
                        for key, value in (custom_fields or {}).items()}
        self._registered = registered_fields()
        self._entry_points: dict[str, importlib_metadata.EntryPoint] = {}
        for entry in importlib_metadata.entry_points(group=ENTRY_POINT_GROUP):
            self._entry_points.setdefault(entry.name, entry)  # the first installed one, as a scan finds it

    def resolve(self, type_name: str, field_name: str) -> type[Field] | None:
        """The class for a stored field; None when nothing vouches for it. Raises FieldError when a class given
        by the program is no Field subclass, or an installed entry point fails to load."""
        for key in (field_name, type_name):
            if key in self._custom:
                return _check_field_class(self._custom[key], type_name)
        found = self._builtins.get(type_name) or self._registered.get(type_name)
        if found is not None:
            return found
        entry = self._entry_points.get(type_name)
        if entry is None:
            return None
        try:
            loaded = entry.load()
        except Exception as error:  # noqa: BLE001 - an installed package's fault, reported as a FieldError
            raise FieldError(f"field type {type_name!r}: its entry point {entry.value!r} failed to load: "
                             f"{error}") from error
        return _check_field_class(loaded, type_name)


def _check_field_class(candidate: object, type_name: str) -> type[Field]:
    if not (isinstance(candidate, type) and issubclass(candidate, Field)):
        raise FieldError(f"{candidate!r} given for field type {type_name!r} is not a Field subclass (nor a field "
                         "instance, which stands for its class)")
    return candidate


def unregistered_reason(type_name: str, field_name: str) -> str:
    """Why a stored field opened as unknown, and how to open it."""
    short = type_name.rsplit(".", 1)[-1]
    return (f"field type {type_name!r} is not registered (a file never makes beton import code); if you trust "
            f"the class, call beton.fields.register({short}) or pass custom_fields={{{field_name!r}: {short}}}")
