"""An ImageNet-style training script: ImageFolder -> .beton, RandomResizedCrop + flip + normalize for training,
center crop for validation, distributed-ready.

    python examples/imagenet_style.py [--data DIR] [--epochs N] [--quick]
    torchrun --nproc_per_node 2 examples/imagenet_style.py --data DIR      # one process per device/rank

``--data`` must hold ``train/<class>/*.jpg`` and ``val/<class>/*.jpg``. Without it, a small stand-in is made
from scikit-image's bundled photos (6 classes, one per photo). Under torchrun, each rank reads its own shard
(``distributed=True``) and gradients are averaged by DistributedDataParallel (gloo on CPU, nccl on GPU).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import shutil

import simplejpeg
import torch

from beton import Loader, OrderOption
import beton.convert
from beton.decoders import CenterCropRGBImageDecoder, IntDecoder, RandomResizedCropRGBImageDecoder
from beton.tools.sample_photos import PHOTO_NAMES, photo_crop
from beton.transforms import NormalizeImage, RandomHorizontalFlip, Squeeze, ToDevice, ToTensor, ToTorchImage

MEAN = [0.485 * 255, 0.456 * 255, 0.406 * 255]
STD = [0.229 * 255, 0.224 * 255, 0.225 * 255]


def make_stand_in(root: str, per_class: int) -> str:
    """train/ and val/ folders of JPEG crops of the bundled photos, one class per photo."""
    for split, offset in (("train", 0), ("val", 6 * 2000)):  # offsets divisible by 6: photo_crop(i) shows photo i % 6
        for label, name in enumerate(PHOTO_NAMES):
            folder = os.path.join(root, split, name)
            os.makedirs(folder, exist_ok=True)
            for k in range(per_class):
                image = photo_crop(offset + k * len(PHOTO_NAMES) + label, 256, 320, seed=label)
                with open(os.path.join(folder, f"{k:05d}.jpg"), "wb") as file:
                    file.write(simplejpeg.encode_jpeg(image, quality=90))
    return root


def loaders(train_path: str, val_path: str, resolution: int, batch_size: int, device: torch.device,
            distributed: bool) -> tuple[Loader, Loader]:
    train = Loader(train_path, batch_size=batch_size, num_workers=-1, order=OrderOption.RANDOM, seed=0,
                   distributed=distributed, drop_last=True,
                   pipelines={"image": [RandomResizedCropRGBImageDecoder((resolution, resolution)),
                                        RandomHorizontalFlip(), ToTensor(), ToTorchImage(),
                                        ToDevice(device), NormalizeImage(MEAN, STD)],
                              "label": [IntDecoder(), ToTensor(), Squeeze(), ToDevice(device)]})
    val = Loader(val_path, batch_size=batch_size, num_workers=-1, order=OrderOption.SEQUENTIAL,
                 distributed=distributed,
                 pipelines={"image": [CenterCropRGBImageDecoder((resolution, resolution), ratio=224 / 256),
                                      ToTensor(), ToTorchImage(), ToDevice(device), NormalizeImage(MEAN, STD)],
                            "label": [IntDecoder(), ToTensor(), Squeeze(), ToDevice(device)]})
    return train, val


def make_model(classes: int) -> torch.nn.Module:
    def block(inputs: int, outputs: int) -> torch.nn.Module:
        return torch.nn.Sequential(torch.nn.Conv2d(inputs, outputs, 3, stride=2, padding=1, bias=False),
                                   torch.nn.BatchNorm2d(outputs), torch.nn.ReLU(inplace=True))

    return torch.nn.Sequential(block(3, 16), block(16, 32), block(32, 64), block(64, 128),
                               torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(128, classes))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=None, help="folder with train/ and val/ class folders")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--resolution", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--quick", action="store_true", help="tiny stand-in data, 2 epochs (for CI)")
    arguments = parser.parse_args()

    distributed = "RANK" in os.environ  # set by torchrun
    if distributed:
        torch.distributed.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    rank = torch.distributed.get_rank() if distributed else 0
    device = torch.device(f"cuda:{os.environ.get('LOCAL_RANK', 0)}" if torch.cuda.is_available() else "cpu")
    epochs = 2 if arguments.quick else arguments.epochs
    batch_size = 8 if arguments.quick else arguments.batch_size

    # Every rank must see the same files: under torchrun a directory named after the job, else a temporary one.
    work = os.path.join(tempfile.gettempdir(), f"beton-imagenet-{os.environ['MASTER_PORT']}") if distributed \
        else tempfile.mkdtemp()
    try:
        data = arguments.data or os.path.join(work, "images")
        paths = {split: os.path.join(work, f"{split}.beton") for split in ("train", "val")}
        if rank == 0:  # one writer; the other ranks wait at the barrier
            if not arguments.data:
                make_stand_in(data, 8 if arguments.quick else 60)
            for split, path in paths.items():
                beton.convert.imagefolder(os.path.join(data, split), path, max_resolution=256, progress=False)
        if distributed:
            torch.distributed.barrier()
        train, val = loaders(paths["train"], paths["val"], arguments.resolution, batch_size, device, distributed)
        model = make_model(len(os.listdir(os.path.join(data, "train")))).to(device)
        if distributed:
            model = torch.nn.parallel.DistributedDataParallel(model)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-5)
        for epoch in range(epochs):
            start = time.perf_counter()
            model.train()
            losses = []
            for images, labels in train:
                optimizer.zero_grad(set_to_none=True)
                loss = torch.nn.functional.cross_entropy(model(images), labels)
                loss.backward()
                optimizer.step()
                losses.append(loss.item())
            model.eval()
            correct = total = 0
            with torch.no_grad():
                for images, labels in val:
                    correct += int((model(images).argmax(1) == labels).sum())
                    total += len(labels)
            if rank == 0:
                print(f"epoch {epoch + 1}/{epochs}: train loss {sum(losses) / max(len(losses), 1):.3f}, val accuracy "
                      f"{correct / max(total, 1):.3f} (this rank), {time.perf_counter() - start:.1f} s")
        train.close()
        val.close()
    finally:
        if distributed:
            torch.distributed.barrier()
            torch.distributed.destroy_process_group()
        if rank == 0:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
