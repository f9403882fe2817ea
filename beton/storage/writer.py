"""DatasetWriter: turn an indexed dataset or an iterable into one .beton file.

Encoding (the expensive part: array copies, JSON, image compression) runs in worker processes, a chunk of
consecutive samples per task; the parent receives chunks in order and alone lays out the file. Hence samples
are stored in dataset order and the file is byte-identical whatever ``num_workers`` is.

Failure behaviour: a sample that cannot be encoded raises :class:`~beton.errors.EncodeError` naming the sample
and field; a dataset that raises gives :class:`~beton.errors.DatasetError` with the sample index; a worker
process that dies, or a write to the file that fails (a full disk), gives :class:`~beton.errors.WriterError`
instead of a hang or a bare ``OSError``. In every case the temporary file is deleted and the target path is
left as it was. With ``on_error="skip"`` a sample whose value cannot be read (``DatasetError``) or encoded
(``EncodeError``) is left out instead, and the :class:`WriteReport` that writing returns lists it with the reason.

Signals that end the writing process:

* **SIGTERM** (the usual "please stop" of job schedulers) and **SIGHUP** (a closed terminal or SSH session) are
  handled like Ctrl-C while a write runs in the main thread: the worker processes are stopped, the temporary file
  is deleted, and then the signal is raised again with its previous handler, so the process still ends as the
  sender asked. This applies only while the signal has its default action (which would kill the process without
  any of that cleanup); a handler of the program's own, or SIG_IGN (``nohup``), is left alone.
* **SIGKILL** (the OOM killer), or a crash, leaves nothing to run in this process. The worker processes end with
  it anyway, at once (:mod:`beton.storage.worker_lifetime`: a parent-death signal on Linux, and a pipe they
  watch). The temporary file stays behind; the next write to the same path removes it, and any other whose
  writer has ended, never the file of a write still running
  (:func:`~beton.storage.file_builder.remove_stale_temporaries`).
* A worker process sent SIGTERM, SIGHUP or SIGKILL dies at once; the write then fails with a WriterError as for
  any dead worker.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import multiprocessing
import operator
import os
import signal
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from beton.storage import format as fmt
from beton._cores import resolve_workers
from beton.storage.encode import (ChunkItem, EncodedChunk, EncodeSpec, SampleProblem, SampleWarning, dataset_error,
                                  encode_chunk, sample_problem, warn_sample)
from beton.storage.file_builder import STOP_SIGNALS, FileBuilder, field_table_bytes, sigterm_cleans_up, write_error
from beton.storage.metadata import encode_metadata
from beton.storage.remote.options import RemoteOptions, remote_or_default
from beton.storage.worker_lifetime import ParentLink, die_with_parent, parent_link
from beton.errors import FieldError, WriterError, locate
from beton.fields.base import Field
from beton.fields.registry import as_beton_field
from beton.random import writer_shuffle

__all__ = ["DatasetWriter", "WriteReport", "SampleProblem", "SampleWarning", "sample_problem", "warn_sample",
           "ON_ERROR", "shard_range"]

DEFAULT_CHUNKSIZE = 100
#: What the writer does with a sample whose value cannot be read or encoded: fail the write, or leave it out.
ON_ERROR = ("fail", "skip")


@dataclasses.dataclass(frozen=True)
class WriteReport:
    """What one write did: samples written, samples left out (``on_error="skip"``) and what samples reported
    with :func:`~beton.storage.encode.warn_sample`, each naming the sample's index in the dataset, and the
    file's size in bytes."""

    path: str
    num_samples: int
    skipped: tuple[SampleProblem, ...]
    warnings: tuple[SampleProblem, ...]
    seconds: float
    size: int


class DatasetWriter:
    """Writes samples into a .beton file.

    Args:
        path: the file to create; replaced atomically when writing succeeds, untouched when it fails. Its mode
            is 0666 minus the umask, as ``open()`` gives a new file. A URL (``s3://bucket/train.beton``, anything
            fsspec writes) is written as a local temporary file and uploaded once complete: nothing is at the URL
            until then, and a write or upload that fails leaves it as it was (docs/remote.md).
        fields: field name -> :class:`~beton.fields.Field`, in the order of each sample's tuple.
        num_workers: encoding processes; -1 uses every usable core, 0 or 1 encodes in this process.
        page_size: heap page size in bytes, a power of two of at least 256 (default 8 MiB).
        seed: seeds anything random in encoding, per sample and field.
        progress: show a tqdm progress bar.
        start_method: multiprocessing start method for the workers (default "fork" where available, so
            datasets need not be picklable).
        metadata: a JSON object describing the whole dataset (name, class names, source, license...), read
            back as ``Reader.metadata``; at most 16 MiB of JSON (see docs/format.md).
        on_error: "fail" (default): a sample that cannot be read or encoded fails the write; "skip": it is left
            out, and the report that ``from_indexed_dataset``/``from_iterable`` return lists it (if every sample
            is skipped, the write fails with a WriterError whose ``skipped`` lists them).
        remote: how a ``path`` that is a URL is reached (:class:`~beton.storage.remote.RemoteOptions`: its
            ``storage_options`` and ``retries`` for the upload); a local path ignores it.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        fields: Mapping[str, Field],
        page_size: int = fmt.DEFAULT_PAGE_SIZE,  # FFCV's positional order: page_size, then num_workers
        num_workers: int = -1,
        *,
        seed: int = 0,
        progress: bool = True,
        start_method: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        on_error: str = "fail",
        remote: RemoteOptions | None = None,
    ) -> None:
        self.path = os.fspath(path)
        self.remote = remote_or_default(remote)
        _check_fields(fields)
        if on_error not in ON_ERROR:
            raise ValueError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")
        self._metadata = encode_metadata(metadata)  # serialised now: later changes to the caller's dict do not count
        fields = {name: as_beton_field(field) for name, field in fields.items()}  # other contracts' fields, adapted
        # Some records hold a handle numbered by the sample's place in the file when it was encoded (FFCV's
        # pointers); a sample skipped before it moves it, and _write renumbers the handle (see _move_records).
        self._moving = {name: field for name, field in fields.items() if field.holds_sample_places}
        if not fmt.is_valid_page_size(page_size):
            raise FieldError(
                f"page_size must be a power of two between {fmt.MIN_PAGE_SIZE} and {fmt.MAX_PAGE_SIZE}, "
                f"got {page_size}"
            )
        names = tuple(fields)
        field_objects = tuple(fields.values())
        data_dtype = fmt.data_table_dtype((name, field.metadata_dtype) for name, field in fields.items())
        self._spec = EncodeSpec(self.path, names, field_objects, data_dtype, int(seed), on_error == "skip")
        try:  # built once, here, so that arguments that cannot be stored fail before any sample is encoded
            self._field_table = field_table_bytes(self._spec)
        except (TypeError, ValueError) as error:
            raise FieldError(f"field arguments must be JSON-serialisable: {error}") from None
        self.page_size = page_size
        self.num_workers = resolve_workers(num_workers, minimum=0)
        self.progress = progress
        self.start_method = start_method or (
            "fork" if "fork" in multiprocessing.get_all_start_methods() else None
        )

    @property
    def fields(self) -> dict[str, Field]:
        return dict(zip(self._spec.names, self._spec.fields))

    @property
    def on_error(self) -> str:
        return "skip" if self._spec.skip_errors else "fail"

    def from_indexed_dataset(
        self, dataset: Any, indices: Sequence[int] | None = None, chunksize: int = DEFAULT_CHUNKSIZE,
        shuffle_indices: bool = False, *, start: int | None = None, end: int | None = None,
        shard: tuple[int, int] | None = None,
    ) -> WriteReport:
        """Write ``dataset[i]`` for i in ``indices`` (default: all of ``range(len(dataset))``), in that order.

        Each ``dataset[i]`` must be a tuple with one value per field, in the fields' order. ``shuffle_indices``
        (FFCV's) stores them in an order shuffled by the writer's ``seed``, so the file is still the same for
        any ``num_workers``.

        Shard-parallel writing (docs/shards.md): ``shard=(k, n)`` writes only the k-th of n contiguous parts of
        that order (:func:`shard_range` gives its bounds), ``start``/``end`` the part ``[start, end)`` of it
        (either one, not both). Sample i of the file is sample ``start + i`` of the whole order, and anything
        random in encoding is keyed by that position: the n files, merged in order (``beton merge``), are byte
        for byte the file one write of the whole order makes (with the same fields, seed, page size and
        metadata). The order is computed in full first, so ``shuffle_indices`` shuffles the whole dataset and
        each shard writes its part of the same permutation.
        """
        order = range(len(dataset)) if indices is None else [int(index) for index in indices]
        if shuffle_indices:
            order = writer_shuffle(self._spec.seed, order)
        first, last = _part_bounds(len(order), start, end, shard)
        spec = dataclasses.replace(self._spec, first_sample=first)
        items = (ChunkItem(position, index) for position, index in enumerate(order[first:last]))
        return self._write(_chunks(items, chunksize), last - first, dataset, spec)

    def from_iterable(
        self, iterable: Iterable[Any], length: int | None = None, chunksize: int = DEFAULT_CHUNKSIZE
    ) -> WriteReport:
        """Write every sample the iterable yields, in order; ``length`` only sizes the progress bar."""
        return self._write(_chunks(_iterate_samples(self.path, iterable), chunksize), length, None, self._spec)

    def from_webdataset(self, shards: Sequence[str], pipeline: Callable[[Any], Iterable[Any]],
                        chunksize: int = DEFAULT_CHUNKSIZE) -> WriteReport:
        """FFCV's ``from_webdataset``: write the samples ``pipeline(webdataset.WebDataset(shard))`` yields for
        every shard in ``shards``, in order (one tuple per sample, one value per field).

        Needs the ``webdataset`` package. For tar shards without writing a pipeline, ``beton convert
        webdataset`` (``beton.convert.webdataset``) groups members by key and maps extensions to fields.
        """
        try:
            import webdataset
        except ImportError:
            raise WriterError("from_webdataset needs the webdataset package: pip install webdataset") from None
        shards = [shards] if isinstance(shards, str) else list(shards)

        def samples() -> Iterator[Any]:
            for shard in shards:
                yield from pipeline(webdataset.WebDataset(shard, shardshuffle=False))

        return self.from_iterable(samples(), chunksize=chunksize)

    def _write(self, chunks: Iterator[list[ChunkItem]], total: int | None, dataset: Any,
               spec: EncodeSpec) -> WriteReport:
        start = time.perf_counter()
        skipped: list[SampleProblem] = []
        warned: list[SampleProblem] = []
        with sigterm_cleans_up():
            try:
                builder = FileBuilder(spec, self.page_size, self._metadata, field_table=self._field_table,
                                      remote=self.remote)
            except OSError as error:
                raise write_error(self.path, error) from error
            encoded = self._encoded_chunks(chunks, dataset, spec)
            bar = tqdm(total=total, unit=" samples", disable=not self.progress, desc=os.path.basename(self.path))
            try:
                for chunk in encoded:
                    _move_records(chunk, builder.num_samples, self._moving)
                    builder.add(chunk)
                    skipped += chunk.skipped
                    warned += chunk.warned
                    bar.update(chunk.num_items)
                    if chunk.skipped:
                        bar.set_postfix(skipped=len(skipped), refresh=False)
                if skipped and builder.num_samples == 0:
                    raise _all_skipped(self.path, skipped)
                builder.commit()
            except OSError as error:  # the dataset's and the fields' own errors arrive wrapped, not as OSError
                builder.abort()
                raise write_error(self.path, error) from error
            except BaseException:
                builder.abort()
                raise
            finally:
                encoded.close()  # stops and joins the worker processes now, also when an error is propagating
                bar.close()
        return WriteReport(self.path, builder.num_samples, tuple(skipped), tuple(warned), time.perf_counter() - start,
                           builder.file_size)

    def _encoded_chunks(self, chunks: Iterator[list[ChunkItem]], dataset: Any,
                        spec: EncodeSpec) -> Iterator[EncodedChunk]:
        if self.num_workers <= 1:
            for chunk in chunks:
                yield encode_chunk(spec, dataset, chunk)
            return
        yield from self._encode_in_workers(chunks, dataset, spec)

    def _encode_in_workers(self, chunks: Iterator[list[ChunkItem]], dataset: Any,
                           spec: EncodeSpec) -> Iterator[EncodedChunk]:
        for field in spec.fields:
            field.prepare_encoding()
        context = multiprocessing.get_context(self.start_method)
        with parent_link(context) as link:  # workers end with this process, even one killed by SIGKILL
            pool = ProcessPoolExecutor(
                self.num_workers, mp_context=context, initializer=_init_worker, initargs=(spec, dataset, link)
            )
            pending: collections.deque[tuple[Future, list[ChunkItem]]] = collections.deque()
            try:
                for chunk in chunks:
                    pending.append((pool.submit(_encode_in_worker, chunk), chunk))
                    if len(pending) >= 2 * self.num_workers:  # bound memory: only a few chunks in flight
                        yield _result(*pending.popleft(), self.path)
                while pending:
                    yield _result(*pending.popleft(), self.path)
            finally:
                pool.shutdown(wait=True, cancel_futures=True)


def _move_records(chunk: EncodedChunk, written: int, fields: Mapping[str, Field]) -> None:
    """Give the records of ``fields`` (which hold their samples' places) the places their samples take in the
    file: ``written`` samples precede the chunk, so row r takes place ``written + r``; it was encoded at
    ``chunk.encoded_positions()[r]``, later when samples before it were skipped. Without skips, nothing changes."""
    if not fields:
        return
    offsets = written + np.arange(len(chunk.rows), dtype=np.int64) - chunk.encoded_positions()
    for offset in np.unique(offsets[offsets != 0]):
        rows = np.flatnonzero(offsets == offset)
        for name, field in fields.items():
            records = chunk.rows[name][rows]  # a copy (rows picked by index), renumbered, then put back
            field.move_records(records, int(offset))
            chunk.rows[name][rows] = records


def _all_skipped(path: str, skipped: list[SampleProblem]) -> WriterError:
    """Skipping every sample is no dataset but a bug or the wrong data: the write fails (the target is kept)."""
    first = skipped[0]
    error = WriterError(f"every one of the {len(skipped)} samples was skipped, so nothing was written; the first, "
                        f"sample {first.index}: {first.describe()}")
    error.path, error.skipped = path, tuple(skipped)
    return error


def _result(future: Future, chunk: list[ChunkItem], path: str) -> EncodedChunk:
    try:
        return future.result()
    except BrokenProcessPool:
        raise locate(WriterError(
            f"a writer worker process died while encoding samples {chunk[0].dataset_index}.."
            f"{chunk[-1].dataset_index} (killed, out of memory, or a crash in native code)"
        ), path=path) from None


# The encoding worker's inputs live in this process-local slot, set once by the pool initializer: with the
# "fork" start method the dataset is inherited rather than pickled, so any dataset works. The parent process
# never touches it.
_worker_inputs: dict[str, Any] = {}


def _init_worker(spec: EncodeSpec, dataset: Any, link: ParentLink) -> None:
    # A forked worker inherits the parent's SIGTERM and SIGHUP handlers, which belong to the parent's write: a
    # worker sent either dies at once (the parent then reports a dead worker). One the program ignores (SIGHUP
    # under nohup) stays ignored, as it does in the parent.
    for signum in STOP_SIGNALS:
        if signal.getsignal(signum) is not signal.SIG_IGN:
            signal.signal(signum, signal.SIG_DFL)
    die_with_parent(link)
    _worker_inputs["spec"] = spec
    _worker_inputs["dataset"] = dataset


def _encode_in_worker(chunk: list[ChunkItem]) -> EncodedChunk:
    return encode_chunk(_worker_inputs["spec"], _worker_inputs["dataset"], chunk)


def _iterate_samples(path: str, iterable: Iterable[Any]) -> Iterator[ChunkItem]:
    iterator = iter(iterable)
    for position in itertools.count():
        try:
            value = next(iterator)
        except StopIteration:
            return
        except Exception as error:
            raise dataset_error(path, position, error) from error
        yield ChunkItem(position, position, value, fetch=False)


def _chunks(items: Iterator[ChunkItem], chunksize: int) -> Iterator[list[ChunkItem]]:
    if chunksize < 1:
        raise ValueError(f"chunksize must be at least 1, got {chunksize}")
    while chunk := list(itertools.islice(items, chunksize)):
        yield chunk


def shard_range(num_samples: int, shard: int, num_shards: int) -> tuple[int, int]:
    """The samples ``[start, end)`` of shard ``shard`` of ``num_shards`` over ``num_samples`` samples: contiguous
    parts in order, whose sizes differ by at most one (``start = shard * num_samples // num_shards``). Shards are
    empty when there are more shards than samples."""
    num_samples, shard, num_shards = (_integer(value, name) for value, name in (
        (num_samples, "num_samples"), (shard, "shard"), (num_shards, "num_shards")))
    if num_samples < 0:
        raise ValueError(f"num_samples must be at least 0, got {num_samples}")
    if num_shards < 1 or not 0 <= shard < num_shards:
        raise ValueError(f"shard must be (k, n) with n >= 1 and 0 <= k < n, got ({shard}, {num_shards})")
    return shard * num_samples // num_shards, (shard + 1) * num_samples // num_shards


def _part_bounds(num_samples: int, start: int | None, end: int | None,
                 shard: tuple[int, int] | None) -> tuple[int, int]:
    """[first, last) of the order that one write stores: all of it, a shard of it, or [start, end)."""
    if shard is not None:
        if start is not None or end is not None:
            raise ValueError("give shard=(k, n) or start=/end=, not both")
        if not isinstance(shard, tuple) or len(shard) != 2:
            raise ValueError(f"shard must be a tuple (k, n): shard k of n, got {shard!r}")
        return shard_range(num_samples, *shard)
    first = 0 if start is None else _integer(start, "start")
    last = num_samples if end is None else _integer(end, "end")
    if not 0 <= first <= last <= num_samples:
        raise ValueError(f"start and end must satisfy 0 <= start <= end <= {num_samples} (the samples to write), "
                         f"got start={first}, end={last}")
    return first, last


def _integer(value: Any, name: str) -> int:
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an integer, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer, got {value!r}") from None


def _check_fields(fields: Mapping[str, Field]) -> None:
    if not isinstance(fields, Mapping) or not fields:
        raise FieldError(f"fields must be a non-empty mapping of name -> Field, got {fields!r}")
    for name, field in fields.items():
        if not isinstance(name, str) or not name:
            raise FieldError(f"field names must be non-empty strings, got {name!r}")
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:
            raise FieldError(f"field name {name!r} is not valid UTF-8") from None
        if not isinstance(field, Field):
            raise FieldError(f"field {name!r} must be a Field instance, got {type(field).__name__}")
