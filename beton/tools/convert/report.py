"""Running a conversion and reporting it: what was written, which sources were skipped and why, how fast.

Every converter ends in :func:`write`: it writes the samples with a :class:`~beton.storage.writer.DatasetWriter`
(encoding, and so the image checks, in its worker processes), names each problem by its source (a file, a
Parquet row, a tar member) instead of a sample number, and returns a :class:`ConversionReport`.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from beton._version import __version__
from beton.errors import BetonError, DatasetError, EncodeError, WriterError
from beton.fields.base import Field
from beton.storage import format as fmt
from beton.storage.writer import ON_ERROR, DatasetWriter, sample_problem
from beton.storage.remote.options import RemoteOptions

__all__ = ["ConversionError", "ConversionWarning", "ConversionReport", "SkippedSource", "write", "base_metadata",
           "DEFAULT_MAX_FILE_BYTES", "check_max_file_bytes"]

#: The largest source file (an image folder's file, a tar shard's member) converters read unless told otherwise
#: (``max_file_bytes``): a size is checked before the bytes are read, so a file or member declaring more costs
#: nothing. 256 MiB holds any compressed image within the pixel cap and raw 8-bit RGB images of 89 million
#: pixels; raise it for bigger files (a raw 2^27-pixel RGB image is 384 MiB).
DEFAULT_MAX_FILE_BYTES = 1 << 28


_CLASSES_SHOWN = 20  # class names the summary lists; the metadata keeps all


class ConversionWarning(UserWarning):
    """Something about a conversion's input the user should know, which did not stop it (an empty class folder
    kept as a label under on_error="skip"); the report's notes say it too."""


class ConversionError(BetonError, ValueError):
    """A conversion's input cannot be converted as asked: no images, an empty class, a bad source file (with
    ``on_error="fail"``), every sample skipped."""


@dataclasses.dataclass(frozen=True)
class SkippedSource:
    """A source left out of the file (``on_error="skip"``): which one, and why."""

    source: str
    reason: str


@dataclasses.dataclass(frozen=True)
class ConversionReport:
    """What a conversion wrote and left out.

    ``notes`` are things the user should know that did not stop a sample (alpha channels dropped, empty
    classes kept in the class list, files ignored); ``skipped`` names every source left out, with the reason.
    """

    output: str
    num_samples: int
    fields: dict[str, str]
    metadata: dict[str, Any]
    skipped: tuple[SkippedSource, ...]
    notes: tuple[str, ...]
    seconds: float
    output_bytes: int

    @property
    def samples_per_second(self) -> float:
        return self.num_samples / self.seconds if self.seconds > 0 else float("inf")

    def summary(self) -> str:
        """The lines ``beton convert`` prints, as one text."""
        return "\n".join(self.lines())

    def lines(self) -> list[str]:
        """The summary's lines, each without its line break (a source's name may hold any character: whoever
        prints to a terminal escapes each line, never the joined text, whose line breaks would be escaped too)."""
        rate = f"{self.samples_per_second:,.0f} samples/s, {self.output_bytes / self.seconds / 1e6:,.1f} MB/s " \
               "written" if self.seconds > 0 else "instant"
        lines = [f"wrote {self.num_samples} samples ({_size(self.output_bytes)}) to {self.output} in "
                 f"{self.seconds:.1f} s ({rate})",
                 "fields: " + ", ".join(f"{name} {kind}" for name, kind in self.fields.items())]
        classes = self.metadata.get("classes")
        for field, names in classes.items() if isinstance(classes, dict) else ():
            shown = ", ".join(f"{label}={name}" for label, name in enumerate(names[:_CLASSES_SHOWN]))
            more = f", ... ({len(names)} classes)" if len(names) > _CLASSES_SHOWN else ""
            lines.append(f"classes of {field!r}: {shown}{more}")
        lines += [f"note: {note}" for note in self.notes]
        if self.skipped:
            lines.append("skipped:")
            lines += [f"  {item.source}: {item.reason}" for item in self.skipped]
            lines.append(f"skipped {len(self.skipped)} of {len(self.skipped) + self.num_samples} sources "
                         f"({self.num_samples} written)")
        return lines

    def to_json(self) -> dict[str, Any]:
        return {"output": self.output, "num_samples": self.num_samples, "fields": self.fields,
                "skipped": [dataclasses.asdict(item) for item in self.skipped], "notes": list(self.notes),
                "seconds": self.seconds, "output_bytes": self.output_bytes}


def check_max_file_bytes(value: int | None) -> int | None:
    """``max_file_bytes`` as given, if it is a positive number of bytes or None (no cap)."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ConversionError(f"max_file_bytes must be a positive number of bytes or None, got {value!r}")
    return value


def base_metadata(source_format: str, source: Mapping[str, Any], classes: Mapping[str, list[str]] | None,
                  user: Mapping[str, Any] | None) -> dict[str, Any]:
    """The metadata a converter stores: class names per label field, where the samples came from, and which
    beton wrote them; the user's own keys win."""
    metadata: dict[str, Any] = {}
    if classes:
        metadata["classes"] = {name: list(names) for name, names in classes.items()}
    metadata["source"] = {"format": source_format, **source}
    metadata["converted_by"] = f"beton {__version__}"
    metadata.update(user or {})
    return metadata


def write(output: str | os.PathLike[str], fields: Mapping[str, Field], samples: Any, *, indexed: bool,
          source_name: Callable[[int], str], metadata: Mapping[str, Any], on_error: str = "fail",
          length: int | None = None, skipped_before: Iterable[SkippedSource] = (), notes: Iterable[str] = (),
          num_workers: int = -1, page_size: int = fmt.DEFAULT_PAGE_SIZE, progress: bool = True,
          chunksize: int = 100, remote: RemoteOptions | None = None) -> ConversionReport:
    """Write ``samples`` (an indexed dataset when ``indexed``, else an iterable) and report it.

    ``source_name(i)`` names sample i's source (its index in the dataset, or its position in the iterable);
    ``skipped_before`` are sources the converter itself left out before they became samples (in the order met;
    the converter raises ConversionError if it skips every source before any becomes a sample). With
    ``on_error="fail"`` the first bad source raises :class:`ConversionError` naming it, as does skipping every
    source with ``on_error="skip"``; the target file is then left as it was.
    """
    if on_error not in ON_ERROR:
        raise ValueError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")
    output = os.fspath(output)
    start = time.perf_counter()
    writer = DatasetWriter(output, fields, num_workers=num_workers, page_size=page_size, progress=progress,
                           metadata=metadata, on_error=on_error, remote=remote)
    try:
        if indexed:
            result = writer.from_indexed_dataset(samples, chunksize=chunksize)
        else:
            result = writer.from_iterable(samples, length=length, chunksize=chunksize)
    except (DatasetError, EncodeError) as error:
        if isinstance(error.__cause__, ConversionError):  # the converter's own, already naming the source
            raise error.__cause__.with_traceback(error.__cause__.__traceback__) from None
        if error.sample is None:
            raise
        raise ConversionError(f"{source_name(error.sample)}: {sample_problem(error.sample, error).describe()} "
                              "(on_error='skip', --on-error skip, leaves such sources out)") from error
    except WriterError as error:
        if not getattr(error, "skipped", None):
            raise
        first = error.skipped[0]
        raise ConversionError(f"every source was skipped ({len(error.skipped)} plus {len(list(skipped_before))} "
                              f"before encoding); {output} is left as it was; the first: "
                              f"{source_name(first.index)}: {first.describe()}") from error
    skipped = list(skipped_before) + [SkippedSource(source_name(p.index), p.describe()) for p in result.skipped]
    counted = collections.Counter(problem.message for problem in result.warnings)
    notes = list(notes) + [f"{count} sample{'s' if count != 1 else ''} {message}" for message, count in counted.items()]
    seconds = time.perf_counter() - start
    return ConversionReport(output, result.num_samples, {name: field.describe() for name, field in fields.items()},
                            dict(metadata), tuple(skipped), tuple(notes), seconds, result.size)


def _size(count: int) -> str:
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.1f} {unit}" if unit != "B" else f"{count} B"
        value /= 1024
    return f"{count} B"
