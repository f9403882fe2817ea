"""``beton convert KIND ...``: the command-line face of :mod:`beton.tools.convert`.

Every converter prints its :class:`~beton.tools.convert.report.ConversionReport` (samples, size, time and
throughput, fields, class names, notes, and every skipped source with its reason); ``--report FILE.json`` also
writes it as JSON. Exit status: 0 when the file was written (also when ``--on-error skip`` left sources out:
they are listed), 1 when the conversion failed (the first bad source is named) or every source was skipped
(either way the output path is left as it was), 2 for bad arguments. The output may be a URL (``s3://...``): the file
is written locally and uploaded once complete, reached as ``--storage-options``, ``--retries``... say.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import warnings
from collections.abc import Callable
from typing import Any

from beton.fields.rgb_image import WRITE_MODES
from beton.limits import DEFAULT_MAX_IMAGE_PIXELS
from beton.storage import format as fmt
from beton.tools.convert.parquet import COLUMN_KINDS
from beton.tools.convert.report import DEFAULT_MAX_FILE_BYTES, ConversionReport, ConversionWarning
from beton.tools.convert.webdataset import KINDS as EXTENSION_KINDS

__all__ = ["add_convert_parser", "byte_size", "json_object", "page_size_argument", "positive_argument"]

_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
          "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tb": 1000**4, "tib": 1 << 40}


def byte_size(text: str) -> int:
    """``"8MiB"``, ``"500MB"``, ``"1.5G"``, ``"4096"`` as a number of bytes (argparse type)."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
    if not match or match.group(2).lower() not in _UNITS:
        raise argparse.ArgumentTypeError(f"expected a size such as 4096, 8MiB or 2GB, got {text!r}")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def page_size_argument(text: str) -> int:
    size = byte_size(text)
    if not fmt.is_valid_page_size(size):
        raise argparse.ArgumentTypeError(f"must be a power of two from {fmt.MIN_PAGE_SIZE} B to 4 GiB, got {text}")
    return size


def positive_argument(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def _quality(text: str) -> int:
    value = int(text)
    if not 1 <= value <= 100:
        raise argparse.ArgumentTypeError(f"must lie in 1..100, got {text}")
    return value


def _probability(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must lie in [0, 1], got {text}")
    return value


def _existing_path(text: str) -> str:
    if not os.path.exists(text):
        raise argparse.ArgumentTypeError(f"{text!r} does not exist")
    return text


def json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"not JSON: {error}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object, such as '{\"license\": \"CC-BY-4.0\"}'")
    return value


def _assignment(kinds: tuple[str, ...]) -> Any:
    def parse(text: str) -> tuple[str, str]:
        name, equals, kind = text.rpartition("=")
        if not equals or not name or kind not in kinds:
            raise argparse.ArgumentTypeError(f"expected NAME=KIND with KIND one of {', '.join(kinds)}, got {text!r}")
        return name, kind
    return parse


def _add_image_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("images")
    group.add_argument("--write-mode", choices=WRITE_MODES, default=None,
                       help="how images are stored: jpg (default: JPEG files kept, not re-encoded, other formats "
                            "encoded), raw pixels, lossless (default with --keep-alpha/--keep-depth), smart, "
                            "proportion, progressive, balanced")
    group.add_argument("--max-resolution", type=positive_argument, default=None, metavar="PX",
                       help="shrink images whose longer side is larger (default: keep every size)")
    group.add_argument("--jpeg-quality", type=_quality, default=90, metavar="Q",
                       help="quality 1..100 of the JPEGs beton encodes (default 90; JPEG files kept as they are "
                            "are not re-encoded)")
    group.add_argument("--smart-threshold", type=positive_argument, default=None, metavar="BYTES",
                       help="--write-mode smart: images whose raw pixels take more bytes are stored as JPEG")
    group.add_argument("--compress-probability", type=_probability, default=0.5, metavar="P",
                       help="--write-mode proportion: chance that an image is stored as JPEG (default 0.5)")
    group.add_argument("--channels", type=int, choices=(1, 3), default=3,
                       help="3: RGB (default); 1: grey (colour images converted)")
    group.add_argument("--keep-alpha", action="store_true",
                       help="store RGBA (4 channels, losslessly) instead of dropping alpha channels")
    group.add_argument("--keep-depth", action="store_true",
                       help="store 16 bits per sample (losslessly) instead of reducing 16-bit images to 8 bits")
    group.add_argument("--no-restart-markers", dest="restart_markers", action="store_false",
                       help="store JPEG files byte for byte (default: restart markers are added losslessly, the same "
                            "pixels, so that crop decoders decode only the part of each image a crop needs)")
    group.add_argument("--max-image-pixels", type=_pixels, default=DEFAULT_MAX_IMAGE_PIXELS, metavar="N",
                       help="refuse image files whose header declares more pixels (width x height), before "
                            f"decoding them (default {DEFAULT_MAX_IMAGE_PIXELS}, the readers' cap; 'none': no cap)")


def _add_file_size_option(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--max-file-bytes", type=_file_bytes, default=DEFAULT_MAX_FILE_BYTES, metavar="SIZE",
                        help=f"refuse {what} larger than SIZE, before reading them (default 256MiB; 'none': no cap)")


def _pixels(text: str) -> int | None:
    if text.strip().lower() == "none":
        return None
    return positive_argument(text)


def _file_bytes(text: str) -> int | None:
    if text.strip().lower() == "none":
        return None
    size = byte_size(text)
    if size < 1:
        raise argparse.ArgumentTypeError(f"must be at least one byte, got {text!r}")
    return size


def _image_options(arguments: argparse.Namespace) -> dict[str, Any]:
    return {"write_mode": arguments.write_mode, "max_resolution": arguments.max_resolution,
            "jpeg_quality": arguments.jpeg_quality, "smart_threshold": arguments.smart_threshold,
            "compress_probability": arguments.compress_probability, "channels": arguments.channels,
            "keep_alpha": arguments.keep_alpha, "keep_depth": arguments.keep_depth,
            "max_image_pixels": arguments.max_image_pixels, "restart_markers": arguments.restart_markers}


def _add_common_options(parser: argparse.ArgumentParser, on_error: bool = True) -> None:
    group = parser.add_argument_group("writing")
    if on_error:
        group.add_argument("--on-error", choices=("fail", "skip"), default="fail",
                           help="fail (default): stop at the first source that cannot be read or stored, naming "
                                "it, and leave OUT as it was; skip: leave such sources out and list each with "
                                "the reason")
    group.add_argument("--num-workers", type=int, default=-1,
                       help="encoding processes (default -1: every usable core; 0: this process)")
    group.add_argument("--page-size", type=page_size_argument, default=fmt.DEFAULT_PAGE_SIZE, metavar="SIZE",
                       help="heap page size, a power of two such as 4MiB (default 8MiB)")
    group.add_argument("--metadata", type=json_object, default=None, metavar="JSON",
                       help="extra file-level metadata, a JSON object such as '{\"license\": \"CC-BY-4.0\"}' "
                            "(read back as Reader.metadata)")
    group.add_argument("--report", default=None, metavar="FILE.json",
                       help="also write the report (skipped sources with reasons, notes, timing) as JSON")
    group.add_argument("--no-progress", action="store_true", help="no progress bar")


def _writing(arguments: argparse.Namespace) -> dict[str, Any]:
    options = {"num_workers": arguments.num_workers, "page_size": arguments.page_size,
               "metadata": arguments.metadata, "progress": not arguments.no_progress, "remote": arguments.remote}
    if hasattr(arguments, "on_error"):
        options["on_error"] = arguments.on_error
    return options


def _finish(report: ConversionReport, arguments: argparse.Namespace) -> int:
    for line in report.lines():  # source names come from the data: each line escaped, no terminal control codes
        print(arguments.escape(line))
    if arguments.report is not None:
        with open(arguments.report, "w", encoding="utf-8") as file:
            json.dump(report.to_json(), file, indent=2, ensure_ascii=False)
    return 0


def _imagefolder(arguments: argparse.Namespace) -> int:
    from beton.tools.convert.imagefolder import imagefolder

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConversionWarning)  # the report's notes say the same
        report = imagefolder(arguments.source, arguments.output, follow_links=arguments.follow_links,
                             max_file_bytes=arguments.max_file_bytes, **_writing(arguments),
                             **_image_options(arguments))
    return _finish(report, arguments)


def _numpy(arguments: argparse.Namespace) -> int:
    from beton.tools.convert.arrays import numpy_file

    return _finish(numpy_file(arguments.source, arguments.output, name=arguments.name, **_writing(arguments)),
                   arguments)


def _torch(arguments: argparse.Namespace) -> int:
    from beton.tools.convert.arrays import torch_file

    return _finish(torch_file(arguments.source, arguments.output, name=arguments.name, **_writing(arguments)),
                   arguments)


def _parquet(arguments: argparse.Namespace) -> int:
    from beton.tools.convert.parquet import parquet

    columns = [name for name in arguments.columns.split(",") if name] if arguments.columns else None
    return _finish(parquet(arguments.sources, arguments.output, columns=columns, types=dict(arguments.type),
                           **_writing(arguments), **_image_options(arguments)), arguments)


def _webdataset(arguments: argparse.Namespace) -> int:
    from beton.tools.convert.webdataset import webdataset

    extensions = [item for item in arguments.extensions.split(",") if item] if arguments.extensions else None
    return _finish(webdataset(arguments.sources, arguments.output, extensions=extensions, types=dict(arguments.type),
                              keep_key=not arguments.no_key, max_file_bytes=arguments.max_file_bytes,
                              **_writing(arguments), **_image_options(arguments)),
                   arguments)


def add_convert_parser(commands: Any, escape: Callable[[str], str],
                       add_remote_flags: Callable[[argparse.ArgumentParser], None]) -> None:
    """Add ``convert`` and its kinds to the ``beton`` command's subparsers; ``escape`` makes text taken from the
    data safe to print (the command's own ``printable``); ``add_remote_flags`` adds the flags that say how an
    output at a URL is reached (the command's own, building ``arguments.remote``)."""
    convert = commands.add_parser("convert", help="write a .beton file from another layout",
                                  description=__doc__.split("\n\n", 1)[1].strip())
    convert.set_defaults(escape=escape)
    kinds = convert.add_subparsers(dest="kind", required=True, metavar="KIND")

    folder = kinds.add_parser("imagefolder", help="class folders of images (labels from the sorted folder names)",
                              description="torchvision's layout: SRC_DIR/<class>/**/<image>. Formats are told "
                                          "by content; every stored JPEG is checked to decode; class names and "
                                          "the source folder are stored in the file's metadata.")
    folder.add_argument("source", type=_existing_path, metavar="SRC_DIR", help="folder of class folders")
    folder.add_argument("output", metavar="OUT.beton", help="the file to write, a path or URL (uploaded once complete)")
    folder.add_argument("--follow-links", action="store_true",
                        help="follow symbolic links that lead out of SRC_DIR (by default they are refused; links "
                             "to SRC_DIR itself or above it are never followed)")
    _add_file_size_option(folder, "image files")
    _add_image_options(folder)
    _add_common_options(folder)
    add_remote_flags(folder)
    folder.set_defaults(run=_imagefolder)

    for name, runner, help_text in (("numpy", _numpy, ".npy or .npz: one field per array"),
                                    ("torch", _torch, ".pt: a tensor, or a dict/list of tensors, one field each")):
        sub = kinds.add_parser(name, help=help_text, description=help_text + " (first dimension = samples)")
        sub.add_argument("source", type=_existing_path, metavar="IN", help="the file to read")
        sub.add_argument("output", metavar="OUT.beton", help="the file to write, a path or URL (uploaded once complete)")
        sub.add_argument("--name", default="data", help="field name for a file holding a single array (default data)")
        _add_common_options(sub, on_error=False)
        add_remote_flags(sub)
        sub.set_defaults(run=runner)

    table = kinds.add_parser("parquet", help="Parquet files or folders (Hugging Face datasets): one field per column",
                             description="Columns become fields: images (HF Image, or binary image files), ints, "
                                         "floats, fixed-size numeric lists (ndarray), variable-length numeric "
                                         "lists (ragged arrays), bytes, and JSON for the rest. Needs "
                                         "pyarrow (pip install 'beton[parquet]').")
    table.add_argument("sources", nargs="+", type=_existing_path, metavar="IN",
                       help="Parquet files, or folders searched for *.parquet")
    table.add_argument("output", metavar="OUT.beton", help="the file to write, a path or URL (uploaded once complete)")
    table.add_argument("--columns", default=None, metavar="A,B,...",
                       help="the columns to store, in this order (default: all)")
    table.add_argument("--type", action="append", default=[], type=_assignment(COLUMN_KINDS), metavar="COLUMN=KIND",
                       help=f"store a column as KIND ({', '.join(COLUMN_KINDS)}); repeatable")
    _add_image_options(table)
    _add_common_options(table)
    add_remote_flags(table)
    table.set_defaults(run=_parquet)

    shards = kinds.add_parser("webdataset", help="WebDataset tar shards: files grouped by key, one field per "
                                                 "extension",
                              description="Shards are read as streams, one sample at a time. Extensions become "
                                          "fields: images, .cls integers, .json, .txt text, bytes for the rest; "
                                          "the key is stored as __key__.")
    shards.add_argument("sources", nargs="+", metavar="SHARDS",
                        help="tar files, brace patterns (train-{000..009}.tar; quote them) or folders")
    shards.add_argument("output", metavar="OUT.beton", help="the file to write, a path or URL (uploaded once complete)")
    shards.add_argument("--extensions", default=None, metavar="EXT,...",
                        help="the fields, e.g. 'jpg;png,cls' (';' separates alternatives; default: the "
                             "extensions of the first sample)")
    shards.add_argument("--type", action="append", default=[], type=_assignment(EXTENSION_KINDS), metavar="EXT=KIND",
                        help=f"store an extension as KIND ({', '.join(EXTENSION_KINDS)}); repeatable")
    shards.add_argument("--no-key", action="store_true", help="do not store each sample's key (field __key__)")
    _add_file_size_option(shards, "samples with a member")
    _add_image_options(shards)
    _add_common_options(shards)
    add_remote_flags(shards)
    shards.set_defaults(run=_webdataset)
