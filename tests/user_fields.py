"""User-defined fields living in the user's own module, as real extensions would; shared by the tests."""

from __future__ import annotations

import dataclasses

import numpy as np

from beton.errors import EncodeError
from beton.fields import Encoded, Field


@dataclasses.dataclass(frozen=True)
class AudioField(Field):
    """Mono 16-bit PCM of any length; the metadata records the frame count and the sample rate is an argument."""

    sample_rate: int = 16000

    metadata_dtype = np.dtype([("num_frames", "<u4")])
    has_payload = True

    def encode(self, value, context):
        if not isinstance(value, np.ndarray) or value.ndim != 1:
            raise EncodeError("expected a 1-D array of samples")
        pcm = value.astype("<i2")
        return Encoded(metadata=(len(pcm),), payload=pcm.tobytes())

    def to_python(self, metadata, payload):
        pcm = np.frombuffer(payload.tobytes(), "<i2")
        if len(pcm) != metadata["num_frames"]:
            raise ValueError("frame count mismatch")
        return pcm

    def arguments(self):
        return {"sample_rate": self.sample_rate}

    def summary(self, records):
        return [f"audio: {records['num_frames'].sum() / self.sample_rate:.3f} s in all"]


@dataclasses.dataclass(frozen=True)
class NoisyField(Field):
    """Stores a random draw from the encoding context's generator, to test per-sample seeding."""

    metadata_dtype = np.dtype([("noise", "<f8")])

    def encode(self, value, context):
        return Encoded(metadata=(context.rng().random(),))

    def to_python(self, metadata, payload):
        return float(metadata["noise"])


def make_local_field():
    """A field class defined in a function: its qualified name cannot be imported, so a file names a class
    no reader finds by itself."""

    @dataclasses.dataclass(frozen=True)
    class Celsius(Field):  # defined in a function: its qualified name cannot be imported
        metadata_dtype = np.dtype([("kelvin", "<f4")])

        def encode(self, value, context):
            return Encoded(metadata=(value + 273.15,))

        def to_python(self, metadata, payload):
            return round(float(metadata["kelvin"]) - 273.15, 3)

    return Celsius


@dataclasses.dataclass(frozen=True)
class PreparedField(Field):
    """Stores each int; ``prepare_encoding`` writes the writing process's pid to ``marker``, and encoding refuses
    to run before that file exists (what a field compiling its encoder there relies on)."""

    marker: str = ""

    metadata_dtype = np.dtype([("value", "<i8")])

    def prepare_encoding(self):
        import os

        with open(self.marker, "w") as file:
            file.write(str(os.getpid()))

    def encode(self, value, context):
        import os

        if not os.path.exists(self.marker):
            raise EncodeError("encoded before prepare_encoding ran")
        return Encoded(metadata=(int(value),))

    def to_python(self, metadata, payload):
        return int(metadata["value"])

    def arguments(self):
        return {"marker": self.marker}
