"""Benchmark datasets, built deterministically from scikit-image's bundled photos."""

from __future__ import annotations

import numpy as np
import simplejpeg

from beton.tools.sample_photos import photo_crop

__all__ = ["make_jpegs", "make_raw_images", "JpegDataset", "ArrayDataset", "DecodedJpegDataset"]


def make_jpegs(count: int, short_side: int, quality: int = 90) -> list[bytes]:
    """Photo JPEGs whose shorter side is ``short_side`` and longer side 1-1.5x that, in both orientations."""
    rng = np.random.default_rng(short_side)
    images = []
    for index in range(count):
        long_side = int(short_side * rng.uniform(1.0, 1.5))
        height, width = (short_side, long_side) if index % 3 else (long_side, short_side)
        pixels = photo_crop(index, height, width, seed=short_side)
        images.append(simplejpeg.encode_jpeg(pixels, quality=quality, colorsubsampling="420"))
    return images


def make_raw_images(count: int, size: int = 32) -> tuple[np.ndarray, np.ndarray]:
    """CIFAR-like (count, 3, size, size) uint8 crops of real photos, and labels 0..9."""
    tiles = np.stack([photo_crop(i, size, size) for i in range(min(count, 2000))])
    images = np.ascontiguousarray(tiles[np.arange(count) % len(tiles)].transpose(0, 3, 1, 2))
    return images, (np.arange(count) % 10).astype(np.int64)


class JpegDataset:
    """(JPEG bytes, label) per sample: what beton's writer stores as it is."""

    def __init__(self, jpegs: list[bytes]) -> None:
        self.jpegs = jpegs

    def __len__(self) -> int:
        return len(self.jpegs)

    def __getitem__(self, index: int) -> tuple[bytes, int]:
        return self.jpegs[index], index % 1000


class DecodedJpegDataset(JpegDataset):
    """(pixels, label) per sample, for writers that want arrays (FFCV)."""

    def __getitem__(self, index: int) -> tuple[np.ndarray, int]:
        return simplejpeg.decode_jpeg(self.jpegs[index]), index % 1000


class ArrayDataset:
    """(array row, label) per sample."""

    def __init__(self, images: np.ndarray, labels: np.ndarray) -> None:
        self.images, self.labels = images, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[np.ndarray, int]:
        return self.images[index], int(self.labels[index])
