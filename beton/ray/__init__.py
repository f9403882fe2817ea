"""beton on Ray Data (``pip install "beton[ray]"``): write a ``ray.data.Dataset`` as shards plus a manifest, and read
``.beton`` files, globs and manifests back into a ``ray.data.Dataset``.

* :func:`write_dataset` / :class:`BetonDatasink` (``ds.write_datasink(...)``): each Ray write task writes its rows
  to one shard through the ordinary :class:`~beton.DatasetWriter` (atomic: a task killed and retried leaves no
  partial shard, and writes the same shard again under the same name); the driver checks the fields before any
  task starts and writes the manifest last (:mod:`beton.dataset.manifest`), so a manifest names complete shards
  only.
* :func:`read_beton` / :class:`BetonDatasource` (``ray.data.read_datasource(...)``): contiguous sample ranges of
  each shard are read by parallel read tasks, as rows of numpy values (images decoded, or their JPEG bytes).

See docs/shards.md ("Building a dataset on Ray").
"""

from beton.ray.read import IMAGE_OUTPUTS, BetonDatasource, read_beton
from beton.ray.write import BetonDatasink, ShardWritten, write_dataset

__all__ = ["BetonDatasink", "ShardWritten", "write_dataset", "BetonDatasource", "read_beton", "IMAGE_OUTPUTS"]
