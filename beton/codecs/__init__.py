"""Codecs: bytes to pixels and back, below both the fields that store images and the decoders that read them.

:mod:`~beton.codecs.image_record` is the data-table record of a stored image (modes, scan tables),
:mod:`~beton.codecs.jpeg_scans` everything about progressive-JPEG scans, :mod:`~beton.codecs.jpeg_layout` where a
sequential JPEG's parts are, :mod:`~beton.codecs.jpeg_restarts` restart markers added losslessly (so that a crop
decodes only the segments it touches), :mod:`~beton.codecs.lossless` beton's tiled lossless codec. No module here
knows fields, pipelines or files.
"""
