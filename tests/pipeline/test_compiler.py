"""The compiler: stage grouping, generated module files cached on disk, and the exec fallback."""

from __future__ import annotations

import dataclasses
import os
import stat
import subprocess
import sys
import textwrap

import numba
import numpy as np
import pytest
import torch

from beton import Loader, OrderOption
from beton.decoders import IntDecoder, NDArrayDecoder
from beton.errors import CacheDirError
from beton.loader import CompileOptions
from beton.pipeline.operation import BatchOperation, JitOperation
from beton.transforms import Convert, ToTensor
from beton.transforms.flip import RandomHorizontalFlip, RandomVerticalFlip
from beton.transforms.normalize import NormalizeImage

from conftest import small_image


def test_consecutive_jit_operations_of_all_outputs_fuse_into_one_stage(image_file, tmp_path):
    pipelines = {"image": [NDArrayDecoder(), RandomHorizontalFlip(), RandomVerticalFlip(), ToTensor()],
                 "label": [IntDecoder(), ToTensor(), Convert(torch.int32)]}
    with Loader(image_file, batch_size=8, num_workers=1, pipelines=pipelines,
                compile_options=CompileOptions(kernel_cache_dir=str(tmp_path))) as loader:
        kinds = [(stage.kind, len(stage.steps)) for stage in loader.plan.stages]
        assert kinds == [("jit", 4), ("batch", 1), ("batch", 1), ("batch", 1)]
        (module_file,) = [name for name in os.listdir(tmp_path) if name.endswith(".py")]
        assert (tmp_path / module_file).read_text() == loader.plan.stages[0].source
        next(iter(loader))
    assert any(name.endswith(".nbi") for name in os.listdir(tmp_path / "__pycache__"))


def test_a_fresh_process_loads_compiled_stages_from_disk(image_file, tmp_path):
    script = textwrap.dedent(f"""
        import time, numba
        from beton import Loader
        from beton.loader import CompileOptions
        from beton.decoders import NDArrayDecoder
        from beton.transforms import ToTensor
        from beton.transforms.flip import RandomHorizontalFlip
        loader = Loader({str(image_file)!r}, batch_size=8, num_workers=1,
                        compile_options=CompileOptions(kernel_cache_dir={str(tmp_path)!r}),
                        pipelines={{"image": [NDArrayDecoder(), RandomHorizontalFlip(), ToTensor()]}})
        stage = loader.plan.stages[0].function
        print(len(stage.stats.cache_hits), len(stage.stats.cache_misses))
    """)
    runs = [subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
            for _ in range(2)]
    for run in runs:
        assert run.returncode == 0, run.stderr
    assert runs[0].stdout.split() == ["0", "1"]  # cold: compiled
    assert runs[1].stdout.split() == ["1", "0"]  # warm: loaded from the disk cache


def make_unimportable_operation():
    @numba.njit(nogil=True)
    def invert_kernel(src, dst, i, sample, key, args):
        dst[i] = 255 - src[i]

    @dataclasses.dataclass(frozen=True)
    class Invert(JitOperation):
        def output_state(self, previous):
            return previous

        def kernel(self):
            return invert_kernel

    return Invert()


def test_a_kernel_defined_in_a_function_still_works_without_the_disk_cache(image_file):
    pipelines = {"image": [NDArrayDecoder(), make_unimportable_operation(), ToTensor()]}
    with Loader(image_file, batch_size=8, num_workers=1, pipelines=pipelines) as loader:
        assert "not disk-cached" in loader.explain()
        images, labels = next(iter(loader))
        np.testing.assert_array_equal(images[5].numpy(), 255 - small_image(5))


def test_random_augmentations_are_identical_for_any_number_of_workers(image_file):
    pipelines = {"image": [NDArrayDecoder(), RandomHorizontalFlip(), RandomVerticalFlip(),
                           NormalizeImage([10.0, 20.0, 30.0], [2.0, 4.0, 8.0]), ToTensor()]}

    def batches(num_workers):
        with Loader(image_file, batch_size=16, num_workers=num_workers, pipelines=pipelines,
                    order=OrderOption.RANDOM, seed=21, copy=True) as loader:
            return [[(images.numpy(), labels.numpy()) for images, labels in loader] for _ in range(2)]

    reference = batches(1)
    variants_seen = set()
    for epoch in reference:
        for images, labels in epoch:
            for image, label in zip(images, labels):
                normalized = ((small_image(label) - np.float32([10, 20, 30])) / np.float32([2, 4, 8]))
                variants = [normalized, normalized[:, ::-1], normalized[::-1], normalized[::-1, ::-1]]
                matches = [k for k, v in enumerate(variants) if np.allclose(image, v, atol=1e-5)]
                assert matches
                variants_seen.add(matches[0])
    assert variants_seen == {0, 1, 2, 3}  # both flips happen, independently
    for num_workers in (2, 4):
        for epoch_a, epoch_b in zip(reference, batches(num_workers)):
            for (a, labels_a), (b, labels_b) in zip(epoch_a, epoch_b):
                assert a.tobytes() == b.tobytes() and np.array_equal(labels_a, labels_b)


@dataclasses.dataclass(frozen=True)
class CopyInPython(BatchOperation):
    """A Python-level step whose numpy result is no slot buffer."""

    def output_state(self, previous):
        return previous

    def apply(self, batch, context):
        return np.array(batch)


def test_an_in_place_compiled_step_after_a_python_step_works_on_that_steps_result(image_file):
    """An in-place kernel (the flip) reads and writes its own buffer: the Python step's result is copied there
    first (before, the unflipped images came out as whatever the buffer held)."""
    pipelines = {"image": [NDArrayDecoder(), CopyInPython(), RandomHorizontalFlip()], "label": [IntDecoder()]}
    with Loader(image_file, batch_size=16, num_workers=2, pipelines=pipelines) as loader:
        assert [s.copies_input for stage in loader.plan.stages for s in stage.steps] == [False, False, False, True]
        kept = [list(loader) for _ in range(2)]
    mirrored = 0
    for epoch in kept:
        for images, labels in epoch:
            for image, label in zip(images, labels):
                expected = small_image(label)
                assert np.array_equal(image, expected) or np.array_equal(image, expected[:, ::-1])
                mirrored += not np.array_equal(image, expected)
    assert 0 < mirrored < 2 * 203


# ---- the kernel cache is this user's alone (issue #25 item 3) --------------------------------------------------

NOBODY = 65534
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory or file to another user needs root")
FLIP = {"image": [NDArrayDecoder(), RandomHorizontalFlip(), ToTensor()]}


def flip_loader(image_file, cache_dir) -> Loader:
    return Loader(image_file, batch_size=8, num_workers=1, pipelines=FLIP,
                  compile_options=CompileOptions(kernel_cache_dir=str(cache_dir)))


def test_the_kernel_cache_and_numbas_directory_in_it_are_made_with_mode_0700(image_file, tmp_path):
    cache = tmp_path / "made" / "kernels"
    with flip_loader(image_file, cache) as loader:
        next(iter(loader))
    for directory in (cache, cache / "__pycache__"):
        status = os.lstat(directory)
        assert stat.S_ISDIR(status.st_mode) and stat.S_IMODE(status.st_mode) == 0o700
        assert status.st_uid == os.geteuid()


def _world_writable(directory) -> None:
    directory.mkdir()
    os.chmod(directory, 0o777)


def _others(directory) -> None:
    directory.mkdir(mode=0o755)
    os.chown(directory, NOBODY, NOBODY)


def _linked_pycache(directory) -> None:
    directory.mkdir(mode=0o700)
    (directory.parent / "elsewhere").mkdir()
    os.symlink(directory.parent / "elsewhere", directory / "__pycache__")


@pytest.mark.parametrize("kind, plant, message", [
    ("writable by all", _world_writable, "writable by group or others"),
    pytest.param("another user's", _others, f"belongs to user id {NOBODY}", marks=as_root),
    ("__pycache__ a link", _linked_pycache, "symbolic link"),
])
def test_a_kernel_cache_others_can_write_is_refused(image_file, tmp_path, kind, plant, message):
    cache = tmp_path / "kernels"
    plant(cache)
    with pytest.raises(CacheDirError, match=message) as caught:
        flip_loader(image_file, cache)
    assert str(cache) in str(caught.value) and "rm -r" in str(caught.value)
    assert not [name for name in os.listdir(cache) if name.endswith(".py")]


def _other_content(path, planted: str) -> None:
    with open(path, "w") as file:
        file.write(planted)


def _link_to_other_content(path, planted: str) -> None:
    _other_content(f"{path}.elsewhere", planted)
    os.unlink(path)
    os.symlink(f"{path}.elsewhere", path)


def _others_file(path, planted: str) -> None:
    _other_content(path, planted)
    os.chown(path, NOBODY, NOBODY)


@pytest.mark.parametrize("plant", [_other_content, _link_to_other_content, pytest.param(_others_file, marks=as_root)],
                         ids=["other content", "a link to other content", "another user's file"])
def test_a_module_planted_under_a_stages_name_never_runs(image_file, tmp_path, plant):
    for name in [name for name in sys.modules if name.startswith("beton_stage_")]:
        del sys.modules[name]  # as in a fresh process: earlier tests compiled this stage
    cache = tmp_path / "kernels"
    with flip_loader(image_file, cache) as loader:
        source = loader.plan.stages[0].source
    (module_file,) = [name for name in os.listdir(cache) if name.endswith(".py")]
    marker = tmp_path / "planted code ran"
    plant(str(cache / module_file), f"open({str(marker)!r}, 'w').close()\n" + source)
    sys.modules.pop(module_file[:-3])  # as in a fresh process
    with flip_loader(image_file, cache) as loader:
        next(iter(loader))
        assert loader.plan.stages[0].source == source
    assert not marker.exists()
    status = os.lstat(cache / module_file)
    assert stat.S_ISREG(status.st_mode) and status.st_uid == os.geteuid()
    assert (cache / module_file).read_text() == source  # replaced by the generated source


def test_a_numba_cache_dir_others_can_write_is_refused(image_file, tmp_path, monkeypatch):
    """$NUMBA_CACHE_DIR moves numba's compiled code (which the process loads and runs) out of the kernel cache."""
    import numba

    shared = tmp_path / "shared-numba"
    _world_writable(shared)
    monkeypatch.setattr(numba.config, "CACHE_DIR", str(shared))
    with pytest.raises(CacheDirError, match="writable by group or others") as caught:
        flip_loader(image_file, tmp_path / "kernels")
    assert str(shared) in str(caught.value) and "NUMBA_CACHE_DIR" in str(caught.value)
    private = tmp_path / "private-numba"
    monkeypatch.setattr(numba.config, "CACHE_DIR", str(private))
    with flip_loader(image_file, tmp_path / "kernels") as loader:
        next(iter(loader))
    assert stat.S_IMODE(os.lstat(private).st_mode) == 0o700
