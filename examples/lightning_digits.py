"""Train with PyTorch Lightning on beton loaders: a LightningDataModule whose dataloaders are beton Loaders.

    pip install lightning
    python examples/lightning_digits.py [--epochs N]

Lightning accepts any iterable of batches as a dataloader. Under a multi-GPU strategy Lightning has set up
torch.distributed before it asks for the dataloaders, so ``distributed=True`` shards by rank there; every
rank agrees on the seed. Each ``iter(loader)`` runs the next epoch, and the Loader's ``state_dict()`` is what
to save to resume mid-epoch.
"""

from __future__ import annotations

import argparse
import tempfile

import lightning
import torch

from beton import Loader, OrderOption

from train_digits import make_model, write_splits


class DigitsData(lightning.LightningDataModule):
    def __init__(self, directory: str) -> None:
        super().__init__()
        self.directory = directory

    def prepare_data(self) -> None:  # once per node: write the files
        self.train_path, self.test_path = write_splits(self.directory)

    def _loader(self, path: str, train: bool) -> Loader:
        from beton.decoders import IntDecoder, SimpleRGBImageDecoder
        from beton.transforms import Convert, NormalizeImage, RandomTranslate, ToTensor, ToTorchImage

        image = [SimpleRGBImageDecoder(), *([RandomTranslate(1)] if train else []), ToTensor(), ToTorchImage(),
                 Convert(torch.float32), NormalizeImage([77.0], [95.0])]
        distributed = self.trainer is not None and self.trainer.world_size > 1
        return Loader(path, batch_size=64, num_workers=2, seed=0, distributed=distributed,
                      order=OrderOption.RANDOM if train else OrderOption.SEQUENTIAL,
                      pipelines={"image": image, "label": [IntDecoder(), ToTensor()]})

    def train_dataloader(self) -> Loader:
        return self._loader(self.train_path, train=True)

    def val_dataloader(self) -> Loader:
        return self._loader(self.test_path, train=False)


class Classifier(lightning.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.model = make_model()

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], index: int) -> torch.Tensor:
        images, labels = batch
        return torch.nn.functional.cross_entropy(self.model(images), labels)

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], index: int) -> None:
        images, labels = batch
        accuracy = (self.model(images).argmax(1) == labels).float().mean()
        self.log("val_accuracy", accuracy, batch_size=len(labels))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=2e-3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    arguments = parser.parse_args()
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as directory:
        trainer = lightning.Trainer(max_epochs=arguments.epochs, accelerator="cpu", devices=1, logger=False,
                                    enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
        trainer.fit(Classifier(), datamodule=DigitsData(directory))
        print(f"val accuracy {trainer.callback_metrics['val_accuracy'].item():.3f} after {arguments.epochs} epochs")


if __name__ == "__main__":
    main()
