"""Warnings that point at the user's line, not at beton's."""

from __future__ import annotations

import os
import sys
import warnings

__all__ = ["warn_at_user_code"]

_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def warn_at_user_code(message: str, category: type[Warning] = UserWarning) -> None:
    """``warnings.warn`` attributed to the innermost caller outside the beton package: where a pipeline is
    planned, for one, is several beton frames below the user's ``for batch in loader``."""
    level, frame = 2, sys._getframe(1)  # stacklevel 2 is our caller, sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        level, frame = level + 1, frame.f_back
    warnings.warn(message, category, stacklevel=level)
