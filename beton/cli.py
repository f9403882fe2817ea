"""The ``beton`` command: ``beton info FILE``, ``beton verify FILE``.

Exit codes: 0 success, 1 the file is invalid or corrupt, 2 bad command-line arguments.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

import numpy as np

from beton.errors import BetonError
from beton.reader import Reader
from beton.verify import verify

__all__ = ["main", "describe"]


def describe(reader: Reader) -> str:
    """A human-readable summary of a file: layout, fields with their arguments, payload sizes."""
    file_size = len(reader.file_map)
    lines = [
        f"file:        {reader.path}",
        f"format:      beton v{int(reader.header['version'])}",
        f"samples:     {reader.num_samples}",
        f"size:        {_bytes(file_size)} ({file_size} bytes)",
        f"page size:   {_bytes(reader.page_size)}, {reader.num_pages} pages, heap {_bytes(reader.heap_size)}",
        f"fields:      {len(reader.descriptors)}",
    ]
    for name, descriptor in reader.descriptors.items():
        arguments = json.dumps(descriptor.arguments, ensure_ascii=False)
        lines.append(f"  {name!r}: {descriptor.type_name} {arguments}")
        if descriptor.has_payload and reader.num_samples:
            sizes = reader.allocation_table[:, descriptor.payload_column]["size"]
            lines.append(
                f"      payload bytes: mean {float(np.mean(sizes)):.1f}, min {int(sizes.min())}, "
                f"max {int(sizes.max())}, total {_bytes(int(sizes.sum()))}"
            )
    return "\n".join(lines)


def _bytes(count: int) -> str:
    if count < 1024:
        return f"{count} B"
    value = count / 1024
    for unit in ("KiB", "MiB"):
        if value < 1024:
            return f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"


def _info(arguments: argparse.Namespace) -> int:
    with Reader(arguments.file) as reader:
        print(describe(reader))
    return 0


def _verify(arguments: argparse.Namespace) -> int:
    report = verify(arguments.file)
    print(f"OK: {report.path}: {report.num_samples} samples, {report.num_pages} pages, "
          f"{report.bytes_checked} bytes checked")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="beton", description="Inspect and check .beton dataset files.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    info = commands.add_parser("info", help="describe a file: samples, pages, fields and their arguments")
    info.add_argument("file")
    info.set_defaults(run=_info)
    check = commands.add_parser("verify", help="check every checksum; exit 1 naming the first bad page/sample")
    check.add_argument("file")
    check.set_defaults(run=_verify)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    arguments = _parser().parse_args(argv)
    try:
        return arguments.run(arguments)
    except (BetonError, OSError) as error:
        print(f"beton {arguments.command}: error: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
