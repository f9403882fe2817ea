"""Tools built on the library: the ``beton`` command (:mod:`~beton.tools.cli`), the converters
(:mod:`~beton.tools.convert`), ``show`` (a grid of a file's images), ``tune``, the benchmark suite and the sample
photos used by tests, demos and benchmarks. Nothing in the library imports them."""
