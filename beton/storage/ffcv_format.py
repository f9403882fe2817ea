"""Reading files written by FFCV 1.0.x (its format version 2), read-only, into beton's Reader.

FFCV's layout, as documented by the files it writes (see ``tests/data/ffcv``): a 24-byte header
(version u2, field count u2, page size u4, sample count u8, allocation table offset u8; C-aligned), then one
1041-byte descriptor per field (type id u1, name as 16 NUL-padded bytes, 1024 bytes of arguments), then the
metadata table (one C-aligned record per sample, a member per field), heap pages, and at the end an allocation
table of (sample id, absolute offset, size) records in the order workers allocated them.

Everything is translated once, on open, into beton's own tables (the data table with beton's metadata dtypes,
the dense allocation table), so the Loader, its decoders and every pipeline work unchanged. FFCV files carry no
checksums: offsets and sizes are validated against the file (before any payload byte is read), but a changed
payload byte cannot be detected. Having no magic number either, a file is taken for an FFCV file only when its
whole structure agrees (:func:`structure_problem`): header, descriptors, table bounds.
Type ids: 0 float, 1 int, 2 RGB image, 3 bytes, 4 ndarray, 5 JSON; 6 (torch tensor) and custom fields are
refused with a FieldError.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from beton import bounded_json
from beton.storage import format as fmt
from beton.errors import FieldError, FormatError, error_context, first_bad_record, locate
from beton.fields import BytesField, FloatField, IntField, JSONField, NDArrayField, RGBImageField
from beton.fields.base import Field
from beton.codecs.image_record import IMAGE_MODES

__all__ = ["FFCV_VERSION", "VERSION_BYTES", "structure_problem", "read_ffcv", "FFCVTables"]

FFCV_VERSION = 2
VERSION_BYTES = FFCV_VERSION.to_bytes(2, "little")  # how every FFCV v2 file starts
_MAX_FIELDS = 1024
_TORCH_TENSOR = 6  # a type id FFCV writes, which beton does not read
HEADER_DTYPE = np.dtype([("version", "<u2"), ("num_fields", "<u2"), ("page_size", "<u4"), ("num_samples", "<u8"),
                         ("alloc_table_ptr", "<u8")], align=True)
FIELD_DTYPE = np.dtype([("type_id", "<u1"), ("name", ("<u1", 16)), ("arguments", ("<u1", 1024))], align=True)
ALLOCATION_DTYPE = np.dtype([("sample_id", "<u8"), ("ptr", "<u8"), ("size", "<u8")])
NDARRAY_ARGUMENTS_DTYPE = np.dtype([("shape", "<u8", 32), ("type_length", "<u8")])
_POINTER_AND_SIZE = np.dtype([("ptr", "<u8"), ("size", "<u8")])
_IMAGE_METADATA = np.dtype([("mode", "<u1"), ("width", "<u2"), ("height", "<u2"), ("data_ptr", "<u8")])
_FFCV_JPEG, _FFCV_RAW = 0, 1

#: type id -> (name, FFCV metadata dtype)
_TYPES = {
    0: ("float", np.dtype("<f8")),
    1: ("int", np.dtype("<i8")),
    2: ("rgb_image", _IMAGE_METADATA),
    3: ("bytes", _POINTER_AND_SIZE),
    4: ("ndarray", np.dtype("<u8")),
    5: ("json", _POINTER_AND_SIZE),
}


@dataclasses.dataclass(frozen=True)
class FFCVTables:
    """An FFCV file expressed as beton's tables."""

    num_samples: int
    page_size: int
    names: list[str]
    fields: list[Field]
    data_table: np.ndarray
    allocation_table: np.ndarray  # (num_samples, num_payload_fields) of fmt.ALLOCATION_DTYPE


def structure_problem(file_map: np.ndarray) -> str | None:
    """Why ``file_map`` is not an FFCV version-2 file, or None when its structure is consistent: the header's
    values, field descriptors of known types with NUL-padded names, and tables that fit the file in order."""
    size = len(file_map)
    if size < HEADER_DTYPE.itemsize:
        return f"it is {size} bytes, smaller than an FFCV header"
    header = np.frombuffer(file_map[: HEADER_DTYPE.itemsize].tobytes(), HEADER_DTYPE)[0]
    num_fields, page_size = int(header["num_fields"]), int(header["page_size"])
    if int(header["version"]) != FFCV_VERSION or not 0 < num_fields < _MAX_FIELDS:
        return f"its header gives version {int(header['version'])} and {num_fields} fields"
    if not fmt.is_valid_page_size(page_size):
        return f"its page size {page_size} is not a power of two in [{fmt.MIN_PAGE_SIZE}, {fmt.MAX_PAGE_SIZE}]"
    descriptors_end = HEADER_DTYPE.itemsize + num_fields * FIELD_DTYPE.itemsize
    if descriptors_end > size:
        return f"its {num_fields} field descriptors reach past the end of the file ({size} bytes)"
    descriptors = np.frombuffer(file_map[HEADER_DTYPE.itemsize : descriptors_end].tobytes(), FIELD_DTYPE)
    for index, descriptor in enumerate(descriptors):
        problem = _descriptor_problem(descriptor)
        if problem:
            return f"field descriptor {index} {problem}"
    types = [int(t) for t in descriptors["type_id"]]
    if _TORCH_TENSOR in types:
        return None  # its metadata size is unknown here; reading the file says what beton cannot read
    metadata_end = descriptors_end + int(header["num_samples"]) * metadata_table_dtype(types).itemsize
    pointer = int(header["alloc_table_ptr"])
    if not metadata_end <= pointer <= size or (size - pointer) % ALLOCATION_DTYPE.itemsize:
        return (f"its allocation table at offset {pointer} does not follow the metadata table (ending at "
                f"{metadata_end}) with whole {ALLOCATION_DTYPE.itemsize}-byte records up to the end ({size})")
    return None


def _descriptor_problem(descriptor: np.void) -> str | None:
    type_id = int(descriptor["type_id"])
    if type_id not in _TYPES and type_id != _TORCH_TENSOR:
        return f"has type id {type_id}"
    name, _, padding = bytes(descriptor["name"]).partition(b"\0")
    if not name or padding.strip(b"\0"):
        return "has no NUL-padded name"
    try:
        name.decode("utf-8")
    except UnicodeDecodeError:
        return "has a name that is not UTF-8"
    return None


def metadata_table_dtype(type_ids: list[int]) -> np.dtype:
    """FFCV's metadata-table record for fields of these type ids: one C-aligned member per field, f0, f1, ..."""
    return np.dtype([(f"f{i}", _TYPES[t][1]) for i, t in enumerate(type_ids)], align=True)


def read_ffcv(file_map: np.ndarray) -> FFCVTables:
    """Translate a file that passed :func:`structure_problem` into beton's tables."""
    header = file_map[: HEADER_DTYPE.itemsize].view(HEADER_DTYPE)[0]
    num_fields, num_samples = int(header["num_fields"]), int(header["num_samples"])
    descriptors = _slice(file_map, HEADER_DTYPE.itemsize, num_fields, FIELD_DTYPE, "field descriptors")
    names = [bytes(d["name"]).split(b"\0")[0].decode("utf-8", "replace") for d in descriptors]
    if len(set(names)) != len(names):
        raise FormatError(f"FFCV field names must be unique, got {names}")
    type_ids = [int(d["type_id"]) for d in descriptors]
    for name, type_id in zip(names, type_ids):
        if type_id not in _TYPES:
            raise FieldError(f"field {name!r} has FFCV type id {type_id}, which beton does not read")
    metadata_dtype = metadata_table_dtype(type_ids)
    metadata = _slice(file_map, HEADER_DTYPE.itemsize + FIELD_DTYPE.itemsize * num_fields, num_samples,
                      metadata_dtype, "metadata table")
    allocations = _allocations(file_map, int(header["alloc_table_ptr"]))
    fields = [_field(type_id, descriptor) for type_id, descriptor in zip(type_ids, descriptors)]
    data_table = np.zeros(num_samples, fmt.data_table_dtype((name, field.metadata_dtype) for name, field in zip(names, fields)))
    columns = []
    for index, (name, type_id) in enumerate(zip(names, type_ids)):
        column = metadata[f"f{index}"]
        kind = _TYPES[type_id][0]
        if kind in ("int", "float"):
            data_table[name]["value"] = column
        elif kind == "rgb_image":
            _check_image_modes(column["mode"], name)
            data_table[name]["mode"] = np.where(column["mode"] == _FFCV_JPEG, IMAGE_MODES["jpg"], IMAGE_MODES["raw"])
            data_table[name]["channels"] = 3
            data_table[name]["height"], data_table[name]["width"] = column["height"], column["width"]
        if kind not in ("int", "float"):
            pointers = column["data_ptr"] if kind == "rgb_image" else column["ptr"] if kind in ("bytes", "json") \
                else column
            sizes = _sizes_of(pointers, allocations, name)
            _check_inside(pointers, sizes, len(file_map), name)
            if kind == "json":  # FFCV appends a NUL separator to every JSON document
                last = np.maximum(pointers + sizes, 1).astype(np.int64) - 1
                sizes = sizes - ((sizes > 0) & (file_map[last] == 0))
            columns.append((pointers, sizes))
    allocation_table = np.zeros((num_samples, len(columns)), fmt.ALLOCATION_DTYPE)
    for position, (pointers, sizes) in enumerate(columns):
        allocation_table[:, position]["offset"], allocation_table[:, position]["size"] = pointers, sizes
    return FFCVTables(num_samples, int(header["page_size"]), names, fields, data_table, allocation_table)


def _slice(file_map: np.ndarray, offset: int, count: int, dtype: np.dtype, what: str) -> np.ndarray:
    end = offset + count * dtype.itemsize
    if end > len(file_map):
        raise FormatError(f"FFCV {what} ends at offset {end}, past the end of the file ({len(file_map)} bytes)")
    return np.frombuffer(file_map[offset:end].tobytes(), dtype)


def _check_image_modes(modes: np.ndarray, name: str) -> None:
    with error_context(field=name):
        first_bad_record((modes != _FFCV_JPEG) & (modes != _FFCV_RAW), lambda s: (
            f"FFCV image mode {modes[s]} is neither {_FFCV_JPEG} (JPEG) nor {_FFCV_RAW} (raw)"))


def _check_inside(pointers: np.ndarray, sizes: np.ndarray, file_size: int, name: str) -> None:
    """Every payload inside the file, before any of its bytes is read (written without overflowing sums)."""
    pointers, sizes = pointers.astype(np.uint64), sizes.astype(np.uint64)
    limit = np.uint64(file_size)
    with error_context(field=name):
        first_bad_record((pointers > limit) | (sizes > limit - np.minimum(pointers, limit)), lambda s: (
            f"FFCV payload at offset {pointers[s]} with size {sizes[s]} lies outside the {file_size}-byte file"))


def _allocations(file_map: np.ndarray, offset: int) -> np.ndarray:
    size = len(file_map) - offset
    if size % ALLOCATION_DTYPE.itemsize:
        raise FormatError(f"FFCV allocation table at offset {offset} is {size} bytes, not a whole number of "
                          f"{ALLOCATION_DTYPE.itemsize}-byte records (truncated?)")
    table = np.frombuffer(file_map[offset:].tobytes(), ALLOCATION_DTYPE)
    return table[np.argsort(table["ptr"], kind="stable")]


def _sizes_of(pointers: np.ndarray, allocations: np.ndarray, name: str) -> np.ndarray:
    """Size of each payload, found by its pointer in the (sorted) allocation table."""
    positions = np.searchsorted(allocations["ptr"], pointers)
    found = positions < len(allocations)
    found[found] = allocations["ptr"][positions[found]] == pointers[found]
    if not found.all():
        sample = int(np.flatnonzero(~found)[0])
        raise locate(FormatError(f"payload pointer {int(pointers[sample])} is not in the FFCV allocation table"),
                     sample=sample, field=name)
    return allocations["size"][positions].astype(np.uint64)


def _field(type_id: int, descriptor: np.void) -> Field:
    kind = _TYPES[type_id][0]
    if kind == "int":
        return IntField()
    if kind == "float":
        return FloatField()
    if kind == "bytes":
        return BytesField()
    if kind == "json":
        return JSONField()
    if kind == "rgb_image":
        return RGBImageField(write_mode="jpg")
    arguments = descriptor["arguments"]
    shape_header = arguments[: NDARRAY_ARGUMENTS_DTYPE.itemsize].view(NDARRAY_ARGUMENTS_DTYPE)[0]
    length = int(shape_header["type_length"])
    try:
        description = bounded_json.loads(bytes(arguments[NDARRAY_ARGUMENTS_DTYPE.itemsize :][:length]))
        dtype = np.dtype([tuple(item) for item in description])[0]
    except (ValueError, TypeError, LookupError, ArithmeticError) as error:
        raise FormatError(f"FFCV NDArrayField arguments cannot be read: {error}") from None
    shape = [int(dim) for dim in shape_header["shape"]]
    while shape and shape[-1] == 0:
        shape.pop()
    return NDArrayField(dtype, tuple(shape))
