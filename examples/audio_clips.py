"""An audio-style pipeline: clips of varying length (float32 samples) -> a random one-second window per clip and
epoch -> batches with lengths -> a small 1-D convolutional classifier, trained on CPU.

    python examples/audio_clips.py [--epochs N] [--quick]

The clips are synthetic (beton ships no audio): noisy tones at 8 kHz whose pitch band is the label, from 0.3 s to
6 s long. Training reads a random 1 s window of each clip (``RaggedDecoder(window="random")``, a different one
every epoch, the same for any number of workers); validation reads the middle second. Shorter clips come back
padded, and their lengths mask the padding out of the model's average. Exits with status 1 below 90 %
held-out accuracy.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import numpy as np
import torch

import beton
from beton import Loader, OrderOption
from beton.decoders import IntDecoder, RaggedDecoder
from beton.fields import IntField, RaggedArrayField
from beton.transforms import ToTensor

RATE = 8000  # samples per second
BANDS = ((200, 400), (600, 900), (1400, 2000))  # Hz: one class per band
TARGET_ACCURACY = 0.9


def clip(index: int) -> tuple[np.ndarray, int]:
    rng = np.random.default_rng(index)
    label = index % len(BANDS)
    seconds = float(rng.choice([rng.uniform(0.3, 1.0), rng.uniform(1.0, 6.0)]))
    time = np.arange(int(seconds * RATE)) / RATE
    pitch = rng.uniform(*BANDS[label])
    wave = np.sin(2 * np.pi * pitch * time + rng.uniform(0, 2 * np.pi)) * rng.uniform(0.2, 1.0)
    return (wave + rng.normal(0, 0.3, len(time))).astype(np.float32), label


def write(path: str, indices: range) -> None:
    fields = {"audio": RaggedArrayField(np.float32, (None,)), "label": IntField()}
    beton.DatasetWriter(path, fields, num_workers=1, progress=False).from_indexed_dataset(
        [clip(i) for i in indices])


def make_loader(path: str, train: bool) -> Loader:
    window = "random" if train else "center"
    return Loader(path, batch_size=32, num_workers=2, seed=0,
                  order=OrderOption.RANDOM if train else OrderOption.SEQUENTIAL,
                  pipelines={"audio": [RaggedDecoder(max_length=RATE, window=window), ToTensor()],
                             "label": [IntDecoder(), ToTensor()]})


class Classifier(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = torch.nn.Sequential(
            torch.nn.Conv1d(1, 16, 31, stride=4, padding=15), torch.nn.ReLU(),
            torch.nn.Conv1d(16, 32, 15, stride=4, padding=7), torch.nn.ReLU())
        self.out = torch.nn.Linear(32, len(BANDS))

    def forward(self, audio: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        features = self.features(audio[:, None, :])  # (batch, 32, frames): one frame per 16 samples
        valid = (torch.arange(features.shape[2]) * 16 < lengths[:, None]).float()[:, None, :]
        pooled = (features * valid).sum(2) / valid.sum(2).clamp(min=1)  # the average over real audio only
        return self.out(pooled)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--quick", action="store_true", help="3 epochs on fewer clips (for CI)")
    arguments = parser.parse_args()
    epochs, clips = (3, 480) if arguments.quick else (arguments.epochs, 1200)
    torch.manual_seed(0)
    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory() as temporary:
        train_path, test_path = os.path.join(temporary, "train.beton"), os.path.join(temporary, "test.beton")
        write(train_path, range(clips))
        write(test_path, range(clips, clips + 150))
        model = Classifier()
        optimiser = torch.optim.Adam(model.parameters(), lr=3e-3)
        with make_loader(train_path, train=True) as train, make_loader(test_path, train=False) as test:
            for epoch in range(epochs):
                model.train()
                for audio, labels in train:  # audio: Padded(values (32, 8000) float32, lengths (32,))
                    loss = torch.nn.functional.cross_entropy(model(audio.values, audio.lengths), labels)
                    optimiser.zero_grad()
                    loss.backward()
                    optimiser.step()
                print(f"epoch {epoch}: loss {loss.item():.3f}, last batch {tuple(audio.values.shape)}, lengths "
                      f"{audio.lengths.min().item()}..{audio.lengths.max().item()}")
            model.eval()
            correct = total = 0
            with torch.no_grad():
                for audio, labels in test:
                    correct += int((model(audio.values, audio.lengths).argmax(1) == labels).sum())
                    total += len(labels)
    accuracy = correct / total
    print(f"held-out accuracy {accuracy:.3f} after {epochs} epochs")
    return 0 if accuracy >= TARGET_ACCURACY else 1


if __name__ == "__main__":
    sys.exit(main())
