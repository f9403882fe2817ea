"""What every benchmark script shares: its command line, the machine it ran on, and where results go."""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

__all__ = ["argument_parser", "machine", "run_header", "save_json"]


def argument_parser(doc: str, images: int | None = None, repeats: int | None = None) -> argparse.ArgumentParser:
    """A parser described by the script's docstring, with ``--images`` and ``--repeats`` when given defaults."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    if images is not None:
        parser.add_argument("--images", type=int, default=images)
    if repeats is not None:
        parser.add_argument("--repeats", type=int, default=repeats)
    return parser


def machine() -> str:
    return f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"


def run_header() -> dict:
    """The first entries of every results file: where and when it was measured."""
    return {"machine": machine(), "date": time.strftime("%Y-%m-%d")}


def save_json(path: str, result: dict) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as file:
        json.dump(result, file, indent=2)
