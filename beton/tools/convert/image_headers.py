"""An image file's width and height, read from its header before anything is decoded.

A file may declare any size: a 2.6 MB PNG can claim 30000 x 30000 pixels, and a decoder allocates what the
header claims (5.4 GB) before it finds the data short. Converters therefore read the size here, with a few
``struct`` reads into the bytes they already hold, and compare it with their pixel cap; only then do they decode.
Nothing here allocates more than the header's few fields, and every read is bounds-checked: a header that
cannot be parsed is an :class:`~beton.errors.EncodeError` saying so ("PNG header cannot be read: ..."), never a
guess.

==========  ==========================================================================================
format      where the size is
==========  ==========================================================================================
PNG         the IHDR chunk, which must come first; its CRC must match (a forged size fails it)
GIF         the logical screen and the first image descriptor (a frame may reach past the screen)
BMP         the info header: 16-bit sizes (OS/2, 12 bytes), else 32-bit (height negative when top-down)
WebP        the first chunk: ``VP8 `` (lossy: key frame header), ``VP8L`` (lossless), ``VP8X`` (canvas)
TIFF        the first image file directory's ImageWidth and ImageLength (the page OpenCV decodes)
PNM         the text header's width and height (comments skipped), within its first 4 KiB
JPEG 2000   the codestream's SIZ marker (image extent less image offset), in a JP2 file's ``jp2c`` box
JPEG        libjpeg-turbo's own header reader (simplejpeg), which is what then decodes the file
==========  ==========================================================================================
"""

from __future__ import annotations

import struct
import zlib

import simplejpeg

from beton.errors import EncodeError

__all__ = ["image_size"]

_PNM_HEADER_BYTES = 4096  # a PNM header is a few numbers; comments longer than this are not a header
_TIFF_WIDTH, _TIFF_LENGTH = 256, 257
_TIFF_SHORT, _TIFF_LONG = 3, 4
_JP2_MAX_BOXES = 64  # a JP2 file's top-level boxes before the codestream: a handful in practice


class _Reader:
    """Bounds-checked ``struct`` reads from ``data``: a read past the end is an EncodeError."""

    def __init__(self, data: bytes, kind: str) -> None:
        self.data, self.kind = data, kind

    def unpack(self, layout: str, offset: int) -> tuple[int, ...]:
        size = struct.calcsize(layout)
        if offset < 0 or offset + size > len(self.data):
            raise EncodeError(f"{self.kind} header cannot be read: it ends at byte {len(self.data)}, "
                              f"a field lies at {offset}..{offset + size}")
        return struct.unpack_from(layout, self.data, offset)

    def fail(self, why: str) -> EncodeError:
        return EncodeError(f"{self.kind} header cannot be read: {why}")


def image_size(data: bytes, kind: str) -> tuple[int, int]:
    """(width, height) that the header of ``data``, an image file of format ``kind`` (as
    :func:`~beton.tools.convert.images.sniff_image_format` names it), declares; EncodeError if it cannot say."""
    reader = _Reader(data, kind)
    width, height = _PARSERS[kind](reader)
    if width <= 0 or height <= 0:
        raise reader.fail(f"it declares {width}x{height} pixels")
    return width, height


def _png(reader: _Reader) -> tuple[int, int]:
    length, name = reader.unpack(">I4s", 8)
    if name != b"IHDR" or length != 13:
        raise reader.fail(f"the first chunk is {name!r} of {length} bytes, expected IHDR of 13")
    width, height = reader.unpack(">II", 16)
    (crc,) = reader.unpack(">I", 29)
    if zlib.crc32(reader.data[12:29]) != crc:
        raise reader.fail("the IHDR chunk's CRC does not match it")
    return width, height


def _gif(reader: _Reader) -> tuple[int, int]:
    width, height, flags = reader.unpack("<HHB", 6)
    offset = 13 + (3 << ((flags & 7) + 1) if flags & 0x80 else 0)  # after the global colour table
    while True:
        (introducer,) = reader.unpack("B", offset)
        if introducer == 0x2C:  # the first image descriptor: where the first frame lies on the screen
            left, top, frame_width, frame_height = reader.unpack("<HHHH", offset + 1)
            return max(width, left + frame_width), max(height, top + frame_height)
        if introducer != 0x21:
            raise reader.fail(f"byte {offset} is {introducer:#04x} where an extension or an image was expected")
        offset += 2  # introducer and label, then sub-blocks until an empty one
        while True:
            (size,) = reader.unpack("B", offset)
            offset += 1 + size
            if size == 0:
                break


def _bmp(reader: _Reader) -> tuple[int, int]:
    (header,) = reader.unpack("<I", 14)
    if header == 12:  # OS/2 BITMAPCOREHEADER
        return reader.unpack("<HH", 18)
    if header < 40:
        raise reader.fail(f"its info header is {header} bytes, expected 12 or at least 40")
    width, height = reader.unpack("<ii", 18)
    return width, abs(height)


def _webp(reader: _Reader) -> tuple[int, int]:
    (chunk,) = reader.unpack("4s", 12)
    if chunk == b"VP8 ":
        (start,) = reader.unpack("3s", 23)
        if start != b"\x9d\x01\x2a":
            raise reader.fail("its VP8 chunk does not start with a key frame")
        width, height = reader.unpack("<HH", 26)
        return width & 0x3FFF, height & 0x3FFF
    if chunk == b"VP8L":
        signature, bits = reader.unpack("<BI", 20)
        if signature != 0x2F:
            raise reader.fail("its VP8L chunk lacks the lossless signature")
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if chunk == b"VP8X":
        low_width, high_width, low_height, high_height = reader.unpack("<HBHB", 24)
        return (low_width | high_width << 16) + 1, (low_height | high_height << 16) + 1
    raise reader.fail(f"its first chunk is {chunk!r}, expected 'VP8 ', 'VP8L' or 'VP8X'")


def _tiff(reader: _Reader) -> tuple[int, int]:
    order = "<" if reader.data[:2] == b"II" else ">"
    (directory,) = reader.unpack(order + "I", 4)
    (count,) = reader.unpack(order + "H", directory)
    found = {}
    for index in range(count):
        tag, kind, values, value = reader.unpack(order + "HHI4s", directory + 2 + 12 * index)
        if tag in (_TIFF_WIDTH, _TIFF_LENGTH):
            if values != 1 or kind not in (_TIFF_SHORT, _TIFF_LONG):
                raise reader.fail(f"tag {tag} has {values} values of type {kind}, expected one SHORT or LONG")
            layout = order + ("H" if kind == _TIFF_SHORT else "I")
            found[tag] = struct.unpack_from(layout, value)[0]
    if len(found) != 2:
        raise reader.fail("its first directory lacks ImageWidth or ImageLength")
    return found[_TIFF_WIDTH], found[_TIFF_LENGTH]


def _pnm(reader: _Reader) -> tuple[int, int]:
    numbers: list[int] = []
    text = reader.data[2:_PNM_HEADER_BYTES]
    offset = 0
    while len(numbers) < 2:
        while offset < len(text) and (text[offset:offset + 1].isspace() or text[offset] == ord("#")):
            if text[offset] == ord("#"):  # a comment runs to the end of the line
                end = text.find(b"\n", offset)
                offset = len(text) if end < 0 else end
            offset += 1
        start = offset
        while offset < len(text) and text[offset:offset + 1].isdigit():
            offset += 1
        if start == offset or offset == len(text):
            raise reader.fail(f"no width and height within its first {_PNM_HEADER_BYTES} bytes")
        numbers.append(int(text[start:offset]))
    return numbers[0], numbers[1]


def _jpeg2000(reader: _Reader) -> tuple[int, int]:
    offset = 0
    if reader.data[:4] != b"\xff\x4f\xff\x51":  # a JP2 file: find the codestream box
        for _ in range(_JP2_MAX_BOXES):
            length, name = reader.unpack(">I4s", offset)
            if name == b"jp2c":
                offset += 8 if length != 1 else 16
                break
            if length == 1:
                (length,) = reader.unpack(">Q", offset + 8)
            if length < 8:  # 0: the box runs to the end of the file, and it was not the codestream
                raise reader.fail(f"box {name!r} at byte {offset} has length {length} before any codestream")
            offset += length
        else:
            raise reader.fail(f"no codestream box within its first {_JP2_MAX_BOXES} boxes")
    marker, siz = reader.unpack(">HH", offset)
    if marker != 0xFF4F or siz != 0xFF51:
        raise reader.fail(f"the codestream at byte {offset} does not start with SOC and SIZ markers")
    width, height, left, top = reader.unpack(">IIII", offset + 8)
    return width - left, height - top


def _jpeg(reader: _Reader) -> tuple[int, int]:
    try:
        height, width, _, _ = simplejpeg.decode_jpeg_header(reader.data)
    except ValueError as error:
        raise reader.fail(str(error)) from None
    return width, height


_PARSERS = {"PNG": _png, "GIF": _gif, "BMP": _bmp, "WebP": _webp, "TIFF": _tiff, "PNM": _pnm,
            "JPEG 2000": _jpeg2000, "JPEG": _jpeg}
