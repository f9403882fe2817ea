"""What fusing operations written to FFCV's contract gains: the same pipeline fused, unfused, and (optionally)
as a tree before fusion ran it, side by side.

    python benchmarks/ffcv_fusion.py [--images N] [--repeats R] [--before PATH]

The pipeline: an FFCV-style decoder (a field written to FFCV's field contract holding raw 32x32x3 images), two
FFCV-style transforms (invert, then a per-batch brightness shift), beton's RandomHorizontalFlip, ToTensor;
labels through IntDecoder and ToTensor. Batches of 256, two worker threads, the OS cache.

Contenders, alternating epochs after one warm-up epoch each (see beton.tools.bench.timing):

* ``fused``: this tree's default, one compiled stage for the decoder, both transforms, the flip and the labels;
* ``unfused``: ``CompileOptions(fuse_stages=False)``, every compiled operation its own stage;
* ``before`` (with ``--before PATH``, a checkout of the code to compare with, e.g. made by
  ``git worktree add /tmp/before <commit>``): the same pipeline run by that code, each round in a fresh
  process that imports it (a warm-up epoch, then the median of three timed epochs) next to one such
  process of this tree.

Ratios are medians of per-round ratios (the machine is shared: compare within rounds). Writes
benchmarks/results/ffcv_fusion.json and prints a Markdown table.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import replace

import numpy as np

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "ffcv_fusion.json")
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHAPE = (32, 32, 3)
BATCH_SIZE = 256

from beton.fields.base import ARG_TYPE, Field  # noqa: E402  (after the constants the child mode also reads)
from beton.libffcv import memcpy  # noqa: E402
from beton.pipeline.allocation_query import AllocationQuery  # noqa: E402
from beton.pipeline.compiler import Compiler  # noqa: E402
from beton.pipeline.operation import Operation  # noqa: E402


class RawImageDecoder(Operation):
    def declare_state_and_memory(self, previous_state):
        return replace(previous_state, jit_mode=True, shape=SHAPE, dtype=np.dtype("u1")), \
            AllocationQuery(SHAPE, np.dtype("u1"))

    def generate_code(self):
        read, copy, loop = self.memory_read, Compiler.compile(memcpy), Compiler.get_iterator()

        def decode(batch_indices, destination, metadata, storage_state):
            for i in loop(batch_indices.shape[0]):
                copy(read(metadata[batch_indices[i]]["ptr"], storage_state), destination[i].reshape(-1))
            return destination

        return decode


class RawImageField(Field):
    @property
    def metadata_type(self):
        return np.dtype([("ptr", "<u8")])

    @staticmethod
    def from_binary(binary):
        return RawImageField()

    def to_binary(self):
        return np.zeros(1, dtype=ARG_TYPE)[0]

    def encode(self, destination, image, malloc):
        destination["ptr"], buffer = malloc(image.nbytes)
        buffer[:] = image.reshape(-1)

    def get_decoder_class(self):
        return RawImageDecoder


class Invert(Operation):
    def declare_state_and_memory(self, previous_state):
        return previous_state, AllocationQuery(previous_state.shape, previous_state.dtype)

    def generate_code(self):
        loop = Compiler.get_iterator()

        def invert(images, dst):
            for i in loop(images.shape[0]):
                dst[i] = 255 - images[i]
            return dst

        return invert


class Brighten(Operation):
    def declare_state_and_memory(self, previous_state):
        return previous_state, None  # in place

    def generate_code(self):
        loop = Compiler.get_iterator()

        def brighten(images, _, indices):
            for i in loop(images.shape[0]):
                shift = indices[i] % 16
                flat = images[i].reshape(-1)
                for k in range(flat.shape[0]):
                    flat[k] = min(255, flat[k] + shift)
            return images

        brighten.with_indices = True
        return brighten


def pipelines() -> dict:
    from beton.decoders import IntDecoder
    from beton.transforms import RandomHorizontalFlip, ToTensor

    return {"image": [RawImageDecoder(), Invert(), Brighten(), RandomHorizontalFlip(), ToTensor()],
            "label": [IntDecoder(), ToTensor()]}


def make_loader(path: str, fuse: bool = True):
    from beton import Loader
    from beton.loader import CompileOptions

    return Loader(path, batch_size=BATCH_SIZE, num_workers=2, os_cache=True, custom_fields={"image": RawImageField},
                  pipelines=pipelines(), compile_options=CompileOptions(fuse_stages=fuse))


def write_file(path: str, images: int) -> str:
    from beton import DatasetWriter
    from beton.fields import IntField

    rng = np.random.default_rng(0)
    samples = [(rng.integers(0, 256, SHAPE, dtype=np.uint8), i % 10) for i in range(images)]
    DatasetWriter(path, {"image": RawImageField(), "label": IntField()}, num_workers=0,
                  progress=False).from_indexed_dataset(samples)
    return path


def child(path: str) -> None:
    """One process's measure: a warm-up epoch, then the median samples/s of three timed epochs of the default
    Loader, printed."""
    from beton.tools.bench.timing import epoch_rate

    with make_loader(path) as loader:
        epoch_rate(loader)
        print(json.dumps(statistics.median(epoch_rate(loader) for _ in range(3))))


def process_rate(tree: str, path: str) -> float:
    environment = {**os.environ, "PYTHONPATH": tree}
    output = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", path], env=environment,
                            check=True, capture_output=True, text=True, cwd=tree).stdout
    return float(output.strip().splitlines()[-1])


def main() -> None:
    from beton.tools.bench.report import argument_parser, run_header, save_json
    from beton.tools.bench.timing import alternating_runs, paired_ratio

    parser = argument_parser(__doc__, images=10000, repeats=5)
    parser.add_argument("--before", help="a checkout of the code to compare with (run in child processes)")
    arguments = parser.parse_args()
    result = {**run_header(), "images": arguments.images, "repeats": arguments.repeats,
              "batch_size": BATCH_SIZE, "workers": 2}
    with tempfile.TemporaryDirectory() as directory:
        path = write_file(os.path.join(directory, "raw.beton"), arguments.images)
        loaders = {"fused": make_loader(path), "unfused": make_loader(path, fuse=False)}
        result["stages"] = {name: [stage.kind for stage in loader.plan.stages] for name, loader in loaders.items()}
        runs = alternating_runs(loaders, arguments.repeats)
        for loader in loaders.values():
            loader.close()
        rows = ["| comparison | ratio (median of per-round ratios) | samples/s (medians) |", "|---|---|---|"]
        ratio = paired_ratio(runs["fused"], runs["unfused"])
        rows.append(f"| fused / unfused (one process) | {ratio:.3f} | {statistics.median(runs['fused']):.0f}, "
                    f"{statistics.median(runs['unfused']):.0f} |")
        result["fused_over_unfused"] = round(ratio, 3)
        result["rounds"] = {name: [round(rate) for rate in rates] for name, rates in runs.items()}
        if arguments.before:
            processes: dict[str, list[float]] = {"before": [], "fused": []}
            for _ in range(arguments.repeats):
                processes["before"].append(process_rate(os.path.abspath(arguments.before), path))
                processes["fused"].append(process_rate(HERE, path))
            ratio = paired_ratio(processes["fused"], processes["before"])
            rows.append(f"| fused / before (fresh processes) | {ratio:.3f} | "
                        f"{statistics.median(processes['fused']):.0f}, {statistics.median(processes['before']):.0f} |")
            result["fused_over_before"] = round(ratio, 3)
            result["process_rounds"] = {name: [round(rate) for rate in rates] for name, rates in processes.items()}
    save_json(RESULTS, result)
    print("\n".join(rows))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2])
    else:
        main()
