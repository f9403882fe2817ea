"""Tools built on the library: the ``beton`` command (:mod:`~beton.tools.cli`), converters, ``tune``,
the benchmark suite and the sample photos used by tests, demos and benchmarks. Nothing in the library
imports them."""
