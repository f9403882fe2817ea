"""FFCV's import path ``ffcv.pipeline.state``: its ``State`` is beton's (:class:`beton.pipeline.operation.State`,
whose ``jit_mode`` is FFCV's spelling of ``kind``)."""

from beton.pipeline.operation import State

__all__ = ["State"]
