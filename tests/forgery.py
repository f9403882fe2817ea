"""Forging a file so that its CRC32 checksums still match: what content digests must catch (tests and
benchmarks/fuzz.py)."""

from __future__ import annotations

import zlib


def forge_keeping_crc32(data: bytearray, start: int, end: int, changes: dict[int, bytes], free: int) -> None:
    """Change the bytes ``changes`` says (absolute offset -> new bytes) within ``data[start:end]``, then choose the
    4 bytes at ``free`` so that the region's CRC32 is what it was: CRC32 is affine over GF(2), so the effect of
    those 32 bits on it is a 32x32 linear map, solved here by Gaussian elimination."""
    wanted = zlib.crc32(data[start:end])
    for offset, new in changes.items():
        data[offset : offset + len(new)] = new
    data[free : free + 4] = bytes(4)
    base = zlib.crc32(data[start:end])
    columns = []  # what flipping each of the 32 free bits does to the CRC32
    for bit in range(32):
        data[free + bit // 8] ^= 1 << (bit % 8)
        columns.append(zlib.crc32(data[start:end]) ^ base)
        data[free + bit // 8] ^= 1 << (bit % 8)
    rows = [(columns[bit], 1 << bit) for bit in range(32)]  # (effect, bits of the patch producing it)
    basis: dict[int, tuple[int, int]] = {}  # highest set bit of an effect -> that effect
    for effect, patch in rows:
        while effect:
            top = effect.bit_length() - 1
            if top not in basis:
                basis[top] = (effect, patch)
                break
            effect, patch = effect ^ basis[top][0], patch ^ basis[top][1]
    target, patch = base ^ wanted, 0
    while target:
        top = target.bit_length() - 1
        target, patch = target ^ basis[top][0], patch ^ basis[top][1]
    data[free : free + 4] = patch.to_bytes(4, "little")
    assert zlib.crc32(data[start:end]) == wanted


def resign_digests(content: bytearray, header) -> None:
    """Lay out a file's digest table again after its last other table, for the heap and tables that ``header`` (a
    HEADER_DTYPE record, changed in place) points to: the digests an attacker who edits a file recomputes (only a
    pin of the header, such as a manifest's hash, tells the result from the original)."""
    from beton.storage import format as fmt
    from beton.storage.digests import digest

    page_size, heap_end = int(header["page_size"]), fmt.HEAP_OFFSET + int(header["heap_size"])
    pages = [digest(content[start : min(start + page_size, heap_end)])
             for start in range(fmt.HEAP_OFFSET, heap_end, page_size)]
    tables = [digest(content[int(header[name]["offset"]) :][: int(header[name]["size"])])
              for name in fmt.DIGESTED_TABLES]
    table = b"".join(pages + tables)
    content += bytes(-len(content) % 64)
    header["digest_table"]["offset"], header["digest_table"]["size"] = len(content), len(table)
    header["digest_table"]["crc32"] = zlib.crc32(table)
    header["content_digest"] = digest(table)
    content += table
