"""JSON from files, parsed with a depth limit: text from a file must not exhaust the stack.

Python's ``json`` recurses once per nesting level, so ``[[[[...]]]]`` a hundred thousand levels deep raises
RecursionError (or, under a raised recursion limit, overflows the C stack). The nesting depth is measured first,
outside strings, without recursion; the size needs no separate cap because every caller parses bytes that the
file holds (each string or payload once), so the work is bounded by the file's size.
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np

from beton.errors import DecodeError

__all__ = ["MAX_JSON_DEPTH", "loads", "nesting_depth", "decode_payload"]

#: Deepest nesting of arrays and objects accepted in any JSON a file holds (arguments, dtypes, payloads).
MAX_JSON_DEPTH = 200

_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)  # a JSON string, escapes included
_OPEN = np.zeros(256, np.int8)
_OPEN[[ord("["), ord("{")]] = 1
_OPEN[[ord("]"), ord("}")]] = -1
_QUOTE = ord('"')
#: bytes.translate table keeping brackets and quotes, every other byte made 0
_KINDS = bytes(byte if byte in b'[]{}"' else 0 for byte in range(256))


def nesting_depth(data: bytes) -> int:
    """The deepest nesting of ``[`` and ``{`` in JSON text, brackets inside strings not counted.

    On invalid JSON (an unterminated string) the result may be too high, never too low.
    """
    if b"\\" in data:
        steps = _OPEN[np.frombuffer(_STRING.sub(b'""', data), np.uint8)]
    else:
        # without escapes every '"' opens or closes a string: the brackets after an odd number of them lie inside
        # one (in invalid JSON the parser stops at the first error, before the parity could mislead it). Only the
        # brackets and quotes are looked at: a manifest of 100,000 shards is 15 MB of mostly names.
        kinds = np.frombuffer(data.translate(_KINDS), np.uint8)
        kinds = kinds[np.flatnonzero(kinds)]
        steps = _OPEN[kinds]
        steps[(np.cumsum(kinds == _QUOTE, dtype=np.int64) & 1).astype(bool)] = 0
    return int(np.cumsum(steps, dtype=np.int64).max(initial=0))


def loads(data: bytes | str, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """``json.loads`` of UTF-8 text, refusing nesting deeper than ``max_depth``.

    Raises ValueError (json.JSONDecodeError, UnicodeDecodeError or a depth error), never RecursionError.
    """
    raw = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    if raw.count(b"[") + raw.count(b"{") > max_depth:  # fewer brackets than the limit cannot nest deeper
        depth = nesting_depth(raw)
        if depth > max_depth:
            raise ValueError(f"JSON nests {depth} levels deep, more than the {max_depth} allowed")
    try:
        return json.loads(raw.decode("utf-8"))
    except RecursionError:  # only reachable when called from an already deep stack
        raise ValueError("JSON nests too deeply for the current recursion limit") from None


def decode_payload(data: bytes) -> Any:
    """A stored JSON document (a JSONField payload); DecodeError when it is invalid or nests too deeply."""
    try:
        return loads(data)
    except ValueError as error:  # JSONDecodeError, UnicodeDecodeError, too deep
        raise DecodeError(f"stored JSON is invalid: {error}") from None
