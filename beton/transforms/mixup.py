"""ImageMixup and LabelMixup: mix each sample with a partner from the same batch.

Both operations draw the partner permutation and the mixing weights from the batch's shared generator
(``context.batch_rng("mixup")``, keyed by seed, epoch and batch number), so an image pipeline and a label
pipeline with the same ``alpha`` and ``same_lambda`` agree on every pair and every weight, whatever thread ran
them. A sample's weight ``lam`` is that of itself; ``1 - lam`` that of its partner.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numba
import numpy as np

from beton.errors import DecodeError
from beton.pipeline.operation import BatchContext, BatchOperation, State
from beton.transforms._image import require_uint8_images

__all__ = ["ImageMixup", "LabelMixup", "MixupToOneHot", "mixup_draws"]


def mixup_draws(context: BatchContext, count: int, alpha: float, same_lambda: bool) -> tuple[np.ndarray, np.ndarray]:
    """(partner permutation, weights) for a batch of ``count`` samples."""
    rng = context.batch_rng("mixup")
    permutation = rng.permutation(count)
    weights = np.full(count, rng.beta(alpha, alpha)) if same_lambda else rng.beta(alpha, alpha, count)
    return permutation, weights


# Images as flat rows of the batch, unsigned indices: LLVM vectorises these loops, which it does not with ravel()
# views and signed indices (see beton.transforms.flip).
@numba.njit(nogil=True, cache=True)
def _mix_images(batch, original, permutation, weights):
    count = batch.shape[0]
    images, originals = batch.reshape(count, -1), original.reshape(count, -1)
    size = np.uint64(images.shape[1])
    for i in range(count):
        image, kept = images[i], originals[i]
        for k in range(size):
            kept[k] = image[k]
    for i in range(count):
        lam = weights[i]
        mine, partner, out = originals[i], originals[permutation[i]], images[i]
        for k in range(size):
            out[k] = min(255, max(0, int(lam * mine[k] + (1.0 - lam) * partner[k] + 0.5)))


@dataclasses.dataclass(frozen=True)
class _Mixup(BatchOperation):
    """The draw both mixups share: Beta(alpha, alpha) weights, one for the batch if ``same_lambda``."""

    alpha: float = 1.0
    same_lambda: bool = True

    def __post_init__(self) -> None:
        if self.alpha <= 0:
            raise ValueError(f"alpha must be positive, got {self.alpha}")


@dataclasses.dataclass(frozen=True)
class ImageMixup(_Mixup):
    """uint8 HxWxC images: image = lam * image + (1 - lam) * partner, in place."""

    def output_state(self, previous: Any) -> State:
        return require_uint8_images(self, previous)

    def apply(self, batch: np.ndarray, context: BatchContext) -> np.ndarray:
        permutation, weights = mixup_draws(context, len(batch), self.alpha, self.same_lambda)
        batch = np.ascontiguousarray(batch)  # slot buffers already are: the kernel walks flat rows
        original = context.scratch(batch.nbytes).view(batch.dtype).reshape(batch.shape)
        _mix_images(batch, original, permutation, weights)
        return batch


@dataclasses.dataclass(frozen=True)
class LabelMixup(_Mixup):
    """Integer labels -> float64 rows (label, partner's label, lam), matching ImageMixup's pairs."""

    def output_state(self, previous: Any) -> State:
        previous.require(isinstance(previous, State) and previous.kind == "numpy" and previous.shape == (),
                         self, "a numpy batch of scalar labels (put it before ToTensor)")
        return State((3,), np.dtype(np.float64))

    def apply(self, batch: np.ndarray, context: BatchContext) -> np.ndarray:
        permutation, weights = mixup_draws(context, len(batch), self.alpha, self.same_lambda)
        return np.stack([batch, batch[permutation], weights], axis=1).astype(np.float64)


@dataclasses.dataclass(frozen=True)
class MixupToOneHot(BatchOperation):
    """LabelMixup's rows (label, partner's label, lam) -> mixed one-hot targets ``lam * onehot(label) +
    (1 - lam) * onehot(partner)`` of ``num_classes`` columns; on numpy or torch batches (on any device)."""

    num_classes: int

    def output_state(self, previous: Any) -> State:
        previous.require(isinstance(previous, State) and previous.kind in ("numpy", "torch")
                         and tuple(previous.shape) == (3,), self, "LabelMixup's (label, partner, lam) rows")
        return dataclasses.replace(previous, shape=(self.num_classes,))

    def apply(self, batch: Any, context: BatchContext) -> Any:
        rows = np.arange(len(batch))
        labels, partners = batch[:, 0], batch[:, 1]
        self._check_labels(batch[:, :2])
        if isinstance(batch, np.ndarray):
            out = np.zeros((len(batch), self.num_classes), batch.dtype)
            np.add.at(out, (rows, labels.astype(np.int64)), batch[:, 2])
            np.add.at(out, (rows, partners.astype(np.int64)), 1 - batch[:, 2])
            return out
        import torch

        out = torch.zeros((len(batch), self.num_classes), dtype=batch.dtype, device=batch.device)
        out.scatter_add_(1, labels.long()[:, None], batch[:, 2:3])
        out.scatter_add_(1, partners.long()[:, None], 1 - batch[:, 2:3])
        return out

    def _check_labels(self, labels: Any) -> None:
        """DecodeError unless every label is a class: numpy's indexing would take -1 for the last one, silently.

        Not on a GPU: reading the labels back there would make the batch wait for the training step queued
        before it, and an out-of-range index is not silent there (scatter_add_ fails a device-side assertion)."""
        if not len(labels) or str(getattr(labels, "device", "cpu")) != "cpu":  # numpy's and torch's spellings
            return
        low, high = float(labels.min()), float(labels.max())
        if low < 0 or high >= self.num_classes:
            raise DecodeError(f"{self!r} needs labels in 0..{self.num_classes - 1}, got {low if low < 0 else high:g}")
