"""Real photographs for demos, tests and benchmarks, derived deterministically from scikit-image's bundled set.

Random noise makes unrealistic JPEGs and meaningless benchmarks, so everything that needs "images" builds
them here: crops of rescaled, possibly mirrored copies of a handful of real photos. scikit-image is an
optional dependency (the ``test`` and ``examples`` extras); importing this module does not need it.
"""

from __future__ import annotations

import functools

import numpy as np

__all__ = ["PHOTO_NAMES", "load_photo", "photo_crop"]

#: Colour photographs that ship inside scikit-image (no download needed).
PHOTO_NAMES = ("astronaut", "chelsea", "coffee", "rocket", "hubble_deep_field", "immunohistochemistry")


@functools.lru_cache(maxsize=len(PHOTO_NAMES))
def load_photo(name: str) -> np.ndarray:
    """One bundled photo as a read-only HxWx3 uint8 array."""
    try:
        import skimage.data
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise ImportError("beton.tools.sample_photos needs scikit-image: pip install 'beton[examples]'") from error
    if name not in PHOTO_NAMES:
        raise ValueError(f"unknown photo {name!r}; choose from {PHOTO_NAMES}")
    photo = np.ascontiguousarray(getattr(skimage.data, name)())
    photo.flags.writeable = False
    return photo


def photo_crop(index: int, height: int, width: int, seed: int = 0) -> np.ndarray:
    """A deterministic height x width x 3 uint8 crop: photo ``index % 6``, rescaled, cropped, maybe mirrored.

    The same (index, height, width, seed) always gives the same pixels.
    """
    import cv2

    rng = np.random.default_rng([seed, index])
    photo = load_photo(PHOTO_NAMES[index % len(PHOTO_NAMES)])
    # Scale so the crop covers between 40 % and 100 % of the photo's shorter side.
    cover = rng.uniform(0.4, 1.0)
    scale = max(height / (photo.shape[0] * cover), width / (photo.shape[1] * cover))
    scale = max(scale, height / photo.shape[0], width / photo.shape[1])
    new_size = (max(width, round(photo.shape[1] * scale)), max(height, round(photo.shape[0] * scale)))
    interpolation = cv2.INTER_AREA if scale < 1 else cv2.INTER_LINEAR
    scaled = cv2.resize(photo, new_size, interpolation=interpolation)
    top = int(rng.integers(0, scaled.shape[0] - height + 1))
    left = int(rng.integers(0, scaled.shape[1] - width + 1))
    crop = scaled[top : top + height, left : left + width]
    if rng.random() < 0.5:
        crop = crop[:, ::-1]
    return np.ascontiguousarray(crop)
