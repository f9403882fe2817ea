"""Restart markers added to a stored JPEG losslessly, so that a crop can decode only the segments it touches.

A baseline JPEG's entropy-coded data is one bit stream: each block's DC coefficient is coded as the
difference from the previous block's of the same component, so no block can be decoded without all those
before it. A restart marker (RSTn, every ``interval`` MCUs as the DRI segment says) ends a segment byte-aligned
and resets those predictors to 0: each segment then decodes on its own, and a decoder can splice the segments
a crop needs into a small JPEG of its own (frame size patched, RST markers renumbered).

:func:`add_restart_markers` transcodes without re-encoding (ITU T.81, Huffman-coded sequential frames): the
quantized coefficients stay exactly the same, so the decoded pixels do. Only the DC differences are recomputed
(from the absolute DC values and the predictors the new restarts reset) and Huffman-coded with the file's own DC
tables; every block's AC bits are copied verbatim. The header is kept byte for byte but for the DRI segment,
and a DHT segment redefining a DC table that lacks a category a restart needs (optimized tables often do).
Bytes after EOI are dropped.

:func:`choose_interval` picks an interval that divides an MCU row, so that every row holds whole segments
(about 64 pixels wide: four 16-pixel MCUs; one MCU where no interval in 2..8 divides the row). :func:`encode_jpeg` encodes pixels with those markers written by the
encoder itself, and :func:`strict_check` is the check a given JPEG passes before it is transcoded.

Every input is untrusted: lengths, table sizes and indices are checked before use (numba does no bounds
checking), all work and memory is bounded by the input's size, and anything unsupported or malformed gives
None rather than an exception or a guess.
"""

from __future__ import annotations

import cv2
import numba
import numpy as np
import simplejpeg

from beton.codecs.jpeg_layout import frame_size, jpeg_layout

__all__ = ["add_restart_markers", "choose_interval", "compile_transcoder", "encode_jpeg", "strict_check",
           "with_restart_markers"]

_LOOKAHEAD = 10  # Huffman codes up to this many bits are decoded by one table lookup
_MAX_BLOCKS_IN_MCU = 10  # libjpeg's limit (D_MAX_BLOCKS_IN_MCU): a larger MCU is an error there too
_MAX_DC_CATEGORY = 11  # 8-bit samples: DC differences up to 2047 in magnitude
_MAX_DC = 32767  # libjpeg stores DC coefficients as 16-bit JCOEF: larger sums would wrap
_SLACK = 1 << 16  # bytes an output may grow by beyond twice its scan: tiny images' markers and DC codes
_NO_DC_CODE = -2  # what the kernel returns when a DC table has no code for a difference's category
# T.81 Annex K.3.1's luminance DC table: a code for each of the categories 0..11
_FULL_DC_COUNTS = bytes([0, 1, 5, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0])
_FULL_DC_SYMBOLS = bytes(range(12))


def choose_interval(mcus_per_row: int) -> int:
    """The restart interval for rows of ``mcus_per_row`` MCUs: its divisor in 2..8 closest to 4 (5 rather than
    3, as for 15 MCUs), else 1 (every MCU a segment; one MCU a row is a whole row either way).

    Four MCUs are 32 pixels (4:4:4, grey) or 64 pixels (4:2:0, 4:2:2); a divisor keeps every segment inside one
    MCU row, so a crop's segments are a rectangle of rows × segment columns. Rows with no divisor in 2..8 (11, 13,
    17, 19, 23... MCUs: a quarter of the benchmark's ~256 px photos) get segments of one MCU rather than whole
    rows: their crops then decode only the columns they need, which outweighs the extra markers'
    bytes and a whole decode's extra work (docs/images.md, "Only the part of the JPEG a crop needs").
    """
    if mcus_per_row < 1:
        raise ValueError(f"mcus_per_row must be at least 1, got {mcus_per_row}")
    divisors = [d for d in range(2, 9) if mcus_per_row % d == 0]
    if not divisors:
        return 1
    return min(divisors, key=lambda d: (abs(d - 4), -d))


def with_restart_markers(data: bytes, checked: bool = False) -> bytes:
    """``data`` as beton's image field stores JPEGs: with a restart marker every :func:`choose_interval` MCUs,
    added by :func:`add_restart_markers`; ``data`` itself when it has them at that interval already or cannot
    carry them (progressive, arithmetic-coded...).

    Damaged data is returned as it is, so that its damage stays visible: the transcoder reads some damage (data
    left over in a segment, for one) as valid coefficients and would write a clean JPEG of them. Only what
    libjpeg-turbo decodes without a warning is transcoded (checked by :func:`strict_check`). ``checked=True``
    says that the caller has run that check on ``data`` already (or encoded it itself), and skips it.
    """
    payload = np.frombuffer(data, np.uint8)
    layout = jpeg_layout(payload)
    if layout is None:
        return data
    width = frame_size(payload, layout.frame)[1]
    if width < 1:
        return data
    interval = choose_interval(-(-width // layout.mcu_width))
    if layout.restart_interval == interval:
        return data
    if not checked and strict_check(data) is not None:
        return data
    return add_restart_markers(data, interval) or data


def encode_jpeg(pixels: np.ndarray, quality: int, restart_markers: bool = True) -> bytes:
    """HxWx3 RGB or HxWx1 grey uint8 ``pixels`` as a baseline JPEG of ``quality`` (colour at 4:2:0), with a
    restart marker every :func:`choose_interval` MCUs unless ``restart_markers`` is False.

    The encoder writes the markers itself: no transcode, which would cost more than the encode. Restart markers
    change only how the coefficients are entropy-coded, so the pixels are the same with and without them.
    """
    colour = pixels.shape[2] == 3
    image = cv2.cvtColor(pixels, cv2.COLOR_RGB2BGR) if colour else pixels[:, :, 0]
    mcu_width = 16 if colour else 8
    interval = choose_interval(-(-pixels.shape[1] // mcu_width)) if restart_markers else 0
    options = [cv2.IMWRITE_JPEG_QUALITY, int(quality), cv2.IMWRITE_JPEG_RST_INTERVAL, interval]
    if colour:
        options += [cv2.IMWRITE_JPEG_SAMPLING_FACTOR, cv2.IMWRITE_JPEG_SAMPLING_FACTOR_420]
    ok, encoded = cv2.imencode(".jpg", image, options)
    if not ok:
        raise ValueError(f"OpenCV could not encode a {pixels.shape[1]}x{pixels.shape[0]} JPEG")
    return encoded.tobytes()


def compile_transcoder() -> None:
    """Compile (or load from numba's disk cache) everything :func:`with_restart_markers` runs, on a tiny JPEG."""
    with_restart_markers(encode_jpeg(np.zeros((16, 32, 3), np.uint8), 90, restart_markers=False))


def strict_check(data: bytes, colorspace: str = "RGB") -> str | None:
    """Why libjpeg-turbo cannot decode ``data`` without a warning (truncated, corrupt, data left over...), or
    None when it can. A decode at 1/8 scale: every Huffman code is still read, the IDCT is 64x cheaper.

    The one check of a given JPEG's data that writers make, shared so that no JPEG is decoded twice for it.
    ``colorspace`` as simplejpeg takes it; a grey decode of a colour JPEG still reads every component's codes.

    A frame declaring more 8x8 blocks than its bytes can code is not whole, and is refused undecoded: the decode
    would allocate for the size it declares. Each block codes at least 2 bits in a one-scan sequential JPEG (a DC
    and an AC code), 1 in a progressive one's DC scan (arithmetic-coded JPEGs of that few bits are refused too).
    """
    try:
        height, width = simplejpeg.decode_jpeg_header(data)[:2]
        bits_per_block = 2 if jpeg_layout(np.frombuffer(data, np.uint8)) is not None else 1
        if -(-height // 8) * -(-width // 8) > 8 // bits_per_block * len(data) + 4:
            return (f"the frame declares {width}x{height} pixels, more 8x8 blocks than its {len(data)} bytes can "
                    "code: the data is not whole")
        simplejpeg.decode_jpeg(data, colorspace=colorspace, min_factor=8, min_height=1, min_width=1)
    except ValueError as error:  # strict: libjpeg warnings raise too
        return str(error)
    return None


def add_restart_markers(data: bytes, interval: int) -> bytes | None:
    """``data`` with a restart marker every ``interval`` MCUs (its DRI segment set to ``interval``), decoding to
    exactly the same pixels.

    None when this JPEG cannot be transcoded: anything but one scan of all components of a Huffman-coded
    sequential 8-bit frame (SOF0/SOF1), ending in EOI (progressive, arithmetic-coded, lossless, 12-bit and
    multi-scan JPEGs give None), or malformed data (a truncated scan, restart markers out of sequence, invalid
    Huffman tables). A DC table without a code for a category a restart needs is redefined (Annex K.3's).
    Never raises on any ``data``; raises ValueError only for an ``interval`` outside 1..65535.
    """
    if not 1 <= interval <= 0xFFFF:
        raise ValueError(f"restart interval must be in 1..65535, got {interval}")
    buffer = np.frombuffer(bytes(data), np.uint8)
    sos, scan_start, old_interval, mcus, component_of_block, counts, symbols, dc_ids, drops = _parse_header(buffer)
    if scan_start < 0:
        return None
    output, used = _restart_scan(buffer, scan_start, old_interval, interval, mcus, component_of_block, counts,
                                 symbols, counts, symbols, False)
    dht = b""
    if used == _NO_DC_CODE:
        # Optimized DC tables have codes only for the differences the image had; a restart codes an absolute DC
        # value, a larger category. The scan's incomplete DC tables are then redefined by a DHT segment before
        # the scan (Annex K.3's full table) and every DC difference is coded with it.
        full_counts, full_symbols = counts.copy(), symbols.copy()
        incomplete = set()
        for component, identifier in enumerate(dc_ids.tolist()):
            if len(set(symbols[2 * component, : counts[2 * component].sum()].tolist()) & set(range(12))) < 12:
                incomplete.add(identifier)
                full_counts[2 * component] = np.frombuffer(_FULL_DC_COUNTS, np.uint8)
                full_symbols[2 * component, :12] = np.frombuffer(_FULL_DC_SYMBOLS, np.uint8)
        dht = _dht(sorted(incomplete))
        output, used = _restart_scan(buffer, scan_start, old_interval, interval, mcus, component_of_block, counts,
                                     symbols, full_counts, full_symbols, True)
    if used < 0:
        return None
    header = buffer[:sos].tobytes()
    for drop in drops[::-1].tolist():  # DRI segments, 6 bytes each
        header = header[:drop] + header[drop + 6 :]
    restart = b"\xff\xdd\x00\x04" + interval.to_bytes(2, "big")
    return header + dht + restart + buffer[sos:scan_start].tobytes() + output[:used].tobytes() + b"\xff\xd9"


def _dht(identifiers: list[int]) -> bytes:
    """A DHT segment defining Annex K.3's DC table as each of ``identifiers``."""
    body = b"".join(bytes([identifier]) + _FULL_DC_COUNTS + _FULL_DC_SYMBOLS for identifier in identifiers)
    return b"\xff\xc4" + (2 + len(body)).to_bytes(2, "big") + body


# what _walk_header leaves in its ``found`` array, by index
_HEIGHT, _WIDTH, _COMPONENTS, _OLD_INTERVAL, _DROPPED, _SOS, _SCAN = range(7)
_IDENTIFIER, _HORIZONTAL, _VERTICAL, _DC_TABLE, _AC_TABLE, _DEFINED = 8, 12, 16, 20, 24, 28  # 4 each; 8 tables
_FOUND_SIZE = 36


@numba.njit(cache=True, nogil=True)
def _parse_header(data: np.ndarray):
    """The marker segments up to the scan, when it is one sequential scan of every component in frame order:
    (offset of SOS, offset of the entropy-coded data, old restart interval, MCUs, component of each block in
    an MCU, Huffman code counts and symbols per component (DC table 2c, AC table 2c + 1), each component's DC
    table id, offsets of the DRI segments); the data's offset is -1 for anything else."""
    no_int = np.zeros(0, np.int64)
    table_counts = np.zeros((8, 16), np.uint8)  # class * 4 + id
    table_symbols = np.zeros((8, 256), np.uint8)
    drops = np.zeros(data.size // 6 + 1, np.int64)
    found = np.zeros(_FOUND_SIZE, np.int64)
    if not _walk_header(data, table_counts, table_symbols, drops, found):  # the one failure return: cheap to compile
        return 0, -1, 0, 0, no_int, np.zeros((0, 16), np.uint8), np.zeros((0, 256), np.uint8), no_int, no_int
    components = found[_COMPONENTS]
    counts = np.zeros((2 * components, 16), np.uint8)
    symbols = np.zeros((2 * components, 256), np.uint8)
    dc_ids = np.zeros(components, np.int64)
    blocks, widest, tallest = 0, 1, 1
    # plain loops: numba compiles array-to-slice copies and .max() reductions into far more code (seconds)
    for c in range(components):
        dc, ac = found[_DC_TABLE + c], found[_AC_TABLE + c]
        for index in range(16):
            counts[2 * c, index], counts[2 * c + 1, index] = table_counts[dc, index], table_counts[4 + ac, index]
        for index in range(256):
            symbols[2 * c, index], symbols[2 * c + 1, index] = table_symbols[dc, index], table_symbols[4 + ac, index]
        dc_ids[c] = dc
        blocks += found[_HORIZONTAL + c] * found[_VERTICAL + c]
        widest, tallest = max(widest, found[_HORIZONTAL + c]), max(tallest, found[_VERTICAL + c])
    horizontal, vertical = found[_HORIZONTAL : _HORIZONTAL + components], found[_VERTICAL : _VERTICAL + components]
    height, width = found[_HEIGHT], found[_WIDTH]
    if components == 1:  # a one-component scan is not interleaved: an MCU is one block
        columns = ((width * horizontal[0] + widest - 1) // widest + 7) // 8
        rows = ((height * vertical[0] + tallest - 1) // tallest + 7) // 8
        component_of_block = np.zeros(1, np.int64)
    else:
        columns, rows = (width + 8 * widest - 1) // (8 * widest), (height + 8 * tallest - 1) // (8 * tallest)
        component_of_block = np.zeros(blocks, np.int64)
        block = 0
        for c in range(components):
            for _ in range(horizontal[c] * vertical[c]):
                component_of_block[block] = c
                block += 1
    return (found[_SOS], found[_SCAN], found[_OLD_INTERVAL], columns * rows, component_of_block, counts, symbols,
            dc_ids, drops[: found[_DROPPED]])


@numba.njit(cache=True, nogil=True)
def _walk_header(data: np.ndarray, table_counts: np.ndarray, table_symbols: np.ndarray, drops: np.ndarray,
                 found: np.ndarray) -> bool:
    """Checks the marker segments up to the scan (see :func:`_parse_header`), filling in the Huffman tables, the
    DRI segments' offsets and ``found`` (indexed by the constants above); False for anything unsupported or
    malformed. Allocates nothing, so that its many failure exits compile to plain returns."""
    size = data.size
    if size < 4 or data[0] != 0xFF or data[1] != 0xD8:
        return False
    dropped = 0
    components, height, width, old_interval = 0, 0, 0, 0
    position = 2
    while True:
        if position + 2 > size or data[position] != 0xFF:
            return False
        marker = np.int64(data[position + 1])
        if marker == 0xFF:  # fill byte
            position += 1
            continue
        if marker == 0x01 or 0xD0 <= marker <= 0xD7:  # parameterless markers: libjpeg ignores them here
            position += 2
            continue
        if marker == 0xD8 or marker == 0xD9 or position + 4 > size:
            return False  # a second SOI, or EOI before any scan
        length = (np.int64(data[position + 2]) << 8) | np.int64(data[position + 3])
        body, end = position + 4, position + 2 + length
        if length < 2 or end > size:
            return False
        if marker == 0xC0 or marker == 0xC1:  # sequential, Huffman-coded
            if components > 0 or length < 8 or data[body] != 8:
                return False  # a second frame, or not 8-bit
            height = (np.int64(data[body + 1]) << 8) | np.int64(data[body + 2])
            width = (np.int64(data[body + 3]) << 8) | np.int64(data[body + 4])
            components = np.int64(data[body + 5])
            if height == 0 or width == 0 or not 1 <= components <= 4 or length != 8 + 3 * components:
                return False  # height 0 means a DNL marker after the scan: not supported
            for c in range(components):
                found[_IDENTIFIER + c] = data[body + 6 + 3 * c]
                found[_HORIZONTAL + c] = data[body + 7 + 3 * c] >> 4
                found[_VERTICAL + c] = data[body + 7 + 3 * c] & 15
                if not (1 <= found[_HORIZONTAL + c] <= 4 and 1 <= found[_VERTICAL + c] <= 4):
                    return False
                for other in range(c):
                    if found[_IDENTIFIER + other] == found[_IDENTIFIER + c]:
                        return False
        elif 0xC2 <= marker <= 0xCF and marker != 0xC4:
            return False  # progressive, lossless, arithmetic-coded (and DAC), reserved
        elif marker == 0xC4:
            at = body
            while at < end:
                if at + 17 > end:
                    return False
                table_class, identifier = data[at] >> 4, data[at] & 15
                total = 0
                for length_index in range(16):
                    total += np.int64(data[at + 1 + length_index])
                if table_class > 1 or identifier > 3 or total > 256 or at + 17 + total > end:
                    return False
                code = 0
                for length_index in range(16):  # canonical codes (T.81 C.2) must fit their length, as libjpeg
                    code += np.int64(data[at + 1 + length_index])  # checks (so no all-ones code either)
                    if code >= 1 << (length_index + 1):
                        return False
                    code <<= 1
                slot = table_class * 4 + identifier
                for index in range(256):
                    table_symbols[slot, index] = 0
                for index in range(16):
                    table_counts[slot, index] = data[at + 1 + index]
                for index in range(total):
                    table_symbols[slot, index] = data[at + 17 + index]
                    if table_class == 0 and data[at + 17 + index] > _MAX_DC_CATEGORY:
                        return False
                found[_DEFINED + slot] = 1
                at += 17 + total
        elif marker == 0xDD:  # DRI: dropped, a new one goes before the scan
            if length != 4:
                return False
            old_interval = (np.int64(data[body]) << 8) | np.int64(data[body + 1])
            drops[dropped] = position
            dropped += 1
        elif marker == 0xDA:  # SOS: every component, in frame order, sequential (Ss=0, Se=63, Ah=Al=0)
            if components == 0 or length != 6 + 2 * components or data[body] != components:
                return False
            if data[end - 3] != 0 or data[end - 2] != 63 or data[end - 1] != 0:
                return False
            blocks = 0
            for c in range(components):
                selector, dc, ac = data[body + 1 + 2 * c], data[body + 2 + 2 * c] >> 4, data[body + 2 + 2 * c] & 15
                if selector != found[_IDENTIFIER + c] or dc > 3 or ac > 3 or not found[_DEFINED + dc] \
                        or not found[_DEFINED + 4 + ac]:
                    return False
                found[_DC_TABLE + c], found[_AC_TABLE + c] = dc, ac
                blocks += found[_HORIZONTAL + c] * found[_VERTICAL + c]
            if components > 1 and blocks > _MAX_BLOCKS_IN_MCU:
                return False
            found[_HEIGHT], found[_WIDTH], found[_COMPONENTS] = height, width, components
            found[_OLD_INTERVAL], found[_DROPPED], found[_SOS], found[_SCAN] = old_interval, dropped, position, end
            return True
        position = end


@numba.njit(cache=True, nogil=True)
def _restart_scan(data, scan_start, old_interval, interval, mcus, component_of_block, counts, symbols, encode_counts,
                  encode_symbols, recode) -> tuple[np.ndarray, int]:
    """(output, its size) of the scan at ``scan_start`` re-segmented, DC differences coded with the DC tables of
    ``encode_counts`` and ``encode_symbols`` when ``recode``, else with the scan's own; size -1 for a malformed scan, ``_NO_DC_CODE`` where a DC table
    lacks a category."""
    nothing = np.empty(0, np.uint8)
    old_segments = 1 if old_interval == 0 else (mcus + old_interval - 1) // old_interval
    unstuffed, segment_starts, count, end = _unstuff(data, scan_start, old_segments)
    if count < 0 or end + 2 > data.size or data[end] != 0xFF or data[end + 1] != 0xD9:
        return nothing, -1  # not one scan ending in EOI
    unstuffed_size = segment_starts[count]
    blocks = mcus * component_of_block.size
    # every block codes at least a DC and an AC symbol, one bit each: more blocks than that is a truncated scan
    if blocks > 4 * unstuffed_size + 4:
        return nothing, -1
    if count != old_segments:
        return nothing, -1
    new_restarts = (mcus + interval - 1) // interval - 1
    # bits out ≤ bits in + a DC code and value (≤ 16 + 11 bits) a block + 7 bits of padding a restart; byte
    # stuffing at most doubles that; 2 bytes a marker. Blocks are bounded by the input's size (above), but
    # that bound is 34 times the input: a scan that grows past twice its size (photos grow by a few percent)
    # is left as it is (the transcode runs out of room and gives None).
    capacity = min(2 * (unstuffed_size + 4 * blocks + new_restarts + 1) + 2 * new_restarts,
                   2 * unstuffed_size + _SLACK)
    output = np.empty(capacity, np.uint8)
    look_length, look_symbol, ac_step, max_code, value_offset, table_symbols, dc_code, dc_length = \
        _build_tables(counts, symbols)
    if recode:
        dc_code, dc_length = _build_tables(encode_counts, encode_symbols)[6:]
    used = _transcode(unstuffed, segment_starts[: count + 1], old_interval, interval, mcus, component_of_block,
                      look_length, look_symbol, ac_step, max_code, value_offset, table_symbols, dc_code, dc_length,
                      output)
    return output, used


@numba.njit(cache=True, nogil=True)
def _build_tables(counts: np.ndarray, symbols: np.ndarray):
    """Canonical Huffman codes (T.81 Annex C) as decoding tables, as T.81 F.2.2.3 decodes (maxcode and the
    symbol index minus the first code, per length) behind a lookup of the next ``_LOOKAHEAD`` bits
    (``look_length`` 0: a longer code), and the even tables' codes per DC category (``dc_length`` 0: none).

    ``counts`` were checked by :func:`_read_huffman`: the codes fit their lengths, at most 256 symbols."""
    tables = counts.shape[0]
    look_length = np.zeros((tables, 1 << _LOOKAHEAD), np.int32)
    look_symbol = np.zeros((tables, 1 << _LOOKAHEAD), np.int32)
    ac_step = np.zeros((tables, 1 << _LOOKAHEAD), np.int32)
    max_code = np.full((tables, 17), -1, np.int64)
    value_offset = np.zeros((tables, 17), np.int64)
    dc_code = np.zeros((tables // 2, 16), np.int64)
    dc_length = np.zeros((tables // 2, 16), np.int64)
    for index in range(tables):
        code, position = 0, 0
        for length in range(1, 17):
            first = position
            for _ in range(counts[index, length - 1]):
                if position > 255 or code >= 1 << length:  # checked by _read_huffman: kept safe here too
                    break
                symbol = symbols[index, position]
                if length <= _LOOKAHEAD:
                    start = code << (_LOOKAHEAD - length)
                    run, size = symbol >> 4, symbol & 15
                    step = (run + 1 if size > 0 else 16 if run == 15 else 64) << 8 | (length + size)
                    for look in range(start, start + (1 << (_LOOKAHEAD - length))):
                        look_length[index, look] = length
                        look_symbol[index, look] = symbol
                        if length + size <= _LOOKAHEAD:
                            ac_step[index, look] = step
                if index % 2 == 0 and symbol < 16 and dc_length[index // 2, symbol] == 0:
                    dc_code[index // 2, symbol] = code
                    dc_length[index // 2, symbol] = length
                code += 1
                position += 1
            if position > first:
                value_offset[index, length] = first - (code - (position - first))
                max_code[index, length] = code - 1
            code <<= 1
    return look_length, look_symbol, ac_step, max_code, value_offset, symbols, dc_code, dc_length


@numba.njit(cache=True, nogil=True)
def _unstuff(data: np.ndarray, start: int, segments: int) -> tuple[np.ndarray, np.ndarray, int, int]:
    """The scan's entropy-coded bytes from ``start`` with byte stuffing removed (FF 00 → FF, fill bytes FF
    before a marker dropped as libjpeg does), followed by 8 zero bytes the bit reader may look ahead into.

    Returns (bytes, where each restart segment starts in them with the total size last, number of segments,
    offset of the marker ending the scan); the count is -1 if restart markers are out of sequence, more than
    ``segments``, or the data ends without a marker.
    """
    size = data.size
    unstuffed = np.empty(max(size - start, 0) + 8, np.uint8)
    starts = np.empty(min(segments, max(size - start, 0) // 2 + 1) + 2, np.int64)
    starts[0] = 0
    count, used, position = 1, 0, start
    while position < size:
        byte = data[position]
        if byte != 0xFF:
            unstuffed[used] = byte
            used += 1
            position += 1
            continue
        position += 1
        while position < size and data[position] == 0xFF:
            position += 1
        if position >= size:
            return unstuffed, starts, -1, size
        following = data[position]
        position += 1
        if following == 0x00:
            unstuffed[used] = 0xFF
            used += 1
        elif 0xD0 <= following <= 0xD7:
            if following - 0xD0 != (count - 1) % 8 or count + 1 >= starts.size:
                return unstuffed, starts, -1, size
            starts[count] = used
            count += 1
        else:
            starts[count] = used
            for index in range(used, used + 8):
                unstuffed[index] = 0
            return unstuffed, starts, count, position - 2
    return unstuffed, starts, -1, size


@numba.njit(cache=True, nogil=True, inline="always")
def _peek(data: np.ndarray, position: int, count: int) -> int:
    """The ``count`` (≤ 49) bits at bit ``position``; 0 where they would run past the array."""
    index = position >> 3
    if index < 0 or index + 6 >= data.size:
        return 0
    word = np.int64(0)
    for offset in range(7):  # 56 bits: the wanted ones and up to 7 before them
        word = (word << 8) | np.int64(data[index + offset])
    return (word >> (56 - (position & 7) - count)) & ((np.int64(1) << count) - 1)


@numba.njit(cache=True, nogil=True)
def _decode_long(data, position, table, max_code, value_offset, symbols):
    """(symbol, bits used) of a Huffman code longer than ``_LOOKAHEAD`` bits at ``position`` (T.81 F.2.2.3);
    bits used is 0 for no valid code. Kept out of the kernel's loop: inlined, it made every lookup slow."""
    for length in range(_LOOKAHEAD + 1, 17):
        code = _peek(data, position, length)
        if code <= max_code[table, length]:
            index = value_offset[table, length] + code
            if 0 <= index <= 255:
                return symbols[table, index], length
            break
    return 0, 0


@numba.njit(cache=True, nogil=True, inline="always")
def _put(output, used, accumulator, pending, value, count):
    """Appends the ``count`` (≤ 48) low bits of ``value``, writing whole bytes with FF stuffed; -1 if full."""
    accumulator = (accumulator << count) | (value & ((1 << count) - 1))
    pending += count
    if used < 0 or used + 2 * (pending >> 3) > output.size:
        return -1, accumulator, pending
    while pending >= 8:
        pending -= 8
        byte = (accumulator >> pending) & 0xFF
        output[used] = byte
        used += 1
        if byte == 0xFF:
            output[used] = 0
            used += 1
    return used, accumulator & ((1 << pending) - 1), pending


@numba.njit(cache=True, nogil=True)
def _transcode(data, segment_starts, old_interval, interval, mcus, component_of_block, look_length, look_symbol,
               ac_step, max_code, value_offset, symbols, dc_code, dc_length, output) -> int:
    """Writes the scan re-segmented every ``interval`` MCUs into ``output``; its size, or -1 where the input is
    malformed, a DC difference has no code, or ``output`` is too small.

    The reader keeps the next ``bits`` (32..63 after a refill) unread bits in the low end of ``window`` (bits
    above them are stale and masked off by every read); ``fetched`` is the next byte to load, so the bit
    position is ``8 * fetched - bits``. A symbol with its value bits uses at most 16 + 15 bits.
    """
    components = dc_code.shape[0]
    blocks = component_of_block.size
    size = data.size
    old_dc = np.zeros(components, np.int64)
    new_dc = np.zeros(components, np.int64)
    segment = 0
    fetched, end = segment_starts[0], segment_starts[1] * 8
    window, bits = 0, 0
    used, accumulator, pending = 0, 0, 0
    for mcu in range(mcus):
        if mcu > 0 and old_interval > 0 and mcu % old_interval == 0:  # the input's own restart
            segment += 1
            if segment + 1 >= segment_starts.size:
                return -1
            fetched, end = segment_starts[segment], segment_starts[segment + 1] * 8
            window, bits = 0, 0
            for component in range(components):
                old_dc[component] = 0
        if mcu > 0 and mcu % interval == 0:  # a new restart: pad with 1-bits, RSTn, predictors reset
            if pending > 0:
                used, accumulator, pending = _put(output, used, accumulator, pending, 0xFF, 8 - pending)
            if used < 0 or used + 2 > output.size:
                return -1
            output[used] = 0xFF
            output[used + 1] = 0xD0 + (mcu // interval - 1) % 8
            used += 2
            for component in range(components):
                new_dc[component] = 0
        for block in range(blocks):
            component = component_of_block[block]
            if bits < 32:
                while bits <= 55:
                    window = (window << 8) | (np.int64(data[fetched]) if fetched < size else 0)
                    fetched += 1
                    bits += 8
            look = (window >> (bits - _LOOKAHEAD)) & ((1 << _LOOKAHEAD) - 1)
            category, length = look_symbol[2 * component, look], look_length[2 * component, look]
            if length == 0:
                category, length = _decode_long(data, 8 * fetched - bits, 2 * component, max_code, value_offset,
                                                symbols)
            if length == 0 or category > _MAX_DC_CATEGORY:
                return -1
            bits -= length
            difference = 0
            if category > 0:
                difference = (window >> (bits - category)) & ((1 << category) - 1)
                if difference < (1 << (category - 1)):
                    difference -= (1 << category) - 1
                bits -= category
            if 8 * fetched - bits > end:
                return -1
            value = old_dc[component] + difference
            if value > _MAX_DC or value < -_MAX_DC:
                return -1
            old_dc[component] = value
            # the same DC value, coded from the new predictor
            difference = value - new_dc[component]
            new_dc[component] = value
            magnitude = difference if difference >= 0 else -difference
            category = 0
            while magnitude > 0:
                category += 1
                magnitude >>= 1
            if category > _MAX_DC_CATEGORY:  # 8-bit samples never make one: damaged data
                return -1
            if dc_length[component, category] == 0:
                return _NO_DC_CODE
            used, accumulator, pending = _put(output, used, accumulator, pending, dc_code[component, category],
                                              dc_length[component, category])
            if category > 0:
                bits_out = difference if difference >= 0 else difference + (1 << category) - 1
                used, accumulator, pending = _put(output, used, accumulator, pending, bits_out, category)
            if used < 0:
                return -1
            # the AC coefficients' bits, found as libjpeg reads them (a run past 63 ends the block there too)
            start = 8 * fetched - bits
            table = 2 * component + 1
            k = 1
            while k < 64:
                if bits < 32:
                    while bits <= 55:
                        window = (window << 8) | (np.int64(data[fetched]) if fetched < size else 0)
                        fetched += 1
                        bits += 8
                    if 8 * fetched - bits > end:
                        return -1
                look = (window >> (bits - _LOOKAHEAD)) & ((1 << _LOOKAHEAD) - 1)
                step = ac_step[table, look]
                if step > 0:  # code and value bits within the lookahead: one lookup
                    bits -= step & 0xFF
                    k += step >> 8
                    continue
                symbol, length = look_symbol[table, look], look_length[table, look]
                if length == 0:
                    symbol, length = _decode_long(data, 8 * fetched - bits, table, max_code, value_offset, symbols)
                    if length == 0:
                        return -1
                run, size_bits = symbol >> 4, symbol & 15
                bits -= length + size_bits
                if size_bits > 0:
                    k += run
                elif run != 15:
                    break
                else:
                    k += 15
                k += 1
            position = 8 * fetched - bits
            if position > end:
                return -1
            while start < position:
                count = min(position - start, 48)
                used, accumulator, pending = _put(output, used, accumulator, pending, _peek(data, start, count),
                                                  count)
                if used < 0:
                    return -1
                start += count
    if pending > 0:
        used, accumulator, pending = _put(output, used, accumulator, pending, 0xFF, 8 - pending)
    return used
