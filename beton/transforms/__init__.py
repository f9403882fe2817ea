"""Transforms: operations to put after a decoder in a pipeline."""

from beton.transforms.torch_ops import Convert, ModuleWrapper, Squeeze, ToDevice, ToTensor, ToTorchImage, ViewAs

__all__ = ["ToTensor", "ToTorchImage", "Squeeze", "Convert", "ViewAs", "ToDevice", "ModuleWrapper"]
