"""A lossless image codec built for crops: independent tiles, byte-aligned bit packing, numba on both ends.

The idea is L3's (Bae et al., ECCV 2022), shaped for CPUs: instead of a sequential entropy coder (PNG's
deflate), each tile predicts every pixel from its already decoded neighbours and stores the prediction
residuals bit-packed in groups of eight, so decoding is a tight loop of shifts and adds that numba compiles
well, tiles decode independently (a crop decodes only the tiles it touches), and no tile reads another's bytes.

Per pixel and channel:

* colour transform (3 and 4 channels): planes G, R-G, B-G (mod 2^bits), then alpha; the differences are small
  on photos, which is most of the gain over PNG;
* prediction: LOCO-I's median edge detector from the left, upper and upper-left neighbours inside the tile
  (left only on the tile's first row, upper only on its first column, 0 for its first pixel);
* residual mod 2^bits as a signed number, zig-zag mapped to 0..2^bits - 1;
* residuals in raster order within the tile, eight to a group; a group stores the bit width w (0..bits) of
  its largest residual and then its eight residuals in exactly w bytes (LSB first).

Samples are 8 bits (uint8 images) or 16 bits (uint16 images: medical and scientific data).

Payload layout (all little-endian)::

    u8  version (1)       u8  log2(tile side)     u8  0: 8-bit samples, 1: 16-bit     u8  zero
    u32 tile_end[n_tiles]      end of each tile's bytes, counted from the start of the tile data
    tile data, tiles in raster order; per tile and channel plane: the group widths (8-bit samples: two 4-bit
    widths per byte, low nibble first, rounded up to whole bytes; 16-bit: one byte per group), then the
    packed groups

Sizes against PNG are measured by ``benchmarks/lossless.py`` (docs/images.md). By construction, noise costs
1/16 more than raw (one width per group of eight samples) and flat areas 1/16 of raw (a zero width per group),
where PNG does better.
"""

from __future__ import annotations

import math

import numba
import numpy as np

from beton.errors import DecodeError

__all__ = ["encode_lossless", "decode_lossless", "decode_lossless_region", "tile_grid", "DEFAULT_TILE_LOG2",
           "lossless_region_bounds", "check_header", "decode_tiles"]

VERSION = 1
DEFAULT_TILE_LOG2 = 6  # 64x64 tiles: crops decode little outside themselves, for a small size cost (docs/images.md)
_HEADER = 4
_GROUP = 8


def tile_grid(height: int, width: int, tile_log2: int) -> tuple[int, int]:
    """Number of tile rows and columns."""
    tile = 1 << tile_log2
    return -(-height // tile), -(-width // tile)


# ---- encoding ---------------------------------------------------------------------------------------------


@numba.njit(nogil=True, cache=True)
def _forward_planes(image, y0, x0, rows, cols, planes, mask):
    """Colour-transformed planes of one tile: G, R-G, B-G(, A) for 3-4 channels, the grey plane for 1."""
    channels = image.shape[2]
    for y in range(rows):
        for x in range(cols):
            if channels == 1:
                planes[0, y, x] = image[y0 + y, x0 + x, 0]
            else:
                green = np.int32(image[y0 + y, x0 + x, 1])
                planes[0, y, x] = green
                planes[1, y, x] = (np.int32(image[y0 + y, x0 + x, 0]) - green) & mask
                planes[2, y, x] = (np.int32(image[y0 + y, x0 + x, 2]) - green) & mask
                if channels == 4:
                    planes[3, y, x] = image[y0 + y, x0 + x, 3]


@numba.njit(nogil=True, cache=True, inline="always")
def _median_edge(left, above, corner):
    """LOCO-I's predictor: the median of left, above and left + above - corner (branch-free)."""
    gradient = left + above - corner
    return max(min(left, above), min(max(left, above), gradient))


@numba.njit(nogil=True, cache=True, inline="always")
def _predict(plane, y, x):
    if y == 0:
        return np.int32(plane[y, x - 1]) if x > 0 else np.int32(0)
    if x == 0:
        return np.int32(plane[y - 1, x])
    return _median_edge(np.int32(plane[y, x - 1]), np.int32(plane[y - 1, x]), np.int32(plane[y - 1, x - 1]))


@numba.njit(nogil=True, cache=True)
def _encode_plane(plane, rows, cols, residuals, out, position, bits):
    count = rows * cols
    mask, half = (1 << bits) - 1, 1 << (bits - 1)
    for y in range(rows):
        for x in range(cols):
            residual = (np.int32(plane[y, x]) - _predict(plane, y, x)) & mask
            residuals[y * cols + x] = residual << 1 if residual < half else ((mask + 1 - residual) << 1) - 1
    groups = -(-count // _GROUP)
    for i in range(count, groups * _GROUP):
        residuals[i] = 0
    widths_at = position
    position += _widths_bytes(groups, bits)
    for g in range(groups):
        largest = 0
        for j in range(_GROUP):
            largest = max(largest, residuals[g * _GROUP + j])
        width = 0
        while largest >> width:
            width += 1
        if bits == 16:
            out[widths_at + g] = width
        elif g % 2 == 0:
            out[widths_at + g // 2] = width
        else:
            out[widths_at + g // 2] |= width << 4
        low, high = np.uint64(0), np.uint64(0)  # the group's 8 * width bits: up to 128
        for j in range(_GROUP):
            value, shift = np.uint64(residuals[g * _GROUP + j]), j * width
            if shift < 64:
                low |= value << np.uint64(shift)
                if shift + width > 64:
                    high |= value >> np.uint64(64 - shift)
            else:
                high |= value << np.uint64(shift - 64)
        for b in range(width):
            word, at = (low, b) if b < 8 else (high, b - 8)
            out[position + b] = (word >> np.uint64(8 * at)) & np.uint64(255)
        position += width
    return position


@numba.njit(nogil=True, cache=True, inline="always")
def _widths_bytes(groups, bits):
    return groups if bits == 16 else (groups + 1) // 2


@numba.njit(nogil=True, cache=True)
def _encode_tiles(image, tile_log2, out, tile_ends, data_start, bits):
    height, width, channels = image.shape
    tile = 1 << tile_log2
    tile_rows, tile_cols = -(-height // tile), -(-width // tile)
    planes = np.zeros((channels, tile, tile), image.dtype)
    residuals = np.empty(tile * tile, np.int32)
    position = data_start
    for ty in range(tile_rows):
        for tx in range(tile_cols):
            y0, x0 = ty * tile, tx * tile
            rows, cols = min(tile, height - y0), min(tile, width - x0)
            _forward_planes(image, y0, x0, rows, cols, planes, (1 << bits) - 1)
            for c in range(channels):
                position = _encode_plane(planes[c], rows, cols, residuals, out, position, bits)
            tile_ends[ty * tile_cols + tx] = position - data_start
    return position


def encode_lossless(image: np.ndarray, tile_log2: int = DEFAULT_TILE_LOG2) -> bytes:
    """Encode an HxWxC uint8 or uint16 image (C in 1, 3, 4) losslessly."""
    if image.dtype.kind != "u" or image.dtype.itemsize > 2 or image.ndim != 3 or image.shape[2] not in (1, 3, 4):
        raise ValueError(f"lossless encoding takes HxWx1/3/4 uint8 or uint16 images, got {image.dtype} "
                         f"{image.shape}")
    if not 2 <= tile_log2 <= 12:
        raise ValueError(f"tile_log2 must lie in 2..12, got {tile_log2}")
    height, width, channels = image.shape
    tile = 1 << tile_log2
    n_tiles = math.prod(tile_grid(height, width, tile_log2))
    data_start = _HEADER + 4 * n_tiles
    pixels_per_tile, bits = tile * tile, 8 * image.dtype.itemsize
    worst_case = data_start + n_tiles * channels * (pixels_per_tile * bits // 8 + pixels_per_tile // 8 + 2)
    out = np.zeros(worst_case, np.uint8)
    tile_ends = np.zeros(n_tiles, np.uint32)
    end = _encode_tiles(np.ascontiguousarray(image, image.dtype.newbyteorder("=")), tile_log2, out, tile_ends,
                        data_start, bits)
    out[0], out[1], out[2] = VERSION, tile_log2, bits // 16
    out[_HEADER:data_start] = tile_ends.astype("<u4").view(np.uint8)
    return out[:end].tobytes()


# ---- decoding ---------------------------------------------------------------------------------------------


@numba.njit(nogil=True, cache=True)
def _decode_plane(payload, position, end, plane, rows, cols, residuals, bits):
    """Decode one plane starting at ``position``; returns the position after it, or -1 if it overruns ``end``."""
    count = rows * cols
    groups = -(-count // _GROUP)
    widths_at = position
    position += _widths_bytes(groups, bits)
    if position > end:
        return -1
    for g in range(groups):
        width = payload[widths_at + g] if bits == 16 else (payload[widths_at + g // 2] >> (4 * (g % 2))) & 15
        if width > bits or position + width > end:
            return -1
        if width <= 8:
            _unpack_narrow(payload, position, width, residuals, g * _GROUP)
        else:
            _unpack_wide(payload, position, width, residuals, g * _GROUP)
        position += width
    _unpredict(residuals, plane, rows, cols, (1 << bits) - 1)
    return position


@numba.njit(nogil=True, cache=True, inline="always")
def _unpack_narrow(payload, position, width, residuals, first):
    """Eight values of ``width`` <= 8 bits from ``width`` bytes: one 64-bit word."""
    packed = np.uint64(0)
    for b in range(width):
        packed |= np.uint64(payload[position + b]) << np.uint64(8 * b)
    mask = np.uint64((1 << width) - 1)
    for j in range(_GROUP):
        residuals[first + j] = np.int32((packed >> np.uint64(j * width)) & mask)


@numba.njit(nogil=True, cache=True)
def _unpack_wide(payload, position, width, residuals, first):
    """Eight values of 9..16 bits from ``width`` bytes: two 64-bit words."""
    low, high = np.uint64(0), np.uint64(0)
    for b in range(8):
        low |= np.uint64(payload[position + b]) << np.uint64(8 * b)
    for b in range(8, width):
        high |= np.uint64(payload[position + b]) << np.uint64(8 * (b - 8))
    mask = np.uint64((1 << width) - 1)
    for j in range(_GROUP):
        shift = j * width
        if shift + width <= 64:
            value = low >> np.uint64(shift)
        elif shift >= 64:
            value = high >> np.uint64(shift - 64)
        else:
            value = (low >> np.uint64(shift)) | (high << np.uint64(64 - shift))
        residuals[first + j] = np.int32(value & mask)


@numba.njit(nogil=True, cache=True, inline="always")
def _unzigzag(value):
    return (value >> 1) ^ -(value & 1)


@numba.njit(nogil=True, cache=True)
def _unpredict(residuals, plane, rows, cols, mask):
    """Rebuild a plane from its zig-zag residuals; edge rows and columns apart, so the inner loop has no tests."""
    left = np.int32(0)
    for x in range(cols):
        left = (left + _unzigzag(residuals[x])) & mask
        plane[0, x] = left
    for y in range(1, rows):
        row = residuals[y * cols : (y + 1) * cols]
        left = (np.int32(plane[y - 1, 0]) + _unzigzag(row[0])) & mask
        plane[y, 0] = left
        corner = np.int32(plane[y - 1, 0])
        for x in range(1, cols):
            above = np.int32(plane[y - 1, x])
            left = (_median_edge(left, above, corner) + _unzigzag(row[x])) & mask
            plane[y, x] = left
            corner = above


@numba.njit(nogil=True, cache=True)
def _inverse_planes(planes, rows, cols, out, y0, x0):
    if out.shape[2] == 1:
        out[y0 : y0 + rows, x0 : x0 + cols, 0] = planes[0, :rows, :cols]
        return
    for y in range(rows):
        target = out[y0 + y]
        for x in range(cols):
            green = planes[0, y, x]
            target[x0 + x, 0] = planes[1, y, x] + green  # stored in the image's dtype: wraps mod 2^bits
            target[x0 + x, 1] = green
            target[x0 + x, 2] = planes[2, y, x] + green
    if out.shape[2] == 4:
        out[y0 : y0 + rows, x0 : x0 + cols, 3] = planes[3, :rows, :cols]


@numba.njit(nogil=True, cache=True, inline="always")
def _tile_end(payload, index):
    """Entry ``index`` of the tile table, read bytewise: payloads in a page need not be 4-byte aligned."""
    at = _HEADER + 4 * index
    return (np.int64(payload[at]) | np.int64(payload[at + 1]) << 8 | np.int64(payload[at + 2]) << 16
            | np.int64(payload[at + 3]) << 24)


@numba.njit(nogil=True, cache=True)
def _decode_tile(payload, data_start, index, height, width, tile_log2, ty0, tx0, ty, tx, planes,
                 residuals, out, bits):
    """Decode tile (ty, tx) into ``out``, whose pixel (0, 0) is tile (ty0, tx0)'s. False on corrupt data."""
    tile = 1 << tile_log2
    start = data_start + (_tile_end(payload, index - 1) if index > 0 else 0)
    end = data_start + _tile_end(payload, index)
    if end > payload.size or start > end:
        return False
    rows, cols = min(tile, height - ty * tile), min(tile, width - tx * tile)
    position = start
    for c in range(out.shape[2]):
        position = _decode_plane(payload, position, end, planes[c], rows, cols, residuals, bits)
        if position < 0:
            return False
    if position != end:
        return False
    _inverse_planes(planes, rows, cols, out, (ty - ty0) * tile, (tx - tx0) * tile)
    return True


@numba.njit(nogil=True, cache=True, inline="always")
def _padded(count):
    """Residuals a plane of ``count`` pixels unpacks: whole groups of eight."""
    return -(-count // _GROUP) * _GROUP


@numba.njit(nogil=True, cache=True)
def _work_fits(height, width, tile_log2, planes, residuals, channels):
    """Whether the per-tile work buffers hold a tile of this image: the decoder indexes them with sizes the
    payload and the record give, so it checks them itself rather than trust its caller."""
    tile = 1 << tile_log2
    rows, cols = min(tile, height), min(tile, width)
    return (height >= 1 and width >= 1 and (channels == 1 or channels == 3 or channels == 4)
            and planes.shape[0] >= channels and planes.shape[1] >= rows and planes.shape[2] >= cols
            and residuals.size >= _padded(rows * cols))


@numba.njit(nogil=True, cache=True)
def decode_tiles(payload, height, width, tile_log2, ty0, ty1, tx0, tx1, planes, residuals, out, bits):
    """Decode tile rows ty0..ty1-1 and columns tx0..tx1-1 into ``out``; the first bad tile's index, -1 when all
    decode, or -2 when the tile range or the buffers do not fit the image.

    The compiled kernel under :func:`decode_lossless_region`, which checks the header (:func:`check_header`) and
    sizes the buffers first; it guards itself too, so that a wrong call returns -2 instead of writing out of
    bounds."""
    tile = 1 << tile_log2
    tile_cols = -(-width // tile)
    tile_rows = -(-height // tile)
    if not _work_fits(height, width, tile_log2, planes, residuals, out.shape[2]):
        return -2
    if not (0 <= ty0 < ty1 <= tile_rows and 0 <= tx0 < tx1 <= tile_cols):
        return -2
    if out.shape[0] < min(height, ty1 * tile) - ty0 * tile or out.shape[1] < min(width, tx1 * tile) - tx0 * tile:
        return -2
    data_start = _HEADER + 4 * tile_rows * tile_cols
    for ty in range(ty0, ty1):
        for tx in range(tx0, tx1):
            index = ty * tile_cols + tx
            if not _decode_tile(payload, data_start, index, height, width, tile_log2, ty0, tx0, ty,
                                tx, planes, residuals, out, bits):
                return index
    return -1


def check_header(payload: np.ndarray, height: int, width: int) -> tuple[int, int]:
    """(log2 of the tile side, bits per sample) after checking the header and that the tile table fits."""
    if payload.size < _HEADER or payload[0] != VERSION or not 2 <= payload[1] <= 12 or payload[2] > 1:
        raise DecodeError("lossless image: bad header (version, tile size or sample depth)")
    tile_log2, bits = int(payload[1]), 16 if payload[2] else 8
    n_tiles = math.prod(tile_grid(height, width, tile_log2))
    if payload.size < _HEADER + 4 * n_tiles:
        raise DecodeError(f"lossless image: {payload.size} bytes cannot hold the table of {n_tiles} tiles")
    return tile_log2, bits


def _check_geometry(height: int, width: int, channels: int, top: int, left: int, rows: int, cols: int) -> None:
    """The image and the region asked for: what the kernels size their loops with."""
    if height < 1 or width < 1 or channels not in (1, 3, 4):
        raise DecodeError(f"lossless image: cannot decode {height}x{width} pixels of {channels} channels")
    if rows < 1 or cols < 1 or top < 0 or left < 0 or top + rows > height or left + cols > width:
        raise DecodeError(f"lossless image: region of {rows}x{cols} at ({top}, {left}) lies outside the "
                          f"{height}x{width} image")


def sample_dtype(payload: np.ndarray, expected: np.dtype | None = None) -> np.dtype:
    """uint8 or uint16: the depth an encoded image's header records; DecodeError when it is not ``expected``."""
    found = np.dtype(np.uint16) if payload.size > 2 and payload[2] == 1 else np.dtype(np.uint8)
    if expected is not None and found != np.dtype(expected).newbyteorder("="):
        raise DecodeError(f"lossless image holds {8 * found.itemsize}-bit samples, its field "
                          f"{8 * np.dtype(expected).itemsize}-bit ones")
    return found


def lossless_region_bounds(payload: np.ndarray, height: int, width: int, top: int, left: int, rows: int,
                           cols: int) -> tuple[int, int, int, int, int]:
    """(tile_log2, first tile row, end tile row, first tile column, end tile column) covering a region."""
    tile_log2, _ = check_header(payload, height, width)
    tile = 1 << tile_log2
    return tile_log2, top // tile, -(-(top + rows) // tile), left // tile, -(-(left + cols) // tile)


def decode_lossless_region(payload: np.ndarray, height: int, width: int, channels: int, top: int, left: int,
                           rows: int, cols: int, scratch, dtype: np.dtype | None = None) -> np.ndarray:
    """The region [top:top+rows, left:left+cols] of a stored image, decoding only the tiles it touches.

    ``scratch(nbytes, purpose)`` gives reusable uint8 buffers (the decoded tiles, per-tile work planes), so a
    loader thread never allocates per image. ``dtype``: the sample type the caller expects (None: whatever the
    payload holds). Returns a view into the tiles' buffer.
    """
    _check_geometry(height, width, channels, top, left, rows, cols)
    tile_log2, ty0, ty1, tx0, tx1 = lossless_region_bounds(payload, height, width, top, left, rows, cols)
    dtype = sample_dtype(payload, dtype)
    bits = 8 * dtype.itemsize
    tile = 1 << tile_log2
    span_height = min(height, ty1 * tile) - ty0 * tile
    span_width = min(width, tx1 * tile) - tx0 * tile
    out = scratch(span_height * span_width * channels * dtype.itemsize, "tiles").view(dtype)
    out = out.reshape(span_height, span_width, channels)
    work_rows, work_cols = min(tile, height), min(tile, width)  # a 4096-pixel tile of a small image: no larger
    planes = scratch(channels * work_rows * work_cols * dtype.itemsize, "planes").view(dtype)
    planes = planes.reshape(channels, work_rows, work_cols)
    residual_count = -(-work_rows * work_cols // _GROUP) * _GROUP
    residuals = scratch(4 * residual_count, "residuals").view(np.int32)
    bad = decode_tiles(payload, height, width, tile_log2, ty0, ty1, tx0, tx1, planes, residuals, out, bits)
    if bad == -2:
        raise DecodeError(f"lossless image: tiles {ty0}..{ty1} x {tx0}..{tx1} do not fit the {height}x{width} "
                          "image or its buffers")
    if bad >= 0:
        raise DecodeError(f"lossless image: tile {bad} is corrupt")
    y, x = top - ty0 * tile, left - tx0 * tile
    return out[y : y + rows, x : x + cols]


def decode_lossless(payload: np.ndarray, height: int, width: int, channels: int,
                    dtype: np.dtype | None = None) -> np.ndarray:
    """The whole image as a new HxWxC array (uint8 or uint16, as encoded; ``dtype``, when given, must be that
    depth)."""
    payload = np.frombuffer(payload, np.uint8) if not isinstance(payload, np.ndarray) else payload
    buffers: dict[str, np.ndarray] = {}
    region = decode_lossless_region(payload, height, width, channels, 0, 0, height, width,
                                    lambda nbytes, purpose: buffers.setdefault(purpose, np.empty(nbytes, np.uint8)),
                                    dtype)
    return np.array(region)
