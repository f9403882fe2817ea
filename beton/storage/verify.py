"""verify(path): check every checksum and content digest of a .beton file, pages included, and say where the first
fault is."""

from __future__ import annotations

import dataclasses
import os
import zlib
import numpy as np

from beton.errors import CorruptDataError, error_context, locate
from beton.fields.base import Field
from beton.storage.digests import digest
from beton.storage.reader import Reader
from beton.storage.remote import RemoteOptions

__all__ = ["verify", "verify_reader", "page_error", "VerifyReport"]


@dataclasses.dataclass(frozen=True)
class VerifyReport:
    """What :func:`verify` checked."""

    path: str
    num_samples: int
    num_pages: int
    bytes_checked: int
    #: False for FFCV files, which have neither checksums nor digests: only their structure could be checked.
    #: True: every page and table matched its CRC32 and its SHA-256 digest.
    checksummed: bool = True


def verify(path: str | os.PathLike[str], custom_fields: dict[str, type[Field]] | None = None, *,
           remote: RemoteOptions | None = None) -> VerifyReport:
    """Check the header, every table and every page of a file against their stored CRC32 and SHA-256 digests
    (an FFCV file, which has neither, only for its structure: :attr:`VerifyReport.checksummed`).

    ``path`` may be a URL, read as ``remote`` says (the arguments as for :class:`~beton.Reader`): every page is
    fetched and checked.

    Returns a :class:`VerifyReport` when everything matches. Raises :class:`~beton.errors.FormatError` (from
    opening, or for a record its field cannot read, such as an array payload of the wrong size) or
    :class:`~beton.errors.CorruptDataError` naming the first bad page and the samples with payload bytes on it (a
    page has one CRC32 and one digest, so the damaged one cannot be told from the others on its page).
    """
    with Reader(path, custom_fields=custom_fields, remote=remote) as reader:
        return verify_reader(reader)


def verify_reader(reader: Reader) -> VerifyReport:
    """:func:`verify` of a file already opened (opening checked the header and tables' CRC32s): its payloads against
    their fields, its tables against their digests, and every page against its CRC32 and digest."""
    with error_context(path=reader.path):
        reader.check_payloads()  # checksums prove nothing against whoever can recompute them
        if not reader.checksummed:
            return VerifyReport(reader.path, reader.num_samples, 0, 0, checksummed=False)
        digests = reader.page_digests
        reader.check_table_digests()
        if reader.remote is not None:  # fetch ahead, several pages at once, while the pages are checked in order
            reader.remote.pages.will_read(np.arange(reader.num_pages))
        for page in range(reader.num_pages):
            start, end = reader.page_bounds(page)
            data = reader.file_map[start:end]
            if zlib.crc32(data) != int(reader.page_checksums[page]):
                raise page_error(reader, page, start, end)
            if digest(data) != digests[page].tobytes():
                raise page_error(reader, page, start, end, "content digest")
        return VerifyReport(reader.path, reader.num_samples, reader.num_pages, len(reader.file_map))


_SAMPLES_LISTED = 8  # samples a page error names one by one; beyond, it names runs (at most this many) and a count


def page_error(reader: Reader, page: int, start: int, end: int, what: str = "checksum") -> CorruptDataError:
    """The error for a bad page (its ``what`` does not match), naming every sample with payload bytes on it (and
    their fields): one CRC32 or digest covers the whole page, so any of them may hold the damaged byte. ``sample``
    and ``field`` are set only when the page holds a single one."""
    table = reader.allocation_table
    samples = columns = np.zeros(0, np.int64)
    if table.size:
        offsets = table["offset"].astype(np.int64)
        touches = (offsets < end) & (offsets + table["size"].astype(np.int64) > start)
        samples = np.flatnonzero(touches.any(axis=1))
        columns = np.flatnonzero(touches.any(axis=0))
    fields = [reader.field_of_column(int(column)) for column in columns]
    if samples.size:
        held = (f"it holds payload bytes of {_samples_text(samples)} in {'field' if len(fields) == 1 else 'fields'} "
                f"{', '.join(map(repr, fields))}, one or more of them damaged: write the file again from its source")
    else:
        held = "it holds no payload bytes (the damage lies between payloads)"
    error = CorruptDataError(f"{what} of heap page {page} (offsets {start}..{end}) does not match; {held}")
    return locate(error, page=page, sample=int(samples[0]) if samples.size == 1 else None,
                  field=fields[0] if len(fields) == 1 else None)


def _samples_text(samples: np.ndarray) -> str:
    """``sample 4``, ``samples 3, 4 and 9`` or, past a few, their runs: ``samples 0..99, 120..180 (162 samples)``."""
    if samples.size == 1:
        return f"sample {int(samples[0])}"
    if samples.size <= _SAMPLES_LISTED:
        listed = [str(int(sample)) for sample in samples]
        return f"samples {', '.join(listed[:-1])} and {listed[-1]}"
    breaks = np.flatnonzero(np.diff(samples) != 1) + 1
    firsts, lasts = samples[np.r_[0, breaks]], samples[np.r_[breaks - 1, samples.size - 1]]
    runs = [f"{int(first)}..{int(last)}" if last > first else str(int(first))
            for first, last in zip(firsts[:_SAMPLES_LISTED], lasts[:_SAMPLES_LISTED])]
    more = ", ..." if firsts.size > _SAMPLES_LISTED else ""
    return f"samples {', '.join(runs)}{more} ({samples.size} samples)"
