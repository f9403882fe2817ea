"""``beton tune``: a raw/JPEG mix balanced for this host (Liquid, Baek et al., APSys 2023).

A loader is limited by whichever of two resources runs out first: CPU time to decode JPEGs, and storage
bandwidth to read bytes. All-JPEG files are decode-bound on fast storage; all-raw files are read-bound. Storing
a chosen fraction of the images raw moves work from the CPU to the storage until both are equally busy:

    CPU time per epoch  = (decode time of the JPEG images + the rest of the pipeline + copying bytes) / cores
    read time per epoch = (bytes of the raw images + bytes of the JPEG images) / read bandwidth
    images per second   = images / max(CPU time, read time)

Which images go raw: those that save the most decode time per extra byte stored (decode time grows with
pixels and JPEG bytes, the extra bytes are raw size minus JPEG size), taken greedily until the prediction
stops improving. The count is then rounded so that every batch of ``batch_size`` holds the same number of raw
images under ``OrderOption.BALANCED`` (see :mod:`beton.order.balanced`).

The host is measured: JPEG decode time on a sample of the file's images (fitted as seconds per pixel and per
byte, at full size and on one core), the rest of a crop pipeline's CPU time per image (a short loader run over
up to 512 of the file's JPEGs, minus their modelled decode time), and read bandwidth by reading the file
after dropping it from the page cache. Pass ``read_bandwidth`` to plan for other storage (a network file
system, a throttled process cache). Images already stored raw in the source stay raw; progressive JPEGs are
kept whole (as baseline-mode records); lossless images cannot be tuned. Decoding at a DCT scale (small crops
of large JPEGs) costs less than the full-size decode measured here, so the plan then errs towards raw.

Raw images are large (a 500x375 photo: 550 KiB raw, about 50 KiB as JPEG), so a plan can multiply the file's
size: each plan states the size before and after, and ``max_bytes`` (``--max-size``) bounds it - the plan is
then the best mix that fits.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

import numba
import numpy as np
import simplejpeg

from beton._cores import usable_cores
from beton.errors import FieldError
from beton.storage.local_file import open_regular
from beton.decoders import RandomResizedCropRGBImageDecoder
from beton.codecs.image_record import IMAGE_MODES
from beton.codecs.jpeg_scans import whole_jpeg
from beton.fields.rgb_image import RGBImageField, decode_stored_image
from beton.loader import Loader
from beton.order.balanced import batch_composition
from beton.fields.base import EncodeContext, Field
from beton.storage.encode import EncodeSpec, encode_value
from beton.storage.file_builder import field_table_bytes
from beton.storage.format import DIGEST_SIZE, DIGESTED_TABLES, HEAP_OFFSET, data_table_dtype
from beton.storage.metadata import encode_metadata
from beton.storage.reader import Reader
from beton.transforms import RandomHorizontalFlip, ToTensor, ToTorchImage
from beton.storage.writer import DatasetWriter

__all__ = ["HostProfile", "MixPlan", "measure_host", "measure_read_bandwidth", "plan_mix", "write_balanced",
           "tune", "balanced_size", "balanced_fields"]

_TABLE_ALIGNMENT = 64  # tables start at multiples of 64 (docs/format.md)
_SAMPLE_IMAGES = 64
_CALIBRATION_IMAGES = 512
_BANDWIDTH_BYTES = 256 << 20
_CHUNK = 8 << 20


@dataclasses.dataclass(frozen=True)
class HostProfile:
    """What the plan needs to know about this host."""

    cores: int  # decoding threads
    decode_seconds_per_pixel: float
    decode_seconds_per_byte: float
    read_bytes_per_second: float
    #: CPU time per image apart from JPEG decoding (crop, resize, flip, batching: the same for raw and JPEG
    #: images), measured by running a RandomResizedCrop pipeline over the file's JPEGs
    pipeline_seconds_per_image: float = 0.0
    #: CPU time per byte read: the process cache copies each byte twice (storage to page, page to batch)
    copy_seconds_per_byte: float = 0.0

    def decode_seconds(self, pixels: np.ndarray, jpeg_bytes: np.ndarray) -> np.ndarray:
        return self.decode_seconds_per_pixel * pixels + self.decode_seconds_per_byte * jpeg_bytes


@dataclasses.dataclass(frozen=True)
class MixPlan:
    """Which samples to store raw, and the predicted images/s of all-JPEG, all-raw and this mix."""

    raw_samples: np.ndarray  # sorted sample indices
    num_samples: int
    batch_size: int
    predicted_images_per_s: dict[str, float]
    size_before: int = 0  # bytes of the source file
    size_after: int = 0  # bytes of the balanced file (computed as the writer lays it out)
    max_bytes: int | None = None  # the bound the plan was asked to keep

    @property
    def growth(self) -> float:
        """How many times larger the balanced file is predicted to be."""
        return self.size_after / self.size_before if self.size_before else 1.0

    @property
    def raw_fraction(self) -> float:
        return len(self.raw_samples) / self.num_samples if self.num_samples else 0.0

    @property
    def raw_per_batch(self) -> int:
        plan = batch_composition(len(self.raw_samples), self.num_samples, self.batch_size)
        return plan[0][0] if plan else 0

    def describe(self) -> str:
        rates = ", ".join(f"{name} {rate:,.0f}" for name, rate in self.predicted_images_per_s.items())
        bound = f" (at most {_mib(self.max_bytes)})" if self.max_bytes is not None else ""
        return (f"store {len(self.raw_samples)} of {self.num_samples} images raw ({self.raw_fraction:.1%}, "
                f"{self.raw_per_batch} per batch of {self.batch_size}); predicted images/s: {rates}\n"
                f"file size: {_mib(self.size_before)} -> {_mib(self.size_after)}{bound}, x{self.growth:.1f}")


def _mib(count: float) -> str:
    return f"{count / (1 << 20):,.1f} MiB"


def measure_read_bandwidth(path: str | os.PathLike[str], max_bytes: int = _BANDWIDTH_BYTES) -> float:
    """Bytes per second reading ``path`` sequentially after asking the kernel to drop it from the page cache."""
    fd = open_regular(os.fspath(path))
    try:
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        buffer = bytearray(_CHUNK)
        total, start = 0, time.perf_counter()
        while total < max_bytes:
            read = os.readv(fd, [buffer])
            if read == 0:
                break
            total += read
        elapsed = time.perf_counter() - start
    finally:
        os.close(fd)
    return total / elapsed if elapsed > 0 and total else float("inf")


def measure_host(reader: Reader, field: str, cores: int | None = None, read_bandwidth: float | None = None,
                 output_size: int = 224, sample_images: int = _SAMPLE_IMAGES) -> HostProfile:
    """Decode cost of this file's JPEGs on this machine, the rest of a crop pipeline's cost per image (a short
    loader run: RandomResizedCrop to ``output_size``, flip, tensors), and the read bandwidth (unless given)."""
    metadata = reader.data_table[field]
    jpegs = np.flatnonzero(np.isin(metadata["mode"], (IMAGE_MODES["jpg"], IMAGE_MODES["progressive"])))
    chosen = jpegs[np.linspace(0, len(jpegs) - 1, min(sample_images, len(jpegs))).astype(np.int64)] \
        if len(jpegs) else jpegs
    pixels, sizes, seconds = [], [], []
    for index in chosen.tolist():
        payload = reader.payload(index, field)
        height, width = int(metadata["height"][index]), int(metadata["width"][index])
        buffer = np.empty((height, width, int(metadata["channels"][index])), np.uint8)
        colorspace = "GRAY" if buffer.shape[2] == 1 else "RGB"
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            simplejpeg.decode_jpeg(payload, colorspace=colorspace, buffer=buffer)
            best = min(best, time.perf_counter() - start)
        pixels.append(height * width)
        sizes.append(payload.size)
        seconds.append(best)
    per_pixel, per_byte = _fit_decode_cost(np.array(pixels, float), np.array(sizes, float), np.array(seconds))
    bandwidth = read_bandwidth if read_bandwidth is not None else measure_read_bandwidth(reader.path)
    cores = cores or usable_cores()
    profile = HostProfile(cores, per_pixel, per_byte, float(bandwidth), copy_seconds_per_byte=_copy_seconds_per_byte())
    return dataclasses.replace(profile, pipeline_seconds_per_image=_pipeline_seconds(reader, field, jpegs,
                                                                                     profile, output_size))


def _copy_seconds_per_byte() -> float:
    """Two memory copies per byte (best of three over 64 MiB), as the process cache makes."""
    source, target = np.ones(64 << 20, np.uint8), np.empty(64 << 20, np.uint8)
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        np.copyto(target, source)
        best = min(best, time.perf_counter() - start)
    return 2 * best / source.size


def _pipeline_seconds(reader: Reader, field: str, jpegs: np.ndarray, profile: HostProfile, output_size: int) -> float:
    """CPU seconds per image of a short RandomResizedCrop run over up to 512 JPEGs (median pass: a typical
    cost, which is what the plan needs, not the best case), minus their modelled decoding."""
    chosen = jpegs[: _CALIBRATION_IMAGES]
    if len(chosen) == 0:
        return 0.0
    pipelines = {name: None for name in reader.fields}
    pipelines[field] = [RandomResizedCropRGBImageDecoder((output_size, output_size)), RandomHorizontalFlip(),
                        ToTensor(), ToTorchImage()]
    with Loader(reader.path, batch_size=64, num_workers=profile.cores, indices=chosen, seed=0,
                pipelines=pipelines) as loader:
        passes = []
        for number in range(4):  # the first pass compiles and warms the page cache; then the median of three
            start = time.perf_counter()
            for _ in loader:
                pass
            if number:
                passes.append(time.perf_counter() - start)
        typical = float(np.median(passes))
    metadata = reader.data_table[field][chosen]
    pixels = metadata["height"].astype(np.float64) * metadata["width"].astype(np.float64)
    sizes = reader.allocation_table[chosen, reader.descriptors[field].payload_column]["size"].astype(np.float64)
    decode = float(profile.decode_seconds(pixels, sizes).mean())
    return max(0.0, typical * profile.cores / len(chosen) - decode)


def _fit_decode_cost(pixels: np.ndarray, sizes: np.ndarray, seconds: np.ndarray) -> tuple[float, float]:
    """Least squares seconds = a * pixels + b * bytes with a, b >= 0 (one term alone if the pair is not)."""
    if len(seconds) == 0:
        return 0.0, 0.0
    (a, b), *_ = np.linalg.lstsq(np.stack([pixels, sizes], axis=1), seconds, rcond=None)
    if a >= 0 and b >= 0:
        return float(a), float(b)
    return float(seconds.sum() / pixels.sum()), 0.0


def plan_mix(reader: Reader, field: str, profile: HostProfile, batch_size: int = 64,
             extra_cpu_seconds_per_image: float = 0.0, max_bytes: int | None = None) -> MixPlan:
    """Choose the raw images (see the module docstring). ``extra_cpu_seconds_per_image``: CPU cost per image
    that the measured crop pipeline does not have (heavier augmentations), the same for raw and JPEG images.
    ``max_bytes``: the balanced file's size may not exceed it (the best mix within it is chosen; all JPEG if
    none fits)."""
    metadata = reader.data_table[field]
    count = reader.num_samples
    sizes = reader.allocation_table[:, reader.descriptors[field].payload_column]["size"].astype(np.float64)
    pixels = metadata["height"].astype(np.float64) * metadata["width"].astype(np.float64)
    raw_sizes = pixels * metadata["channels"].astype(np.float64)
    already_raw = metadata["mode"] == IMAGE_MODES["raw"]
    decode = np.where(already_raw, 0.0, profile.decode_seconds(pixels, sizes))
    extra_bytes = np.where(already_raw, 0.0, raw_sizes - sizes)
    candidates = np.flatnonzero(~already_raw)
    benefit = decode[candidates] / np.maximum(extra_bytes[candidates], 1.0)
    ranked = candidates[np.argsort(-benefit, kind="stable")]

    def images_per_s(raw_taken: np.ndarray) -> np.ndarray:
        """Predicted rate when the first ``raw_taken`` ranked candidates go raw."""
        saved = np.concatenate([[0.0], np.cumsum(decode[ranked])])[raw_taken]
        added = np.concatenate([[0.0], np.cumsum(extra_bytes[ranked])])[raw_taken]
        per_image = profile.pipeline_seconds_per_image + extra_cpu_seconds_per_image
        read = np.where(already_raw, raw_sizes, sizes).sum() + added
        cpu = (decode.sum() - saved + per_image * count + read * profile.copy_seconds_per_byte) / profile.cores
        io = read / profile.read_bytes_per_second
        return count / np.maximum(np.maximum(cpu, io), 1e-12)

    def chosen(taken: int) -> np.ndarray:
        return np.sort(np.concatenate([np.flatnonzero(already_raw), ranked[:taken]])).astype(np.int64)

    rates = images_per_s(np.arange(len(ranked) + 1))
    already = int(already_raw.sum())

    def taken_at(per_batch: int) -> int:  # candidates taken for this many raw images per batch
        return int(np.clip(_raw_count(per_batch, count, batch_size) - already, 0, len(ranked)))

    per_batch = _per_batch(int(np.argmax(rates)) + already, count, batch_size)
    payload_sizes = _payload_sizes(reader, field)
    size = _balanced_size(reader, field, chosen(taken_at(per_batch)), payload_sizes)
    if max_bytes is not None and size > max_bytes:  # the most raw images per batch within the bound
        low, high = 0, per_batch - 1
        while low < high:
            middle = (low + high + 1) // 2
            if _balanced_size(reader, field, chosen(taken_at(middle)), payload_sizes) <= max_bytes:
                low = middle
            else:
                high = middle - 1
        per_batch = low
        size = _balanced_size(reader, field, chosen(taken_at(per_batch)), payload_sizes)
    taken = taken_at(per_batch)
    predicted = {"all JPEG": float(rates[0]), "all raw": float(images_per_s(np.array([len(ranked)]))[0]),
                 "balanced": float(images_per_s(np.array([taken]))[0])}
    return MixPlan(chosen(taken), count, batch_size, predicted, len(reader.file_map), size, max_bytes)


def _per_batch(raw: int, count: int, batch_size: int) -> int:
    """Raw images per full batch nearest ``raw`` in all (with fewer samples than a batch: ``raw`` itself)."""
    return raw if count < batch_size else round(raw * batch_size / count)


def _raw_count(per_batch: int, count: int, batch_size: int) -> int:
    """Raw images in all when every full batch holds ``per_batch`` (the last, partial one its share)."""
    full, rest = divmod(count, batch_size)
    return per_batch if full == 0 else per_batch * full + round(per_batch * rest / batch_size)


class _BalancedSource:
    """The source file's samples with the image field as JPEG bytes, or as pixels for the raw samples."""

    def __init__(self, path: str, field: str, raw_samples: np.ndarray) -> None:
        self.path, self.field, self.raw = path, field, set(raw_samples.tolist())
        self._reader: Reader | None = None

    def __len__(self) -> int:
        return self._open().num_samples

    def _open(self) -> Reader:
        if self._reader is None:  # opened lazily: each writer process maps the file itself
            self._reader = Reader(self.path)
        return self._reader

    def __getitem__(self, index: int) -> tuple[Any, ...]:
        reader = self._open()
        values = []
        for name, field in reader.fields.items():
            record, payload = reader.data_table[name][index], reader.payload(index, name)
            if name != self.field:
                values.append(field.to_python(record, payload))
            elif index in self.raw or record["mode"] == IMAGE_MODES["raw"]:
                values.append(decode_stored_image(record, payload, field.numpy_dtype))
            else:  # the whole JPEG (scan-grouped ones gathered), stored as it is
                values.append(whole_jpeg(payload, record).tobytes())
        return tuple(values)


def balanced_fields(reader: Reader, field: str) -> dict[str, Field]:
    """The balanced file's fields: the source's, with ``field`` storing JPEG bytes as given and pixels raw.

    JPEGs are copied byte for byte (no restart markers added where the source has none, as in FFCV's files),
    so that the balanced file's size is what :func:`balanced_size` computes from the source's."""
    balanced = dataclasses.replace(reader.fields[field], write_mode="balanced", max_resolution=None,
                                   scan_grouped=False, restart_markers=False)
    return {name: balanced if name == field else f for name, f in reader.fields.items()}


def balanced_size(reader: Reader, field: str, raw_samples: np.ndarray) -> int:
    """The size in bytes of the balanced file :func:`write_balanced` writes: its heap packed as the writer packs
    it (a payload crosses no page boundary unless it is larger than a page), then its tables, each aligned."""
    return _balanced_size(reader, field, raw_samples, _payload_sizes(reader, field))


def _payload_sizes(reader: Reader, field: str) -> np.ndarray:
    """(samples, payload columns) sizes of the balanced file's payloads but the raw images': ``field``'s JPEGs
    whole, every other field's payload as the writer encodes the value :class:`_BalancedSource` reads. Those are
    encoded again rather than taken from the source: a document written by another tool (FFCV's JSON, with its
    spaces) is serialised anew, and its size changes, in either direction."""
    sizes = reader.allocation_table["size"].astype(np.int64)
    pieces = reader.fields[field].read_pieces(reader.data_table[field], None)
    if pieces is not None:  # scan-grouped JPEGs are stored whole: their scans and the end marker
        sizes[:, reader.descriptors[field].payload_column] = pieces.sizes()
    for position, (name, other) in enumerate(reader.fields.items()):
        if name == field or not other.has_payload:
            continue
        records, column = reader.data_table[name], reader.descriptors[name].payload_column
        for sample in range(reader.num_samples):
            value = other.to_python(records[sample], reader.payload(sample, name))
            payload = encode_value(other, value, EncodeContext(sample, position, 0)).payload  # the writer's seed
            sizes[sample, column] = memoryview(payload).nbytes
    return sizes


def _balanced_size(reader: Reader, field: str, raw_samples: np.ndarray, payload_sizes: np.ndarray) -> int:
    column = reader.descriptors[field].payload_column
    records = reader.data_table[field]
    sizes = payload_sizes.copy()
    raw = records["height"].astype(np.int64) * records["width"] * records["channels"] * \
        reader.fields[field].numpy_dtype.itemsize
    sizes[raw_samples, column] = raw[raw_samples]
    heap = _packed_heap_size(sizes.ravel(), reader.page_size)
    fields = balanced_fields(reader, field)
    data_dtype = data_table_dtype((name, f.metadata_dtype) for name, f in fields.items())
    spec = EncodeSpec(reader.path, tuple(fields), tuple(fields.values()), data_dtype, 0)
    metadata = encode_metadata(reader.metadata) or b"{}"  # a file of the current version always has the table
    pages = -(-heap // reader.page_size)
    tables = [len(field_table_bytes(spec)), reader.num_samples * data_dtype.itemsize, sizes.size * 16, pages * 4,
              len(metadata), (pages + len(DIGESTED_TABLES)) * DIGEST_SIZE]  # the digest table: pages', tables'
    position = HEAP_OFFSET + heap
    for table in tables:
        position += -position % _TABLE_ALIGNMENT + table
    return position


@numba.njit(cache=True)
def _packed_heap_size(sizes: np.ndarray, page_size: int) -> int:
    position = 0
    for size in sizes:
        used = position % page_size
        if used and used + size > page_size:
            position += page_size - used
        position += size
    return position


def write_balanced(source: str | os.PathLike[str], output: str | os.PathLike[str], field: str,
                   raw_samples: np.ndarray, num_workers: int = -1, progress: bool = True) -> None:
    """Copy ``source`` to ``output`` with ``raw_samples`` of ``field`` stored raw, other JPEGs as they are."""
    with Reader(source) as reader:
        fields = balanced_fields(reader, field)
        page_size = reader.page_size
        metadata = reader.metadata
    writer = DatasetWriter(output, fields, num_workers=num_workers, page_size=page_size, progress=progress,
                           metadata=metadata)
    writer.from_indexed_dataset(_BalancedSource(os.fspath(source), field, np.asarray(raw_samples, np.int64)))


def image_field(reader: Reader, field: str | None) -> str:
    """The image field to tune: the one named, or the file's only RGBImageField."""
    images = [name for name, f in reader.fields.items() if isinstance(f, RGBImageField)]
    if not images:
        described = ", ".join(f"{name!r} ({type(f).__name__})" for name, f in reader.fields.items())
        raise FieldError(f"{reader.path} has no image field to tune: tune mixes raw and JPEG images of an "
                         f"RGBImageField, and its fields are {described}")
    if field is None and len(images) == 1:
        return images[0]
    if field in images:
        return field
    if field is not None:
        raise FieldError(f"{reader.path}: {field!r} is not an image field; image fields: {images}")
    raise FieldError(f"{reader.path} has {len(images)} image fields: name the one to tune (field=..., --field); "
                     f"image fields: {images}")


def tune(source: str | os.PathLike[str], output: str | os.PathLike[str] | None = None, field: str | None = None,
         batch_size: int = 64, cores: int | None = None, read_bandwidth: float | None = None,
         output_size: int = 224, extra_cpu_seconds_per_image: float = 0.0, num_workers: int = -1,
         progress: bool = True, max_bytes: int | None = None) -> tuple[HostProfile, MixPlan]:
    """Measure this host, plan the mix for ``source`` and, if ``output`` is given, write the balanced file
    (its metadata carried over). ``max_bytes`` bounds the balanced file's size (see :func:`plan_mix`)."""
    with Reader(source) as reader:
        name = image_field(reader, field)
        if reader.fields[name].channels == 4 or reader.fields[name].dtype != "uint8":
            raise FieldError(f"{reader.path}: field {name!r} cannot hold JPEGs (4 channels or uint16)")
        if np.any(reader.data_table[name]["mode"] == IMAGE_MODES["lossless"]):
            raise FieldError(f"{reader.path}: field {name!r} holds lossless images; tune mixes raw and JPEG")
        if np.all(reader.data_table[name]["mode"] == IMAGE_MODES["raw"]):
            raise FieldError(f"{reader.path}: every image of field {name!r} is stored raw already: there is no JPEG "
                             "decoding to trade for reading, so nothing to tune")
        profile = measure_host(reader, name, cores, read_bandwidth, output_size)
        plan = plan_mix(reader, name, profile, batch_size, extra_cpu_seconds_per_image, max_bytes)
    if output is not None:
        write_balanced(source, output, name, plan.raw_samples, num_workers, progress)
    return profile, plan
