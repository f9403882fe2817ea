"""The ``beton`` command.

    beton info FILE...                   fields with arguments, sizes, image size histogram, metadata
    beton verify FILE...                 every checksum; exit 1 naming the first bad page and sample
    beton index OUT.json SHARD...        a manifest of shards written apart (files, URLs, globs)
    beton merge OUT.beton SHARD...       shards (or a manifest) combined into one file
    beton show FILE [-o GRID.png]        a PNG grid of samples, captioned with class names
    beton convert imagefolder SRC OUT    torchvision-style class folders -> image + label
    beton convert numpy IN.npz OUT       one field per array (same length)
    beton convert torch IN.pt OUT        a dict/tuple of same-length tensors, one field each
    beton convert parquet IN... OUT      Parquet files (Hugging Face datasets), one field per column
    beton convert webdataset SHARDS OUT  WebDataset tar shards, one field per extension
    beton tune IN [-o OUT]               store some images raw so decoding and reading balance here
    beton bench [--quick]                the side-by-side benchmark suite

``info``, ``verify``, ``index`` and ``merge`` read URLs, and ``merge``, ``index`` and ``convert`` write them; their
flags ``--storage-options JSON``, ``--cache-dir DIR``, ``--cache-limit SIZE``, ``--max-in-flight N``, ... (one per
field of :class:`~beton.RemoteOptions`) build the one ``RemoteOptions`` the command passes as ``remote=``.

``info`` and ``verify`` take one file, or a dataset of several: a glob, a manifest file, several of these (as
``Loader`` does); then every shard is opened and checked against the manifest, and they print one line per shard
and the totals (``verify`` goes on past a bad shard and exits 1 naming each; of a manifest with a tables file, it
checks that file and each shard against it as a Loader does).

Exit codes: 0 success (for ``convert``: the file was written; sources left out by ``--on-error skip`` are
listed), 1 the file is invalid or corrupt, or a conversion failed, 2 bad arguments, 141 (quietly) the reader
of the output left (``beton info ... | head``).
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
from beton.dataset.manifest import Manifest
from beton.dataset.shard_tables import tables_of_reader
from beton.dataset.shards import dataset_manifest, names_one_file
from beton.dataset.tables_file import OpenedTables, check_shard_tables, read_tables_file
from beton.errors import BetonError
from beton.storage.reader import Reader
from beton.storage.remote import RemoteOptions
from beton.storage.remote.options import REDIRECT_POLICIES
from beton.storage.verify import VerifyReport, verify, verify_reader
from beton.tools.convert.commands import (add_convert_parser, byte_size, json_object, page_size_argument,
                                         positive_argument)

__all__ = ["main", "describe", "describe_dataset", "build_parser"]


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
        if reader.num_samples:
            lines += [f"      {line}" for line in reader.fields[name].summary(reader.data_table[name])]
    lines += _metadata_lines(reader.metadata)
    return "\n".join(printable(line) for line in lines)


def describe_dataset(manifest: Manifest) -> str:
    """A summary of a dataset of several files: its fields, totals, and one line per shard (each opened and checked
    against the manifest, so a missing or changed shard is named)."""
    shard_lines, size, pages, metadata = [], 0, 0, {}
    for number, shard in enumerate(manifest.shards):
        with manifest.open_shard(number) as reader:
            size += len(reader.file_map)
            pages += reader.num_pages
            metadata = reader.metadata if number == 0 else metadata
            shard_lines.append(f"  {number}: {shard.location}: {shard.num_samples} samples, "
                               f"{_bytes(len(reader.file_map))}, {reader.num_pages} pages")
    lines = [
        f"dataset:     {manifest.source or 'several files'}",
        f"shards:      {len(manifest.shards)}",
        f"samples:     {manifest.num_samples}",
        f"size:        {_bytes(size)} ({size} bytes), {pages} pages",
        f"fields:      {len(manifest.fields)}",
        *[f"  {spec.name!r}: {spec.type_name} {spec.arguments_json}" for spec in manifest.fields],
        *_metadata_lines(metadata),
        "shard list:",
        *shard_lines,
    ]
    return "\n".join(printable(line) for line in lines)


_METADATA_WIDTH = 300  # characters of one metadata value shown; the rest is counted


def _metadata_lines(metadata: dict) -> list[str]:
    if not metadata:
        return ["metadata:    none"]
    lines = [f"metadata:    {len(metadata)} key{'s' if len(metadata) != 1 else ''}"]
    for key, value in metadata.items():
        text = json.dumps(value, ensure_ascii=False)
        if len(text) > _METADATA_WIDTH:
            text = f"{text[:_METADATA_WIDTH]}... ({len(text)} characters)"
        lines.append(f"  {key!r}: {text}")
    return lines


def printable(text: str) -> str:
    """``text`` with control and formatting characters (escape sequences, bidi overrides) shown as escapes."""
    return "".join(
        character if unicodedata.category(character) not in ("Cc", "Cf") else
        character.encode("unicode_escape").decode("ascii") if ord(character) < 0x10000 else f"\\U{ord(character):08x}"
        for character in text
    )


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
    if _names_one_file(arguments.files):
        with Reader(arguments.files[0], remote=arguments.remote) as reader:
            print(describe(reader))
    else:
        print(describe_dataset(_dataset(arguments)))
    return 0


def _verify(arguments: argparse.Namespace) -> int:
    if _names_one_file(arguments.files):
        report = verify(arguments.files[0], remote=arguments.remote)
        if not report.checksummed:
            print(f"OK (structure only: the file has no checksums): {report.path}: {report.num_samples} samples")
            return 0
        print(f"OK: {_checked(report)}")
        return 0
    manifest = _dataset(arguments)
    tables, tables_failed = _tables_file(manifest, arguments.remote)
    failed, samples, pages, checked = [], 0, 0, 0
    for number, shard in enumerate(manifest.shards):
        try:
            with manifest.open_shard(number) as reader:
                report = verify_reader(reader)
                if tables is not None:  # what a Loader compares when it first opens the shard
                    stored = tables_of_reader(reader)[0]
                    check_shard_tables(manifest, number, (stored.data, stored.allocations),
                                       tables.shard_tables(manifest, number))
        except (BetonError, OSError) as error:  # each bad shard is named; the others are still checked
            failed.append(number)
            print(printable(f"FAILED: shard {number}: {' '.join(str(error).split())}"))
            continue
        samples, pages, checked = samples + report.num_samples, pages + report.num_pages, checked + report.bytes_checked
        print(printable(f"OK: shard {number}: {_checked(report)}"))
    if failed or tables_failed:
        shards = (f"{len(failed)} of {len(manifest.shards)} shards failed (shard {', '.join(map(str, failed))})"
                  if failed else "")
        raise BetonError("; ".join(part for part in (shards, tables_failed) if part))
    print(f"OK: {len(manifest.shards)} shards, {samples} samples, {pages} pages, {checked} bytes checked")
    return 0


def _tables_file(manifest: Manifest, remote: RemoteOptions | None) -> tuple[OpenedTables | None, str]:
    """The manifest's tables file, read and checked as a Loader opening the manifest reads it (None where the
    manifest has none), or None and why it failed (printed: a Loader would refuse the manifest)."""
    if manifest.tables is None:
        return None, ""
    try:
        tables = read_tables_file(manifest, manifest.content_checks(False), remote)
    except (BetonError, OSError) as error:  # as for shards: a file this user may not read, ...
        print(printable(f"FAILED: the tables file: {' '.join(str(error).split())}"))
        return None, f"the tables file {manifest.tables.location} failed"
    print(printable(f"OK: the tables file {manifest.tables.location}"))
    return tables, ""


def _checked(report: VerifyReport) -> str:
    return (f"{report.path}: {report.num_samples} samples, {report.num_pages} pages, {report.bytes_checked} bytes "
            "checked (CRC32s and SHA-256 content digests)")


def _names_one_file(files: list[str]) -> bool:
    return len(files) == 1 and names_one_file(files[0])


def _dataset(arguments: argparse.Namespace) -> Manifest:
    return dataset_manifest(arguments.files, remote=arguments.remote, allow_outside=arguments.allow_outside)


def _index(arguments: argparse.Namespace) -> int:
    from beton.dataset.shards import index

    manifest = index(arguments.output, _shards(arguments), verify=arguments.verify, remote=arguments.remote)
    checked = "every page checked" if arguments.verify else "headers and tables checked"
    print(f"wrote {arguments.output}: {len(manifest.shards)} shards, {manifest.num_samples} samples ({checked})")
    if manifest.tables is not None:
        print(f"wrote {manifest.tables.location}: every shard's tables, so that the dataset opens without reading them")
    return 0


def _shards(arguments: argparse.Namespace) -> object:
    """The shards as named, or with --allow-outside the Manifest of manifest files trusted to name shards outside
    their own directories."""
    if not arguments.allow_outside:
        return arguments.shards
    from beton.dataset.shards import dataset_manifest

    return dataset_manifest(arguments.shards, remote=arguments.remote, allow_outside=True)


def _merge(arguments: argparse.Namespace) -> int:
    from beton.dataset.merge import merge

    metadata: object = "shards" if arguments.metadata is None else arguments.metadata  # {} sets none, as None
    if arguments.no_metadata:
        metadata = None
    report = merge(arguments.output, _shards(arguments), page_size=arguments.page_size, metadata=metadata,
                   remote=arguments.remote)
    print(f"wrote {report.path}: {report.num_samples} samples from {len(report.shards)} shards "
          f"({report.seconds:.1f} s)")
    return 0


def _tune(arguments: argparse.Namespace) -> int:
    from beton.tools.tune import tune

    bandwidth = arguments.read_bandwidth * 1e6 if arguments.read_bandwidth is not None else None
    max_bytes = _max_size(arguments.max_size, os.path.getsize(arguments.source))
    profile, plan = tune(arguments.source, arguments.output, field=arguments.field, batch_size=arguments.batch_size,
                         cores=arguments.cores, read_bandwidth=bandwidth, output_size=arguments.output_size,
                         num_workers=arguments.num_workers,
                         progress=arguments.output is not None and not arguments.no_progress,
                         max_bytes=max_bytes)
    source = "given" if bandwidth is not None else "measured"
    print(f"host: {profile.cores} decoding cores; JPEG decode {profile.decode_seconds_per_pixel * 1e9:.2f} ns/pixel "
          f"+ {profile.decode_seconds_per_byte * 1e9:.2f} ns/byte; rest of the pipeline "
          f"{profile.pipeline_seconds_per_image * 1e6:.0f} us/image; read {profile.read_bytes_per_second / 1e6:,.0f} "
          f"MB/s ({source})")
    print(plan.describe())
    if plan.growth > _LARGE_GROWTH and max_bytes is None:
        print(f"note: the balanced file is {plan.growth:.1f} times the size of the source (raw pixels take far more "
              "bytes than JPEGs); --max-size bounds it (e.g. --max-size 2x or --max-size 10GiB)")
    if arguments.output is not None:
        print(f"wrote {arguments.output}: load it with order=OrderOption.BALANCED")
    return 0


_LARGE_GROWTH = 2.0  # a plan that more than doubles the file is pointed out


def _size_bound(text: str) -> tuple[str, float]:
    """--max-size: ("bytes", n) for ``10GiB``, ("times", f) for a multiple of the source's size, ``2x``."""
    if text.strip().lower().endswith("x"):
        try:
            factor = float(text.strip()[:-1])
        except ValueError:
            factor = -1.0
        if factor < 1:
            raise argparse.ArgumentTypeError(f"a multiple of the source's size is at least 1x, got {text!r}")
        return "times", factor
    return "bytes", byte_size(text)


def _max_size(bound: tuple[str, float] | None, source_size: int) -> int | None:
    if bound is None:
        return None
    kind, value = bound
    return int(source_size * value) if kind == "times" else int(value)


def _show(arguments: argparse.Namespace) -> int:
    from beton.tools.show import grid

    output = arguments.output or f"{arguments.file}.png"
    pipelines = _load_pipelines(arguments.pipeline) if arguments.pipeline else None
    indices = [int(i) for i in arguments.indices.split(",") if i] if arguments.indices else None
    picture = grid(arguments.file, output, count=arguments.count, columns=arguments.columns, cell=arguments.cell,
                   image_field=arguments.field, label_field=arguments.label, indices=indices, random=arguments.random,
                   pipelines=pipelines, seed=arguments.seed, epoch=arguments.epoch, order=arguments.order,
                   num_workers=arguments.num_workers)
    print(f"wrote {output} ({picture.shape[1]}x{picture.shape[0]})")
    return 0


def _load_pipelines(spec: str) -> dict:
    """``module:NAME`` or ``path/to/file.py:NAME``: a dict of pipelines, or a callable returning one. The user
    names this code on the command line; nothing a file holds is ever imported."""
    import importlib
    import importlib.util

    location, _, name = spec.rpartition(":")
    if not location or not name:
        raise ValueError(f"--pipeline must be MODULE:NAME or FILE.py:NAME, got {spec!r}")
    if location.endswith(".py"):
        module_spec = importlib.util.spec_from_file_location("beton_show_pipelines", location)
        if module_spec is None or not os.path.isfile(location):
            raise ValueError(f"--pipeline: no file {location!r}")
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
    else:
        module = importlib.import_module(location)
    if not hasattr(module, name):
        raise ValueError(f"--pipeline: {location} has no {name!r}")
    value = getattr(module, name)
    value = value() if callable(value) else value
    if not isinstance(value, dict):
        raise ValueError(f"--pipeline: {spec} is a {type(value).__name__}; expected a dict of pipelines "
                         "(field name -> list of operations) or a function returning one")
    return value


def _bench(arguments: argparse.Namespace) -> int:
    from beton.tools.bench import run_suite

    run_suite(quick=arguments.quick, output_dir=arguments.output)
    return 0


def _existing_path(text: str) -> str:
    if not os.path.exists(text):
        raise argparse.ArgumentTypeError(f"{text!r} does not exist")
    return text


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
    return value


def _seconds(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be a number of seconds >= 0, got {text}")
    return value


def _redirect_policy(text: str) -> str:
    if text not in REDIRECT_POLICIES:
        raise argparse.ArgumentTypeError(f"must be one of {', '.join(REDIRECT_POLICIES)}, got {text}")
    return text


#: The flags that build a command's RemoteOptions: field -> (type, metavar, help). Every field has one
#: (tests/tools/test_cli.py checks), so a setting added to RemoteOptions is added here too.
_REMOTE_FLAGS: dict[str, tuple[object, str, str]] = {
    "storage_options": (json_object, "JSON", "fsspec's options for the store, a JSON object such as "
                                             "'{\"anon\": true}' (credentials stay in the store's usual "
                                             "configuration)"),
    "cache_dir": (str, "DIR", "keep checked pages in this local directory (shared safely by processes)"),
    "cache_limit": (byte_size, "SIZE", "bytes the page cache may hold (200GiB; default: no limit)"),
    "max_in_flight": (positive_argument, "N", "range requests at once (default 8)"),
    "retries": (_non_negative, "N", "further attempts after a transient failure (default 5)"),
    "backoff": (_seconds, "SECONDS", "pause before the first retry, doubled for each further one (default 0.2)"),
    "max_backoff": (_seconds, "SECONDS", "longest pause between retries (default 10)"),
    "timeout": (_seconds, "SECONDS", "seconds one request may take (default 60)"),
    "request_bytes": (byte_size, "SIZE", "consecutive pages fetched in one request up to this size (default 8MiB)"),
    "prefetch_bytes": (byte_size, "SIZE", "pages fetched ahead and held in memory (default 128MiB)"),
    "redirects": (_redirect_policy, "POLICY", "HTTP(S) redirects followed: same-origin (default), any or none"),
}


def _add_allow_outside(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--allow-outside", action="store_true",
                        help="trust the manifests named to list shards outside their own directories (e.g. a "
                             "local manifest of s3:// shards; docs/shards.md)")


def _add_remote_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("files at URLs", "how URLs are read and written (docs/remote.md); local "
                                                       "paths ignore these")
    for name, (kind, metavar, text) in _REMOTE_FLAGS.items():
        group.add_argument("--" + name.replace("_", "-"), dest=f"remote_{name}", type=kind, default=None,
                           metavar=metavar, help=text)
    parser.set_defaults(remote_flags=True)


def _remote_options(arguments: argparse.Namespace) -> RemoteOptions:
    """The RemoteOptions a command's flags build (the defaults for flags not given)."""
    given = {name: getattr(arguments, f"remote_{name}") for name in _REMOTE_FLAGS
             if getattr(arguments, f"remote_{name}", None) is not None}
    return RemoteOptions(**given)


def build_parser() -> argparse.ArgumentParser:
    """The ``beton`` command's argument parser, every command and option with its help text."""
    parser = argparse.ArgumentParser(prog="beton",
                                     description="Inspect, check, convert, tune and benchmark .beton files.")
    parser.add_argument("--version", action="version", version=f"beton {__version__}")
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    info = commands.add_parser("info", help="describe a file or dataset: samples, pages, fields and their arguments")
    check = commands.add_parser("verify", help="check every checksum; exit 1 naming the first bad page/sample")
    for command, run in ((info, _info), (check, _verify)):
        command.add_argument("files", nargs="+", metavar="FILE",
                             help="a .beton (or FFCV) file, a path or URL; or a dataset: globs, manifest files, "
                                  "several files (each shard is described or checked, then the totals)")
        _add_allow_outside(command)
        _add_remote_flags(command)
        command.set_defaults(run=run)

    indexing = commands.add_parser("index", help="write a manifest of shards written apart",
                                   description="List shards (beton files written apart, e.g. with "
                                               "from_indexed_dataset(shard=(k, n))) in a manifest: their order, "
                                               "sample counts, header hashes and fields, which must agree. Beside "
                                               "OUT.json (a path or URL) it also writes OUT.tables, every shard's "
                                               "tables in one file, so that the dataset opens without reading its "
                                               "shards.")
    indexing.add_argument("output", metavar="OUT.json", help="the manifest to write (a path or URL ending in .json)")
    indexing.add_argument("shards", nargs="+", metavar="SHARD",
                          help="shards in order: paths, URLs, globs (sorted by name) or manifests")
    indexing.add_argument("--verify", action="store_true", help="check every page of every shard too")
    _add_allow_outside(indexing)
    _add_remote_flags(indexing)
    indexing.set_defaults(run=_index)

    merging = commands.add_parser("merge", help="combine shards (or a manifest's) into one file",
                                  description="Copy the shards' samples, in order, into one beton file (payloads "
                                              "copied, not encoded again; pages laid out anew).")
    merging.add_argument("output", metavar="OUT.beton", help="the file to write, a path or URL (uploaded once complete)")
    merging.add_argument("shards", nargs="+", metavar="SHARD",
                         help="shards in order: paths, URLs, globs (sorted by name) or manifests")
    merging.add_argument("--page-size", type=page_size_argument, default=None, metavar="BYTES",
                         help="the merged file's page size (default: the first shard's)")
    choice = merging.add_mutually_exclusive_group()
    choice.add_argument("--metadata", type=json_object, default=None, metavar="JSON",
                        help="the merged file's metadata, a JSON object such as '{\"name\": \"train\"}' "
                             "(default: the shards', which must agree)")
    choice.add_argument("--no-metadata", action="store_true", help="write no file-level metadata")
    _add_allow_outside(merging)
    _add_remote_flags(merging)
    merging.set_defaults(run=_merge)

    add_convert_parser(commands, escape=printable, add_remote_flags=_add_remote_flags)

    show = commands.add_parser("show", help="write a PNG grid of samples, captioned with their labels",
                               description="Look at a file's images before training: as stored, or through the "
                                           "pipelines training uses (--pipeline), exactly as the loader gives them.")
    show.add_argument("file", type=_existing_path, metavar="FILE", help="the .beton file")
    show.add_argument("-o", "--output", default=None, metavar="GRID.png", help="where to write (default FILE.png)")
    show.add_argument("--count", type=positive_argument, default=32, help="images to show (default 32)")
    show.add_argument("--columns", type=positive_argument, default=8, help="images per row (default 8)")
    show.add_argument("--cell", type=positive_argument, default=160, metavar="PX",
                      help="cell size for stored images (default 160; loader batches keep their size)")
    show.add_argument("--field", default=None, help="the image field (default: the only one)")
    show.add_argument("--label", default=None,
                      help="the label field for captions (default: the one with class names in the metadata)")
    show.add_argument("--indices", default=None, metavar="I,J,...", help="which samples (default: the first)")
    show.add_argument("--random", action="store_true", help="stored images: random samples, drawn with --seed")
    show.add_argument("--pipeline", default=None, metavar="MODULE:NAME",
                      help="show the loader's first batch through these pipelines: a dict (field -> operations) "
                           "or a function returning one, in a module or FILE.py")
    show.add_argument("--seed", type=int, default=0, help="the loader's seed, or the random draw's (default 0)")
    show.add_argument("--epoch", type=int, default=0, help="--pipeline: the epoch whose first batch to show")
    show.add_argument("--order", choices=("sequential", "random", "quasi_random"), default="random",
                      help="--pipeline: the loader's order (default random)")
    show.add_argument("--num-workers", type=int, default=1, help="--pipeline: loader threads (default 1)")
    show.set_defaults(run=_show)

    tuning = commands.add_parser("tune", help="store some images raw so decoding and reading balance on this host")
    tuning.add_argument("source", type=_existing_path, metavar="IN.beton", help="the file to plan for")
    tuning.add_argument("-o", "--output", default=None, metavar="OUT.beton", help="write the balanced file")
    tuning.add_argument("--field", default=None, help="the image field (default: the only one)")
    tuning.add_argument("--batch-size", type=positive_argument, default=64, help="same raw count in every batch of this size")
    tuning.add_argument("--cores", type=positive_argument, default=None, help="decoding threads (default: usable cores)")
    tuning.add_argument("--read-bandwidth", type=float, default=None, metavar="MB/S",
                        help="plan for this read rate instead of measuring the file's storage")
    tuning.add_argument("--output-size", type=positive_argument, default=224, help="the crop decoders' output side")
    tuning.add_argument("--max-size", type=_size_bound, default=None, metavar="SIZE",
                        help="bound the balanced file's size: bytes (10GiB, 500MB) or a multiple of the source's "
                             "(2x); the plan is the best mix that fits")
    tuning.add_argument("--num-workers", type=int, default=-1,
                        help="processes writing the balanced file (default -1: every usable core)")
    tuning.add_argument("--no-progress", action="store_true", help="no progress bar while writing")
    tuning.set_defaults(run=_tune)

    bench = commands.add_parser("bench", help="run the side-by-side benchmark suite")
    bench.add_argument("--quick", action="store_true", help="small datasets: under 3 minutes")
    bench.add_argument("--output", default=None, help="directory for results.json, results.md, results.png")
    bench.set_defaults(run=_bench)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    arguments = parser.parse_args(argv)
    if getattr(arguments, "remote_flags", False):
        try:
            arguments.remote = _remote_options(arguments)
        except ValueError as error:  # settings that disagree (RemoteOptions checks them): bad arguments, exit 2
            parser.error(f"{arguments.command}: {error}")
    try:
        return arguments.run(arguments)
    except BrokenPipeError:  # the reader of the output left (`beton info ... | head`): nothing is wrong to report
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the flush at exit has nowhere to fail
        return 141  # a shell's status for a process ended by SIGPIPE
    except (BetonError, OSError, ValueError) as error:
        if arguments.debug:
            traceback.print_exc()
        message = " ".join(str(error).split())  # one line, whatever the message holds
        print(printable(f"beton {arguments.command}: error: {message}"), file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
