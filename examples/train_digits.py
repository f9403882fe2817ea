"""Train a small CNN on CPU on scikit-learn's handwritten digits, through beton: write, load with
augmentation, train, evaluate on held-out digits.

    python examples/train_digits.py [--epochs N] [--quick] [--out DIR]

Exits with status 1 if held-out accuracy is below 95 %. ``--quick`` (used in CI) trains fewer epochs.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np
import torch
from sklearn.datasets import load_digits

import beton
from beton import Loader, OrderOption
from beton.fields import IntField, RGBImageField
from beton.decoders import IntDecoder, SimpleRGBImageDecoder
from beton.transforms import Convert, NormalizeImage, RandomTranslate, ToTensor, ToTorchImage

TARGET_ACCURACY = 0.95


def write_splits(directory: str) -> tuple[str, str]:
    digits = load_digits()
    images = np.clip(digits.images * 16, 0, 255).astype(np.uint8)[..., None]  # 8x8x1, 0..255
    order = np.random.default_rng(0).permutation(len(images))
    test, train = order[:360], order[360:]
    fields = {"image": RGBImageField(write_mode="raw", channels=1), "label": IntField()}
    paths = []
    for name, indices in (("train", train), ("test", test)):
        path = os.path.join(directory, f"digits_{name}.beton")
        samples = [(images[i], int(digits.target[i])) for i in indices]
        beton.DatasetWriter(path, fields, num_workers=1, progress=False).from_indexed_dataset(samples)
        paths.append(path)
    return paths[0], paths[1]


def make_loader(path: str, train: bool) -> Loader:
    augment = [RandomTranslate(1)] if train else []
    image = [SimpleRGBImageDecoder(), *augment, ToTensor(), ToTorchImage(), Convert(torch.float32),
             NormalizeImage([77.0], [95.0])]
    return Loader(path, batch_size=64, num_workers=2, order=OrderOption.RANDOM if train else OrderOption.SEQUENTIAL,
                  seed=0, pipelines={"image": image, "label": [IntDecoder(), ToTensor()]})


def make_model() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 32, 3, padding=1), torch.nn.ReLU(),
        torch.nn.Conv2d(32, 64, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(64 * 4 * 4, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10),
    )


def evaluate(model: torch.nn.Module, loader: Loader) -> float:
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for images, labels in loader:
            correct += int((model(images).argmax(1) == labels).sum())
            total += len(labels)
    return correct / total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--quick", action="store_true", help="8 epochs (for CI)")
    parser.add_argument("--out", default=None, help="directory for the .beton files (default: a temporary one)")
    arguments = parser.parse_args()
    epochs = 8 if arguments.quick else arguments.epochs
    torch.manual_seed(0)
    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory() as temporary:
        train_path, test_path = write_splits(arguments.out or temporary)
        train_loader, test_loader = make_loader(train_path, True), make_loader(test_path, False)
        model = make_model()
        optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
        start = time.perf_counter()
        for epoch in range(epochs):
            model.train()
            for images, labels in train_loader:
                optimizer.zero_grad()
                loss = torch.nn.functional.cross_entropy(model(images), labels)
                loss.backward()
                optimizer.step()
            print(f"epoch {epoch + 1}/{epochs}: loss {loss.item():.3f}, "
                  f"held-out accuracy {evaluate(model, test_loader):.3f}")
        accuracy = evaluate(model, test_loader)
        train_loader.close()
        test_loader.close()
    print(f"held-out accuracy {accuracy:.3f} after {epochs} epochs in {time.perf_counter() - start:.1f} s")
    if accuracy < TARGET_ACCURACY:
        print(f"FAILED: below the {TARGET_ACCURACY:.0%} target", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
