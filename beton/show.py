"""``beton show`` as a Python call: a PNG grid of a file's images, as stored or as the loader gives them::

    import beton.show

    beton.show.grid("train.beton", "stored.png")                              # the first 32 images, captioned
    beton.show.grid("train.beton", "batch.png", pipelines=train_pipelines, seed=0)  # epoch 0's first batch

The implementation lives in :mod:`beton.tools.show`.
"""

from beton.tools.show import grid

__all__ = ["grid"]
