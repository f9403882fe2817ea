"""Build a training set on Ray, then train from it: an image folder is read and resized by Ray tasks, written as
shards plus a manifest by beton's Ray datasink, and a Loader trains a small network from the manifest.

    pip install "beton[ray]"
    python examples/ray_build.py [--data DIR] [--output DIR_OR_URL] [--size 64] [--steps 20] [--quick]
    python examples/ray_build.py --address auto --data /shared/photos --output s3://bucket/photos   # a cluster

``--data`` holds ``<class>/*.jpg`` (torchvision's ImageFolder layout); without it, a stand-in of JPEG crops of
scikit-image's bundled photos is made (6 classes). On a cluster (``ray start`` on each node, then ``--address
auto``), every node must see ``--data`` (a shared file system) and ``--output`` (a shared file system or an object
store URL). See docs/shards.md, "Building a dataset on Ray".
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import cv2
import numpy as np
import simplejpeg
import torch

try:
    import ray
    import ray.data
except ImportError:
    raise SystemExit("this example needs Ray Data: pip install 'beton[ray]'") from None

from beton import Loader, OrderOption
from beton.decoders import IntDecoder, RandomResizedCropRGBImageDecoder
from beton.fields import IntField, RGBImageField
from beton.ray import write_dataset
from beton.tools.convert import ImageFolder
from beton.tools.sample_photos import PHOTO_NAMES, photo_crop
from beton.transforms import Squeeze, ToTensor, ToTorchImage


def make_stand_in(root: str, per_class: int) -> str:
    """``root/<photo name>/<k>.jpg``: JPEG crops of the bundled photos, one class per photo."""
    for label, name in enumerate(PHOTO_NAMES):
        os.makedirs(os.path.join(root, name), exist_ok=True)
        for k in range(per_class):
            image = photo_crop(k * len(PHOTO_NAMES) + label, 240, 320, seed=label)
            with open(os.path.join(root, name, f"{k:05d}.jpg"), "wb") as file:
                file.write(simplejpeg.encode_jpeg(image, quality=90))
    return root


def resize_batch(batch: dict[str, np.ndarray], size: int) -> dict[str, np.ndarray]:
    """Ray's map step, in a Ray task: each file decoded and resized so that its shorter side is ``size``."""
    images = []
    for path in batch["path"]:
        with open(path, "rb") as file:
            image = simplejpeg.decode_jpeg(file.read(), colorspace="RGB")
        height, width = image.shape[:2]
        scale = size / min(height, width)
        images.append(cv2.resize(image, (max(size, round(width * scale)), max(size, round(height * scale))),
                                 interpolation=cv2.INTER_AREA))
    return {"image": images, "label": batch["label"]}


def build(data: str, output: str, size: int, per_shard: int) -> str:
    """The image folder through Ray to shards plus a manifest; returns the manifest's location."""
    folder = ImageFolder(data)  # the files in torchvision's order, labels from the sorted class folders
    rows = [{"path": path, "label": label} for path, label in folder.samples]
    blocks = -(-len(rows) // per_shard)  # one block per shard: a block is what one write task writes
    dataset = ray.data.from_items(rows, override_num_blocks=blocks).map_batches(
        resize_batch, fn_kwargs={"size": size}, batch_size=None)
    fields = {"image": RGBImageField(write_mode="jpg", jpeg_quality=90), "label": IntField()}
    manifest = write_dataset(dataset, output, fields, overwrite=True,
                             metadata={"classes": {"label": folder.classes}, "source": "examples/ray_build.py"})
    print(f"wrote {manifest.num_samples} images in {len(manifest.shards)} shards; manifest {manifest.source}")
    return manifest.source


def train(manifest: str, size: int, classes: int, steps: int) -> None:
    """A few steps of a small network on random crops read by a Loader from the manifest."""
    loader = Loader(manifest, batch_size=32, num_workers=2, order=OrderOption.RANDOM, seed=0, drop_last=True,
                    pipelines={"image": [RandomResizedCropRGBImageDecoder((size, size)), ToTensor(), ToTorchImage()],
                               "label": [IntDecoder(), ToTensor(), Squeeze()]})
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, stride=2), torch.nn.ReLU(), torch.nn.Conv2d(16, 32, 3, stride=2), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(32, classes))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses, step = [], 0
    with loader:
        while step < steps:
            for images, labels in loader:
                loss = torch.nn.functional.cross_entropy(model(images.float() / 255 - 0.5), labels)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                losses.append(loss.item())
                step += 1
                if step == steps:
                    break
    print(f"trained {steps} steps from the manifest: loss {np.mean(losses[:3]):.3f} -> {np.mean(losses[-3:]):.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", help="an image folder (<class>/*.jpg); default: a stand-in of bundled photos")
    parser.add_argument("--output", help="directory or URL for the shards and manifest.json (default: temporary)")
    parser.add_argument("--size", type=int, default=64, help="shorter side of the stored images")
    parser.add_argument("--per-shard", type=int, default=256, help="images per shard")
    parser.add_argument("--steps", type=int, default=20, help="training steps")
    parser.add_argument("--address", help="a Ray cluster's address ('auto' after `ray start`); default: a local Ray")
    parser.add_argument("--cpus", type=int, default=2, help="CPUs of the local Ray (without --address)")
    parser.add_argument("--quick", action="store_true", help="a small stand-in and few steps (for tests)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        data = args.data or make_stand_in(os.path.join(scratch, "photos"), 20 if args.quick else 200)
        output = args.output or os.path.join(scratch, "shards")
        per_shard = 40 if args.quick else args.per_shard
        if args.address:
            ray.init(address=args.address)
        else:
            ray.init(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False)
        try:
            start = time.perf_counter()
            manifest = build(data, output, args.size, per_shard)
            print(f"built in {time.perf_counter() - start:.1f} s")
        finally:
            ray.shutdown()
        classes = len(ImageFolder(data).classes)
        train(manifest, args.size, classes, 6 if args.quick else args.steps)


if __name__ == "__main__":
    main()
