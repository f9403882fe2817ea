"""Progressive-JPEG scans: where each scan ends, which bytes a fidelity of k scans needs, and the one way
of assembling those bytes into a JPEG a decoder reads (the first k scans and an end marker).

Used by the image field (writing and validating scan tables, the pieces a memory layer reads), by the image
decoders (the prefix to decode) and by the tools that report fidelity. Fidelity ``None`` means every scan.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from beton.codecs.image_record import IMAGE_MODES, MAX_SCANS
from beton.errors import DecodeError, EncodeError, first_bad_record
from beton.pieces import Pieces

__all__ = ["EOI", "jpeg_scan_ends", "check_scan_tables", "scans_read", "scan_bytes", "scan_pieces",
           "progressive_prefix", "whole_jpeg", "scans_to_read", "fidelity_bytes"]

EOI = b"\xff\xd9"  # end-of-image marker
_EOI = np.frombuffer(EOI, np.uint8)


def jpeg_scan_ends(data: bytes) -> list[int]:
    """Byte offset where each scan's entropy-coded data ends (the next marker's position), in order."""
    ends, position = [], 2  # after SOI
    while position + 4 <= len(data):
        if data[position] != 0xFF:
            raise EncodeError(f"JPEG marker expected at byte {position}")
        marker = data[position + 1]
        if marker == 0xD9:  # EOI
            break
        length = int.from_bytes(data[position + 2 : position + 4], "big")
        position += 2 + length
        if marker == 0xDA:  # SOS: entropy-coded data follows until a marker that is not a stuffed 0 or RSTn
            while position + 1 < len(data) and not (
                data[position] == 0xFF and data[position + 1] != 0 and not 0xD0 <= data[position + 1] <= 0xD7
            ):
                position += 1
            ends.append(position)
    return ends


def check_scan_tables(records: np.ndarray, sizes: np.ndarray | None, grouped: bool) -> None:
    """Progressive records: 1..16 scans, whose ends increase, inside the payload; scan-grouped ones also keep
    every scan's bytes inside the sample's allocation (the process cache reads pages from these numbers)."""
    counts = records["num_scans"].astype(np.int64)
    first_bad_record((counts < 1) | (counts > MAX_SCANS), lambda s: (
        f"progressive JPEG has {counts[s]} scans, expected 1..{MAX_SCANS}"))
    columns = int(counts.max(initial=0))  # scans past every record's count are not read: not checked
    ends = records["scan_ends"][:, :columns].astype(np.int64)
    used = np.arange(columns) < counts[:, None]
    lengths = ends.copy()
    np.subtract(ends[:, 1:], ends[:, :-1], out=lengths[:, 1:])
    first_bad_record(np.any(used & (lengths <= 0), axis=1), lambda s: (
        f"progressive JPEG scan ends {ends[s, :counts[s]].tolist()} do not increase"))
    if sizes is None:
        return
    sizes = sizes.astype(np.int64)
    if not grouped:
        last = ends[np.arange(len(ends)), counts - 1]
        first_bad_record(last > sizes, lambda s: (
            f"progressive JPEG's last scan ends at byte {last[s]}, its payload has {sizes[s]}"))
        return
    starts = records["scan_starts"][:, :columns].astype(np.int64)
    first_bad_record(np.any(used & (starts + lengths > sizes[:, None]), axis=1), lambda s: (
        f"scan-grouped JPEG scan starts {starts[s, :counts[s]].tolist()} and ends {ends[s, :counts[s]].tolist()} "
        f"reach past its {sizes[s]}-byte allocation"))


def scans_read(metadata: np.ndarray, limit: int | None) -> np.ndarray:
    """How many scans of each progressive JPEG (data-table records) a fidelity of ``limit`` reads (None: all)."""
    counts = metadata["num_scans"].astype(np.int64)
    return counts if limit is None else np.minimum(counts, limit)


def scan_bytes(metadata: np.ndarray, limit: int | None) -> np.ndarray:
    """Bytes of each progressive JPEG's first ``limit`` scans (None: all of them), from data-table records."""
    return metadata["scan_ends"][np.arange(len(metadata)), scans_read(metadata, limit) - 1].astype(np.int64)


def scans_to_read(loader_fidelity: int | None, decoder_fidelity: int | None) -> int | None:
    """The scans a decoder reads: the loader's fidelity (``Loader.set_fidelity``) overrides the decoder's."""
    return loader_fidelity if loader_fidelity is not None else decoder_fidelity


def scan_pieces(records: np.ndarray, limit: int | None) -> Pieces:
    """Scan-grouped JPEGs (records with ``scan_starts``): the pieces of each allocation that the first ``limit``
    scans occupy, followed by an end marker."""
    columns = int(records["num_scans"].max(initial=0))
    ends = records["scan_ends"][:, :columns].astype(np.int64)
    lengths = np.diff(ends, axis=1, prepend=0)
    lengths[np.arange(columns) >= scans_read(records, limit)[:, None]] = 0
    return Pieces(records["scan_starts"][:, :columns].astype(np.int64), lengths, EOI)


def progressive_prefix(payload: np.ndarray, metadata: np.void, fidelity: int | None, buffer: Any,
                       gathered: bool = False) -> np.ndarray:
    """The bytes a decoder reads for ``fidelity`` scans: the first scans plus an EOI marker.

    ``buffer(nbytes)`` gives a reusable uint8 array to assemble the prefix in. None, or a fidelity at or above
    the number of scans, reads the whole payload. Scan-grouped payloads (``payload`` spans the sample's scans,
    other samples' scans between them) are gathered scan by scan, unless the memory layer already did
    (``gathered``: the payload is then a plain JPEG of the first scans).
    """
    if fidelity is not None and fidelity < 1:
        raise DecodeError(f"fidelity must be at least 1, got {fidelity}")
    scans = int(metadata["num_scans"]) if metadata["mode"] == IMAGE_MODES["progressive"] else 0
    count = scans if fidelity is None else min(fidelity, scans)
    if scans and not gathered and "scan_starts" in metadata.dtype.names:
        return _gather_from_span(payload, metadata, count, buffer)
    if count == 0 or int(metadata["scan_ends"][count - 1]) + len(EOI) >= payload.size:
        return payload  # no fewer scans than the payload holds
    end = int(metadata["scan_ends"][count - 1])
    prefix = buffer(end + len(EOI))
    prefix[:end] = payload[:end]
    prefix[end:] = _EOI
    return prefix


def whole_jpeg(payload: np.ndarray, metadata: np.void) -> np.ndarray:
    """A stored JPEG's bytes, contiguous: the payload itself, or a scan-grouped JPEG's scans gathered into a
    new array with its end marker."""
    return progressive_prefix(payload, metadata, None, lambda nbytes: np.empty(nbytes, np.uint8))


def _gather_from_span(span: np.ndarray, metadata: np.void, count: int, buffer: Any) -> np.ndarray:
    pieces = scan_pieces(metadata.reshape(1), count)
    used = pieces.lengths != 0
    if np.any(pieces.lengths < 0) or np.any(used & (pieces.starts + pieces.lengths > span.size)):
        raise DecodeError(f"scan-grouped JPEG: scan ends {metadata['scan_ends'][:count].tolist()} / starts "
                          f"{pieces.starts[0, :count].tolist()} do not fit its {span.size}-byte allocation")

    def copy(start: int, length: int, destination: np.ndarray) -> None:
        destination[:] = span[start : start + length]

    return pieces.gather(0, copy, buffer(int(pieces.sizes()[0])))


def fidelity_bytes(records: np.ndarray, limit: int | None) -> np.ndarray:
    """Bytes a decoder reads per progressive JPEG at ``limit`` scans: the scans and the end marker, or the
    whole stored JPEG when it holds no more scans than that."""
    whole = scan_bytes(records, None) + len(EOI)
    return whole if limit is None else np.where(records["num_scans"] > limit, scan_bytes(records, limit) +
                                                len(EOI), whole)
