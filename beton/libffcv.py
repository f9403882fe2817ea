"""FFCV's import path ``ffcv.libffcv``, for the one name its field decoders use: ``memcpy``.

FFCV's own is a C call that trusts its sizes; this one refuses (``DecodeError``) to write past the destination.
Compile it as FFCV's decoders do, ``Compiler.compile(memcpy)``, or call it from compiled code directly.
"""

from __future__ import annotations

from typing import Any

from beton.pipeline.memcopy import copy_array

__all__ = ["memcpy"]


def memcpy(source: Any, destination: Any) -> None:
    """Copy every byte of the contiguous array ``source`` to the start of the contiguous array ``destination``."""
    copy_array(source, destination)
