"""beton/bounded_json.py: JSON from files parsed with a depth limit."""

from __future__ import annotations

import json

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from beton import bounded_json

DOCUMENTS = st.recursive(st.none() | st.booleans() | st.integers() | st.text(alphabet='[]{}"ab :,é'),
                         lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(alphabet='[]{}"a'), inner,
                                                                                       max_size=3), max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(document=DOCUMENTS, escaped=st.booleans())
def test_the_depth_counts_brackets_outside_strings_with_and_without_escapes(document, escaped):
    # text without a backslash is measured by the quotes' parity, text with one by stripping its strings: both
    # must be the nesting json itself finds
    text = json.dumps(document, ensure_ascii=escaped).encode()
    stripped = bounded_json._STRING.sub(b'""', text)
    expected = int(np.cumsum(bounded_json._OPEN[np.frombuffer(stripped, np.uint8)], dtype=np.int64).max(initial=0))
    assert bounded_json.nesting_depth(text) == expected == _depth(document)


def _depth(value) -> int:
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    return 0
