"""Fields written the way FFCV's documentation describes its field contract (``metadata_type``,
``encode(destination, value, malloc)``, ``to_binary``/``from_binary``, ``get_decoder_class``), with FFCV's
import paths under the ``beton`` name, and their decoders: to check that such fields port unchanged."""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, Optional, Tuple, Type

import numpy as np

from beton.fields.base import ARG_TYPE, Field
from beton.libffcv import memcpy
from beton.pipeline.allocation_query import AllocationQuery
from beton.pipeline.compiler import Compiler
from beton.pipeline.operation import Operation
from beton.pipeline.state import State

AUDIO_ARGUMENTS = np.dtype([("sample_rate", "<u4"), ("channels", "<u2")])


class PaddedPCMDecoder(Operation):
    """Each clip's int16 frames at the start of a row as long as the longest clip of the file (rest: zeros)."""

    def declare_state_and_memory(self, previous_state: State) -> Tuple[State, Optional[AllocationQuery]]:
        longest = int(self.metadata["frames"].max()) if len(self.metadata) else 0
        shape = (longest,)
        return replace(previous_state, jit_mode=True, shape=shape, dtype=np.dtype("<i2")), \
            AllocationQuery(shape, np.dtype("<i2"))

    def generate_code(self) -> Callable:
        mem_read = self.memory_read
        copy = Compiler.compile(memcpy)
        loop = Compiler.get_iterator()

        def decode(batch_indices, destination, metadata, storage_state):
            for i in loop(batch_indices.shape[0]):
                pcm = mem_read(metadata[batch_indices[i]]["ptr"], storage_state)
                copy(pcm, destination[i])
            return destination

        return decode


class AudioField(Field):
    """Mono 16-bit PCM clips of any length (empty ones too): the payload holds the frames, the metadata record
    the pointer to them and their count; the sample rate is an argument, stored by to_binary."""

    def __init__(self, sample_rate: int = 16000) -> None:
        self.sample_rate = sample_rate

    @property
    def metadata_type(self) -> np.dtype:
        return np.dtype([("ptr", "<u8"), ("frames", "<u4")])

    @staticmethod
    def from_binary(binary: ARG_TYPE) -> Field:
        arguments = binary[: AUDIO_ARGUMENTS.itemsize].view(AUDIO_ARGUMENTS)[0]
        return AudioField(int(arguments["sample_rate"]))

    def to_binary(self) -> ARG_TYPE:
        result = np.zeros(1, dtype=ARG_TYPE)[0]
        arguments = np.array([(self.sample_rate, 1)], AUDIO_ARGUMENTS)
        result[0][: AUDIO_ARGUMENTS.itemsize] = arguments.view("<u1")
        return result

    def encode(self, destination, clip, malloc) -> None:
        pcm = np.ascontiguousarray(clip, dtype="<i2")
        destination["ptr"], buffer = malloc(pcm.nbytes)
        buffer[:] = pcm.view("<u1")
        destination["frames"] = len(pcm)

    def get_decoder_class(self) -> Type[Operation]:
        return PaddedPCMDecoder


class VectorDecoder(Operation):
    """A fixed-length float32 vector per sample, copied byte for byte."""

    def declare_state_and_memory(self, previous_state: State) -> Tuple[State, Optional[AllocationQuery]]:
        shape = (self.field.length,)
        return replace(previous_state, jit_mode=True, shape=shape, dtype=np.dtype("<f4")), \
            AllocationQuery(shape, np.dtype("<f4"))

    def generate_code(self) -> Callable:
        mem_read = self.memory_read
        copy = Compiler.compile(memcpy)
        loop = Compiler.get_iterator()

        def decode(batch_indices, destination, metadata, storage_state):
            for i in loop(batch_indices.shape[0]):
                copy(mem_read(metadata[batch_indices[i]], storage_state), destination[i].view(np.uint8))
            return destination

        return decode


class VectorField(Field):
    """A float32 vector of fixed length; the metadata record is the pointer itself (a plain uint64)."""

    def __init__(self, length: int) -> None:
        self.length = length

    @property
    def metadata_type(self) -> np.dtype:
        return np.dtype("<u8")

    @staticmethod
    def from_binary(binary: ARG_TYPE) -> Field:
        return VectorField(int(binary[:8].view("<u8")[0]))

    def to_binary(self) -> ARG_TYPE:
        return np.array([self.length], "<u8").view("<u1")  # shorter than ARG_TYPE: the rest is zeros

    def encode(self, destination, vector, malloc) -> None:
        data = np.ascontiguousarray(vector, dtype="<f4").reshape(self.length)
        destination[0], buffer = malloc(data.nbytes)
        buffer[:] = data.view("<u1")

    def get_decoder_class(self) -> Type[Operation]:
        return VectorDecoder


class OffsetDecoder(Operation):
    """The stored integer plus the field's offset, as int64 (no payload to read)."""

    def declare_state_and_memory(self, previous_state: State) -> Tuple[State, Optional[AllocationQuery]]:
        return replace(previous_state, jit_mode=True, shape=(), dtype=np.dtype("<i8")), \
            AllocationQuery((), np.dtype("<i8"))

    def generate_code(self) -> Callable:
        offset = self.field.offset

        def decode(batch_indices, destination, metadata, storage_state):
            for i in range(batch_indices.shape[0]):
                destination[i] = metadata[batch_indices[i]] + offset
            return destination

        return decode


class OffsetIntField(Field):
    """An integer stored minus an offset, in the metadata alone (it never calls malloc)."""

    def __init__(self, offset: int = 0) -> None:
        self.offset = offset

    @property
    def metadata_type(self) -> np.dtype:
        return np.dtype("<i8")

    @staticmethod
    def from_binary(binary: ARG_TYPE) -> Field:
        return OffsetIntField(int(binary[:8].view("<i8")[0]))

    def to_binary(self) -> ARG_TYPE:
        result = np.zeros(1, dtype=ARG_TYPE)[0]
        result[0][:8] = np.array([self.offset], "<i8").view("<u1")
        return result

    def encode(self, destination, value, malloc) -> None:
        destination[0] = value - self.offset

    def get_decoder_class(self) -> Type[Operation]:
        return OffsetDecoder


class RawImageDecoder(Operation):
    """The stored pixels of each image, as an HxWxC uint8 batch."""

    def declare_state_and_memory(self, previous_state: State) -> Tuple[State, Optional[AllocationQuery]]:
        shape = tuple(self.field.shape)
        return replace(previous_state, jit_mode=True, shape=shape, dtype=np.dtype("u1")), \
            AllocationQuery(shape, np.dtype("u1"))

    def generate_code(self) -> Callable:
        mem_read = self.memory_read
        copy = Compiler.compile(memcpy)
        loop = Compiler.get_iterator()

        def decode(batch_indices, destination, metadata, storage_state):
            for i in loop(batch_indices.shape[0]):
                copy(mem_read(metadata[batch_indices[i]]["ptr"], storage_state), destination[i].reshape(-1))
            return destination

        return decode


class RawImageField(Field):
    """Fixed-shape uint8 images stored as raw pixels; the shape is the field's argument."""

    def __init__(self, shape=(8, 8, 3)) -> None:
        self.shape = tuple(shape)

    @property
    def metadata_type(self) -> np.dtype:
        return np.dtype([("ptr", "<u8")])

    @staticmethod
    def from_binary(binary: ARG_TYPE) -> Field:
        return RawImageField(tuple(int(v) for v in binary[:24].view("<u8")))

    def to_binary(self) -> ARG_TYPE:
        return np.array(self.shape, "<u8").view("<u1")

    def encode(self, destination, image, malloc) -> None:
        pixels = np.ascontiguousarray(image, dtype=np.uint8).reshape(self.shape)
        destination["ptr"], buffer = malloc(pixels.nbytes)
        buffer[:] = pixels.reshape(-1)

    def get_decoder_class(self) -> Type[Operation]:
        return RawImageDecoder
