"""The ``beton`` command.

    beton info FILE                      fields with arguments, sizes, image size histogram
    beton verify FILE                    every checksum; exit 1 naming the first bad page and sample
    beton convert imagefolder SRC OUT    torchvision-style class folders -> image + label
    beton convert numpy IN.npz OUT       one field per array (same length)
    beton convert torch IN.pt OUT        a dict/tuple of same-length tensors, one field each
    beton bench [--quick]                the side-by-side benchmark suite

Exit codes: 0 success, 1 the file is invalid or corrupt (or a conversion failed), 2 bad arguments.
Errors print as one line; ``--debug`` adds the traceback. Text taken from a file (names, arguments) is printed
with control and formatting characters escaped, so a crafted file cannot drive the terminal.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
import unicodedata
from collections.abc import Sequence

import numpy as np

from beton._version import __version__
from beton.errors import BetonError
from beton.codecs.image_record import IMAGE_MODES
from beton.codecs.jpeg_scans import fidelity_bytes
from beton.fields.ragged import RaggedArrayField
from beton.fields.rgb_image import WRITE_MODES, RGBImageField
from beton.storage.reader import Reader
from beton.storage.verify import verify

__all__ = ["main", "describe"]


def describe(reader: Reader) -> str:
    """A human-readable summary of a file: layout, fields with their arguments, payload sizes."""
    file_size = len(reader.file_map)
    lines = [
        f"file:        {reader.path}",
        f"format:      {reader.format}",
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
            pieces = reader.fields[name].read_pieces(reader.data_table[name], None)
            if pieces is not None:  # stored in pieces (scan-grouped): allocations overlap
                sizes = pieces.read_bytes()
            lines.append(
                f"      payload bytes: mean {float(np.mean(sizes)):.1f}, min {int(sizes.min())}, "
                f"max {int(sizes.max())}, total {_bytes(int(sizes.sum()))}"
            )
        if isinstance(reader.fields[name], RGBImageField) and reader.num_samples:
            lines += _image_summary(reader.data_table[name])
        if isinstance(reader.fields[name], RaggedArrayField) and reader.num_samples:
            lengths = reader.data_table[name]["length"]
            lines.append(f"      lengths (rows): min {int(lengths.min())}, median {float(np.median(lengths)):g}, "
                         f"99th percentile {float(np.percentile(lengths, 99)):g}, max {int(lengths.max())}")
    return "\n".join(printable(line) for line in lines)


def printable(text: str) -> str:
    """``text`` with control and formatting characters (escape sequences, bidi overrides) shown as escapes."""
    return "".join(
        character if unicodedata.category(character) not in ("Cc", "Cf") else
        character.encode("unicode_escape").decode("ascii") if ord(character) < 0x10000 else f"\\U{ord(character):08x}"
        for character in text
    )


_SIZE_BINS = (0, 64, 128, 256, 512, 1024, 2048, 4096)


def _image_summary(metadata: np.ndarray) -> list[str]:
    heights, widths = metadata["height"].astype(np.int64), metadata["width"].astype(np.int64)
    longer = np.maximum(heights, widths)
    counts = np.histogram(longer, bins=[*_SIZE_BINS, np.iinfo(np.int64).max])[0]
    bins = [f"{low}-{high - 1}" for low, high in zip(_SIZE_BINS, _SIZE_BINS[1:])] + [f">={_SIZE_BINS[-1]}"]
    histogram = ", ".join(f"{label}: {count}" for label, count in zip(bins, counts) if count)
    modes = ", ".join(f"{np.mean(metadata['mode'] == number):.0%} {name}" for name, number in IMAGE_MODES.items()
                      if np.any(metadata["mode"] == number))
    lines = _fidelity_lines(metadata) if "scan_ends" in (metadata.dtype.names or ()) else []
    return lines + [
        f"      images: height {int(heights.min())}..{int(heights.max())} (median {int(np.median(heights))}), "
        f"width {int(widths.min())}..{int(widths.max())} (median {int(np.median(widths))}), "
        f"stored as {modes}",
        f"      longer side histogram: {histogram}",
    ]


def _fidelity_lines(metadata: np.ndarray) -> list[str]:
    """Mean bytes read per image at each progressive-JPEG fidelity, and the I/O saved against all scans."""
    full = fidelity_bytes(metadata, None).mean()
    lines = ["      progressive fidelity (scans read: mean bytes per image, predicted I/O speed-up):"]
    for k in range(1, int(metadata["num_scans"].max()) + 1):
        read = fidelity_bytes(metadata, k).mean()
        lines.append(f"        {k:2d}: {read:10.1f} B  x{full / read:.2f}")
    return lines


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
    if not report.checksummed:
        print(f"OK (structure only: the file has no checksums): {report.path}: {report.num_samples} samples")
        return 0
    print(f"OK: {report.path}: {report.num_samples} samples, {report.num_pages} pages, "
          f"{report.bytes_checked} bytes checked")
    return 0


def _convert_imagefolder(arguments: argparse.Namespace) -> int:
    from beton.tools.convert import convert_image_folder

    dataset = convert_image_folder(arguments.source, arguments.output, write_mode=arguments.write_mode,
                                   max_resolution=arguments.max_resolution, jpeg_quality=arguments.jpeg_quality,
                                   num_workers=arguments.num_workers)
    print(f"wrote {len(dataset)} images of {len(dataset.classes)} classes to {arguments.output}")
    print("labels: " + ", ".join(f"{label}={name}" for label, name in enumerate(dataset.classes)))
    return 0


def _convert_numpy(arguments: argparse.Namespace) -> int:
    from beton.tools.convert import convert_arrays

    with np.load(arguments.source, allow_pickle=False) as loaded:
        arrays = {arguments.name: loaded} if isinstance(loaded, np.ndarray) else {k: loaded[k] for k in loaded.files}
    convert_arrays(arrays, arguments.output, num_workers=arguments.num_workers)
    print(f"wrote fields {list(arrays)} to {arguments.output}")
    return 0


def _convert_torch(arguments: argparse.Namespace) -> int:
    import torch

    from beton.tools.convert import convert_arrays

    loaded = torch.load(arguments.source, map_location="cpu", weights_only=True)
    if isinstance(loaded, torch.Tensor):
        arrays = {arguments.name: loaded}
    elif isinstance(loaded, dict):
        arrays = dict(loaded)
    elif isinstance(loaded, (list, tuple)):
        arrays = {f"f{index}": tensor for index, tensor in enumerate(loaded)}
    else:
        raise BetonError(f"{arguments.source!r} holds a {type(loaded).__name__}; expected tensors in a dict, "
                         "list or tuple")
    convert_arrays(arrays, arguments.output, num_workers=arguments.num_workers)
    print(f"wrote fields {list(arrays)} to {arguments.output}")
    return 0


def _tune(arguments: argparse.Namespace) -> int:
    from beton.tools.tune import tune

    bandwidth = arguments.read_bandwidth * 1e6 if arguments.read_bandwidth is not None else None
    profile, plan = tune(arguments.source, arguments.output, field=arguments.field, batch_size=arguments.batch_size,
                         cores=arguments.cores, read_bandwidth=bandwidth, output_size=arguments.output_size,
                         num_workers=arguments.num_workers, progress=arguments.output is not None)
    source = "given" if bandwidth is not None else "measured"
    print(f"host: {profile.cores} decoding cores; JPEG decode {profile.decode_seconds_per_pixel * 1e9:.2f} ns/pixel "
          f"+ {profile.decode_seconds_per_byte * 1e9:.2f} ns/byte; rest of the pipeline "
          f"{profile.pipeline_seconds_per_image * 1e6:.0f} us/image; read {profile.read_bytes_per_second / 1e6:,.0f} "
          f"MB/s ({source})")
    print(plan.describe())
    if arguments.output is not None:
        print(f"wrote {arguments.output}: load it with order=OrderOption.BALANCED")
    return 0


def _bench(arguments: argparse.Namespace) -> int:
    from beton.tools.bench import run_suite

    run_suite(quick=arguments.quick, output_dir=arguments.output)
    return 0


def _existing_path(text: str) -> str:
    if not os.path.exists(text):
        raise argparse.ArgumentTypeError(f"{text!r} does not exist")
    return text


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="beton",
                                     description="Inspect, check, convert, tune and benchmark .beton files.")
    parser.add_argument("--version", action="version", version=f"beton {__version__}")
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    info = commands.add_parser("info", help="describe a file: samples, pages, fields and their arguments")
    info.add_argument("file")
    info.set_defaults(run=_info)
    check = commands.add_parser("verify", help="check every checksum; exit 1 naming the first bad page/sample")
    check.add_argument("file")
    check.set_defaults(run=_verify)

    convert = commands.add_parser("convert", help="write a .beton file from another layout")
    kinds = convert.add_subparsers(dest="kind", required=True, metavar="KIND")
    folder = kinds.add_parser("imagefolder", help="class folders of images (labels from folder names)")
    folder.add_argument("source", type=_existing_path, metavar="SRC_DIR")
    folder.add_argument("output", metavar="OUT.beton")
    folder.add_argument("--max-resolution", type=_positive, default=None)
    folder.add_argument("--write-mode", choices=WRITE_MODES, default="jpg")
    folder.add_argument("--jpeg-quality", type=_quality, default=90)
    folder.set_defaults(run=_convert_imagefolder)
    for name, runner, help_text in (("numpy", _convert_numpy, ".npy or .npz: one field per array"),
                                    ("torch", _convert_torch, ".pt: a tensor, or a dict/list of tensors")):
        sub = kinds.add_parser(name, help=help_text)
        sub.add_argument("source", type=_existing_path, metavar="IN")
        sub.add_argument("output", metavar="OUT.beton")
        sub.add_argument("--name", default="data", help="field name for a single array")
        sub.set_defaults(run=runner)
    for sub in kinds.choices.values():
        sub.add_argument("--num-workers", type=int, default=-1)

    tuning = commands.add_parser("tune", help="store some images raw so decoding and reading balance on this host")
    tuning.add_argument("source", type=_existing_path, metavar="IN.beton")
    tuning.add_argument("-o", "--output", default=None, metavar="OUT.beton", help="write the balanced file")
    tuning.add_argument("--field", default=None, help="the image field (default: the only one)")
    tuning.add_argument("--batch-size", type=_positive, default=64, help="same raw count in every batch of this size")
    tuning.add_argument("--cores", type=_positive, default=None, help="decoding threads (default: usable cores)")
    tuning.add_argument("--read-bandwidth", type=float, default=None, metavar="MB/S",
                        help="plan for this read rate instead of measuring the file's storage")
    tuning.add_argument("--output-size", type=_positive, default=224, help="the crop decoders' output side")
    tuning.add_argument("--num-workers", type=int, default=-1)
    tuning.set_defaults(run=_tune)

    bench = commands.add_parser("bench", help="run the side-by-side benchmark suite")
    bench.add_argument("--quick", action="store_true", help="small datasets: under 3 minutes")
    bench.add_argument("--output", default=None, help="directory for results.json, results.md, results.png")
    bench.set_defaults(run=_bench)
    return parser


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def _quality(text: str) -> int:
    value = int(text)
    if not 1 <= value <= 100:
        raise argparse.ArgumentTypeError(f"must lie in 1..100, got {text}")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    arguments = _parser().parse_args(argv)
    try:
        return arguments.run(arguments)
    except (BetonError, OSError, ValueError) as error:
        if arguments.debug:
            traceback.print_exc()
        message = " ".join(str(error).split())  # one line, whatever the message holds
        print(printable(f"beton {arguments.command}: error: {message}"), file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
