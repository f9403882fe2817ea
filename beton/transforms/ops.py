"""FFCV's import path ``ffcv.transforms.ops``: the torch conversions."""

from beton.transforms.torch_ops import Convert, ToDevice, ToTensor, ToTorchImage, View

__all__ = ["ToTensor", "ToDevice", "ToTorchImage", "Convert", "View"]
