"""From per-output lists of operations to an executable plan, in three named passes.

1. :func:`place_steps` - walk each output's operations, deriving every State (errors name the output and
   operation), and give each non-in-place numpy output a buffer.
2. :func:`group_stages` - cut each output's steps into runs of one kind (jit / sample / batch); run the
   non-jit runs until every output waits at a jit run, then fuse all those jit runs into one stage; repeat.
3. :func:`make_stage_source` + :func:`compile_stage` - generate the fused stage's Python source, write it to a
   module file in the kernel cache named by its hash, run it as that module and let numba compile it with
   ``nogil=True, cache=True``: a later process finds the compiled code on disk (numba cannot cache functions
   made by ``exec`` without a file). The kernel cache must be a directory only this user can write, and the
   module's code is compiled from the generated source itself, never read back from the file
   (:func:`_import_stage_module`). A kernel that cannot be imported by name (defined in ``__main__`` or
   inside a function) still works, through ``exec``, without the disk cache; ``explain()`` says so. Per-sample
   kernels share loops over the batch; a kernel that takes rows (``JitOperation.kernel_takes_rows``: operations
   written to FFCV's contract) is called once between two loops, so it fuses too.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import inspect
import os
import sys
import types
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Literal

import numba
import numpy as np

from beton.errors import CacheDirError, PipelineError
from beton.pipeline.operation import (
    BatchOperation,
    JitOperation,
    Operation,
    SampleOperation,
    SourceState,
    State,
)
from beton.private_dirs import open_private_directory, read_regular_file, replace_with, write_new_file

__all__ = ["Step", "Stage", "Plan", "build_plan", "resolve_follows", "default_cache_dir", "make_stage_source",
           "open_kernel_cache", "Compiler"]

StageKind = Literal["jit", "sample", "batch"]
_STAGE_MODULE_PREFIX = "beton_stage_"


@dataclasses.dataclass(frozen=True)
class Step:
    """One operation in place: which output, which position, how it runs, its States and its output buffer."""

    output: int
    position: int
    operation: Operation
    kind: StageKind  # from stage_kind(operation, input_state), derived once by place_steps
    input_state: State | SourceState
    output_state: State
    buffer: int | None  # index into Plan.buffers; None for operations whose result is not a preallocated array
    input_buffer: int | None  # the buffer holding this step's input, None for the source or a Python value
    lengths_buffer: int | None = None  # padded output: the buffer of the samples' lengths
    input_lengths_buffer: int | None = None  # padded input: the buffer of its lengths
    #: (output, position) of the steps whose random keys this one receives (Operation.follows); () for its own
    key_sources: tuple[tuple[int, int], ...] = ()
    #: an in-place compiled step whose input is no slot buffer (a Python-level step's result): its kernel reads
    #: and writes its own buffer, so the executor first copies the input there
    copies_input: bool = False


def stage_kind(operation: Operation, previous: State | SourceState) -> StageKind:
    """How the operation runs on this input: its own choice, else by its class."""
    chosen = operation.stage_kind(previous)
    if chosen is not None:
        return chosen
    if isinstance(operation, JitOperation):
        return "jit"
    if isinstance(operation, SampleOperation):
        return "sample"
    if isinstance(operation, BatchOperation):
        return "batch"
    raise PipelineError(f"{operation!r} is not a JitOperation, SampleOperation or BatchOperation")


@dataclasses.dataclass(frozen=True)
class Stage:
    kind: StageKind
    steps: tuple[Step, ...]
    function: Any = None  # the compiled fused function, for jit stages
    source: str = ""  # its generated source, for explain()
    cached: bool = False  # whether numba can cache it on disk


@dataclasses.dataclass(frozen=True)
class BufferSpec:
    shape: tuple[int, ...]  # per sample
    dtype: np.dtype
    #: page-locked where CUDA is available (:meth:`Operation.pinned_output`), for fast copies to a GPU
    pinned: bool = False


@dataclasses.dataclass(frozen=True)
class Plan:
    output_names: tuple[str, ...]
    field_names: tuple[str, ...]  # the stored field each output reads
    stages: tuple[Stage, ...]
    buffers: tuple[BufferSpec, ...]
    final_states: tuple[State, ...]

    def explain(self) -> str:
        lines = []
        for number, stage in enumerate(self.stages):
            names = ", ".join(f"{self.output_names[s.output]}[{s.position}] {s.operation!r}" for s in stage.steps)
            cached = " (disk-cached)" if stage.cached else " (not disk-cached: kernel not importable)"
            lines.append(f"stage {number}: {stage.kind}{cached if stage.kind == 'jit' else ''}: {names}")
            if stage.source:
                lines.append("    " + stage.source.replace("\n", "\n    ").rstrip())
        for name, state in zip(self.output_names, self.final_states):
            lines.append(f"output {name!r}: {state.describe()}")
        return "\n".join(lines)


def build_plan(
    outputs: Sequence[tuple[str, str, Any, Sequence[Operation]]], cache_dir: str, fuse: bool = True,
    metadata: dict[str, np.ndarray] | None = None, lengths: dict[str, np.ndarray] | None = None,
) -> Plan:
    """``outputs``: (output name, field name, field, operations) per output. Returns the compiled plan.

    ``metadata``: field name -> its data-table column, for decoders that inspect the dataset (image sizes);
    ``lengths``: field name -> each sample's length, for fields that have one (``SourceState.lengths``).

    ``fuse=False`` compiles every jit operation as a stage of its own: only to measure what fusion gains.
    """
    buffers: list[BufferSpec] = []
    metadata, lengths = metadata or {}, lengths or {}
    followed = resolve_follows(outputs)
    sources = [SourceState(field, field_name, metadata.get(field_name),
                           tuple(SourceState(outputs[o][2], outputs[o][1], metadata.get(outputs[o][1]),
                                             lengths=lengths.get(outputs[o][1]))
                                 for o, _ in followed.get((index, 0), ())), lengths.get(field_name))
               for index, (_, field_name, field, _) in enumerate(outputs)]
    steps = [place_steps(index, name, sources[index], operations, buffers, followed)
             for index, (name, _, _, operations) in enumerate(outputs)]
    stages = [
        compile_stage(group, cache_dir) if group[0].kind == "jit" else Stage(group[0].kind, tuple(group))
        for group in group_stages(steps, fuse)
    ]
    return Plan(
        output_names=tuple(name for name, *_ in outputs),
        field_names=tuple(field_name for _, field_name, *_ in outputs),
        stages=tuple(stages),
        buffers=tuple(buffers),
        final_states=tuple(output_steps[-1].output_state for output_steps in steps),
    )


def resolve_follows(
    outputs: Sequence[tuple[str, str, Any, Sequence[Operation]]],
) -> dict[tuple[int, int], tuple[tuple[int, int], ...]]:
    """(output, position) -> (output, position) of each operation it follows (:meth:`Operation.follows`).

    Operations are found by identity: the follower names the very instances placed in the other pipelines."""
    places: dict[int, list[tuple[int, int]]] = collections.defaultdict(list)
    for output, (_, _, _, operations) in enumerate(outputs):
        for position, operation in enumerate(operations):
            places[id(operation)].append((output, position))
    resolved = {}
    for output, (name, _, _, operations) in enumerate(outputs):
        for position, operation in enumerate(operations):
            follows = operation.follows() if isinstance(operation, Operation) else ()
            if not follows:
                continue
            sources = []
            for leader in follows:
                found = places.get(id(leader), [])
                if len(found) != 1:
                    where = "no pipeline of this loader holds it" if not found else \
                        f"it sits in {len(found)} places: {[outputs[o][0] + f'[{p}]' for o, p in found]}"
                    raise PipelineError(f"pipeline {name!r}[{position}]: {operation!r} follows {leader!r}, but "
                                        f"{where}; give it the instance placed in exactly one pipeline")
                sources.append(found[0])
            resolved[output, position] = tuple(sources)
    return resolved


def place_steps(
    output: int, name: str, source: SourceState, operations: Sequence[Operation], buffers: list[BufferSpec],
    followed: dict[tuple[int, int], tuple[tuple[int, int], ...]] | None = None,
) -> list[Step]:
    if not operations or not (operations[0].is_decoder or operations[0].decodes_when_first):
        raise PipelineError(f"pipeline {name!r} must start with a decoder for field {source.field_name!r} (an "
                            "operation whose class sets is_decoder = True: its input is the stored field)")
    state: State | SourceState = source
    current: tuple[int | None, int | None] = (None, None)
    steps = []
    for position, operation in enumerate(operations):
        if not isinstance(operation, Operation):
            raise PipelineError(f"pipeline {name!r}[{position}]: {operation!r} is not an Operation")
        operation = operation.for_source(source)
        if position and operation.is_decoder:
            raise PipelineError(f"pipeline {name!r}[{position}]: decoder {operation!r} must come first")
        if isinstance(state, State) and state.layout not in operation.layouts:
            raise PipelineError(f"pipeline {name!r}[{position}]: {operation!r} takes "
                                f"{' or '.join(sorted(operation.layouts))} batches, got {state.describe()}")
        try:
            next_state = operation.output_state(state)
        except PipelineError as error:
            raise PipelineError(f"pipeline {name!r}[{position}]: {error}") from None
        kind = stage_kind(operation, state)
        placed = _buffers_for(operation, kind, next_state, current, buffers, state)
        copies_input = (kind == "jit" and isinstance(state, State) and current[0] is None and placed[0] is not None
                        and operation.in_place(state))
        steps.append(Step(output=output, position=position, operation=operation, kind=kind, input_state=state,
                          output_state=next_state, buffer=placed[0], input_buffer=current[0],
                          lengths_buffer=placed[1], input_lengths_buffer=current[1],
                          key_sources=(followed or {}).get((output, position), ()), copies_input=copies_input))
        state, current = next_state, placed
    return steps


def _buffers_for(operation: Operation, kind: StageKind, state: State, current: tuple[int | None, int | None],
                 buffers: list[BufferSpec], previous: Any) -> tuple[int | None, int | None]:
    """(values buffer, lengths buffer) of the step's output; lengths only for padded batches."""
    if kind == "batch" or state.kind != "numpy":
        return None, None  # batch operations return their result; it is not preallocated
    if current[0] is not None and operation.in_place(previous):
        return current
    buffers.append(BufferSpec(tuple(state.shape), np.dtype(state.dtype), operation.pinned_output(previous)))
    if state.layout == "dense":
        return len(buffers) - 1, None
    if state.layout != "padded":
        raise PipelineError(f"{operation!r}: a per-sample operation cannot output a {state.layout} batch")
    buffers.append(BufferSpec((), np.dtype(np.int64)))
    return len(buffers) - 2, len(buffers) - 1


def group_stages(steps_per_output: Sequence[Sequence[Step]], fuse: bool = True) -> list[list[Step]]:
    """Order the steps into stages, fusing as many jit runs as possible.

    Non-jit steps are emitted first, output by output, until every pipeline waits at a jit run (or is done);
    then all those jit runs become one fused stage. Repeat. Outputs are independent, so any interleaving that
    keeps each output's own order is valid; this one gives the fewest compiled calls per batch.
    """
    if not fuse:
        return [[step] for steps in steps_per_output for step in steps]
    queues = [collections.deque(_runs(steps)) for steps in steps_per_output]
    groups: list[list[Step]] = []
    while any(queues):
        for queue in queues:
            while queue and queue[0][0].kind != "jit":
                groups.extend([step] for step in queue.popleft())
        fused = [step for queue in queues if queue for step in queue.popleft()]
        if fused:
            groups.append(fused)
    return groups


def _runs(steps: Sequence[Step]) -> list[list[Step]]:
    runs: list[list[Step]] = []
    for step in steps:
        if runs and runs[-1][-1].kind == step.kind == "jit":
            runs[-1].append(step)
        else:
            runs.append([step])
    return runs


def _kernel_import(kernel: Any) -> tuple[str, str] | None:
    """(module, name) to import the kernel from, if a fresh module can import it by name."""
    function = getattr(kernel, "py_func", None)
    if function is None:
        raise PipelineError(f"kernel {kernel!r} is not a numba-compiled function")
    module, name = function.__module__, function.__qualname__
    if module == "__main__" or "." in name:
        return None
    if getattr(sys.modules.get(module), name, None) is not kernel:
        return None
    return module, name


def make_stage_source(steps: Sequence[Step], cache: bool) -> tuple[str, dict[str, Any]]:
    """The fused stage's source and the globals it needs (kernels that cannot be imported go in globals).

    Per-sample kernels run in a loop over the batch; a kernel that takes rows (``kernel_takes_rows``) is called
    once, between loops. Each output keeps its own order; the outputs' per-sample kernels that are ready share
    one loop (see :func:`_stage_body`)."""
    imports, globals_, parameters, calls = [], {}, [], []
    for number, step in enumerate(steps):
        kernel = step.operation.kernel()
        location = _kernel_import(kernel) if cache else None
        alias = f"kernel_{number}"
        if location:
            imports.append(f"from {location[0]} import {location[1]} as {alias}")
        else:
            globals_[alias] = kernel
        parameters += [f"src_{number}", f"dst_{number}", f"key_{number}", f"args_{number}"]
        position = "start, end, samples" if _takes_rows(step) else "i, sample"
        calls.append(f"{alias}(src_{number}, dst_{number}, {position}, key_{number}, args_{number})"
                     f"  # {_one_line(repr(step.operation))}")
    source = "\n".join([
        "# Generated by beton.pipeline.compiler: one fused stage. Do not edit; the name is a content hash.",
        "import numba",
        *imports,
        "",
        "",
        f"@numba.njit(nogil=True, cache={cache})",
        f"def stage(start, end, samples, {', '.join(parameters)}):",
        *_stage_body(steps, calls),
        "",
    ])
    return source, globals_


def _takes_rows(step: Step) -> bool:
    return bool(getattr(step.operation, "kernel_takes_rows", False))


def _stage_body(steps: Sequence[Step], calls: Sequence[str]) -> list[str]:
    """The stage's lines: a loop with every output's next per-sample calls, then every output's next rows calls;
    again until all are placed. Without rows kernels, one loop."""
    pending: dict[int, collections.deque[int]] = collections.defaultdict(collections.deque)
    for number, step in enumerate(steps):
        pending[step.output].append(number)
    lines: list[str] = []
    while any(pending.values()):
        looped = [number for queue in pending.values() for number in _take(queue, lambda n: not _takes_rows(steps[n]))]
        if looped:
            lines += ["    for i in range(start, end):", "        sample = samples[i]"]
            lines += [f"        {calls[number]}" for number in looped]
        lines += [f"    {calls[number]}" for queue in pending.values()
                  for number in _take(queue, lambda n: _takes_rows(steps[n]))]
    return lines


def _take(queue: collections.deque[int], wanted: Callable[[int], bool]) -> list[int]:
    taken = []
    while queue and wanted(queue[0]):
        taken.append(queue.popleft())
    return taken


def _one_line(text: str, limit: int = 160) -> str:
    """A comment-safe summary: an operation's repr may span lines (arrays among its fields)."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def compile_stage(steps: Sequence[Step], cache_dir: str) -> Stage:
    cacheable = all(_kernel_import(step.operation.kernel()) for step in steps)
    source, globals_ = make_stage_source(steps, cacheable)
    if cacheable:
        function = _import_stage_module(source, steps, cache_dir).stage
    else:
        namespace = dict(globals_)
        exec(compile(source, "<beton stage>", "exec"), namespace)
        function = namespace["stage"]
    return Stage("jit", tuple(steps), function, source, cacheable)


def _import_stage_module(source: str, steps: Sequence[Step], cache_dir: str) -> Any:
    """The stage's module, run from ``source`` itself and backed by a file of that text in the kernel cache.

    The module's code is compiled from the source generated here, never read back from disk, so a file planted
    under the stage's name runs nothing; the file exists for numba's disk cache (``__pycache__`` beside it), and
    is made to hold exactly ``source`` first (a different file, link or other user's entry is replaced without
    being followed), so that numba's cached code always belongs to this source. The directory must be this
    user's alone (:func:`open_kernel_cache`)."""
    digest = hashlib.sha256(source.encode())
    digest.update(numba.__version__.encode())
    for module in sorted({step.operation.kernel().py_func.__module__ for step in steps}):
        # numba's cache does not notice when an imported kernel's module changes: put its text in the name.
        digest.update(_module_text(module))
    module_name = _STAGE_MODULE_PREFIX + digest.hexdigest()[:24]
    path = os.path.join(cache_dir, module_name + ".py")
    directory = open_kernel_cache(cache_dir)  # checked even when this process has the module: the same answer
    try:
        _store_module(directory, module_name + ".py", source.encode("utf-8"), path)
    finally:
        os.close(directory)
    if module_name in sys.modules:
        return sys.modules[module_name]
    module = types.ModuleType(module_name)
    module.__file__ = path
    exec(compile(source, path, "exec"), module.__dict__)
    return sys.modules.setdefault(module_name, module)


def open_kernel_cache(cache_dir: str) -> int:
    """A descriptor of the kernel cache directory, created (mode 0700) if missing, and numba's ``__pycache__`` in
    it: both must be directories of this user's that group and others cannot write (the directory named may be
    a link; ``__pycache__`` may not), else :class:`~beton.errors.CacheDirError`. Refused rather than replaced by
    a private directory elsewhere: a kernel cache that others can write is a configuration to fix, and moving
    it silently would hide that."""
    try:
        os.makedirs(os.path.dirname(os.path.abspath(cache_dir)), exist_ok=True)
    except OSError:
        pass  # open_private_directory says why the directory cannot be made
    fix = (f"It holds Python modules and numba's compiled code that this process runs. Remove it (rm -r "
           f"{cache_dir!r}) and let beton create it with mode 0700, or set CompileOptions(kernel_cache_dir=...) or "
           "$BETON_CACHE_DIR to a directory only you can write")
    directory = open_private_directory(cache_dir, what="kernel cache directory", fix=fix, follow=True)
    try:
        os.close(open_private_directory("__pycache__", dir_fd=directory, what="numba cache directory", fix=fix,
                                        shown=os.path.join(cache_dir, "__pycache__")))
        if numba.config.CACHE_DIR:  # $NUMBA_CACHE_DIR: numba keeps (and loads) its compiled code there instead
            os.close(open_private_directory(
                numba.config.CACHE_DIR, what="numba cache directory ($NUMBA_CACHE_DIR)", follow=True,
                fix=("numba loads compiled code from it, which this process runs. Point $NUMBA_CACHE_DIR at a "
                     "directory only you can write (mode 0700), or unset it")))
    except BaseException:
        os.close(directory)
        raise
    return directory


def _store_module(directory: int, name: str, source: bytes, path: str) -> None:
    """Make ``name`` in ``directory`` a regular file of this user's holding exactly ``source``; whatever else is
    there is replaced by a rename, without being followed or read."""
    if read_regular_file(name, directory, size=len(source)) == source:
        return
    try:
        temporary = write_new_file(directory, source, f".{name}.")
    except OSError as error:
        raise CacheDirError(f"cannot write the stage module {path!r}: {error.strerror}") from error
    if not replace_with(directory, temporary, name):
        raise CacheDirError(f"cannot write the stage module {path!r}: a directory that is not empty is in its place; "
                            "remove it")


def _module_text(module_name: str) -> bytes:
    try:
        return inspect.getsource(sys.modules[module_name]).encode()
    except (OSError, TypeError, KeyError):
        return module_name.encode()


def default_cache_dir() -> str:
    """Where generated stage modules and numba's compiled code live: $BETON_CACHE_DIR, else ~/.cache/beton."""
    explicit = os.environ.get("BETON_CACHE_DIR")
    if explicit:
        return explicit
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "beton", "kernels")


class Compiler:
    """FFCV's compiler switches (``ffcv.pipeline.compiler.Compiler``), for operations written to its contract.

    ``set_enabled(False)`` runs their functions as plain Python (to debug them); it is process-wide, as in
    FFCV. beton's own stages are always compiled.
    """

    is_enabled: ClassVar[bool] = True

    @classmethod
    def set_enabled(cls, enabled: bool) -> None:
        cls.is_enabled = bool(enabled)

    @classmethod
    def set_num_threads(cls, num_threads: int) -> None:
        """Accepted for FFCV scripts; beton's parallelism is the Loader's worker threads."""

    @staticmethod
    def get_iterator() -> Callable[..., Any]:
        """The loop range for an operation's function: numba's prange (a plain range outside parallel code)."""
        return numba.prange

    get_iterable = get_iterator  # the name FFCV's custom-transform guide uses

    @classmethod
    def compile(cls, code: Callable[..., Any], signature: Any = None) -> Callable[..., Any]:
        """``code`` compiled with numba (nogil), or unchanged while compilation is disabled."""
        if not cls.is_enabled:
            return code
        return numba.njit(signature, nogil=True)(code) if signature is not None else numba.njit(nogil=True)(code)
