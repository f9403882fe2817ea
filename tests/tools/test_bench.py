"""The benchmark suite's decode limits: beton's own crop decoder, alone; errors are not swallowed."""

from __future__ import annotations

import pytest

from beton.errors import DecodeError
from beton.tools.bench import contenders as c
from beton.tools.bench.data import make_jpegs
from beton.tools.bench.timing import epoch_rate


@pytest.mark.parametrize("kind, size", [("rrc", 160), ("center", 224)])
def test_the_limits_are_the_decoders_own_decode_step(kind, size):
    task = c.ImageTask(kind, size, 8)
    jpegs = make_jpegs(6, 256)
    whole, crop = c.DecodeLimit(jpegs, task, "whole"), c.DecodeLimit(jpegs, task, "crop")
    assert (whole.decoder.decode_whole, crop.decoder.decode_whole) == (True, False)
    for limit in (whole, crop):  # everything else is the task's decoder: output size, crop, upsampling
        assert limit.decoder.output_size == task.decoder.output_size == (size, size)
        assert limit.decoder.fast_upsample == task.decoder.fast_upsample == (kind == "rrc")
        assert epoch_rate(limit) > 0 and limit.epoch == 1
    with pytest.raises(ValueError, match="rows"):
        c.DecodeLimit(jpegs, task, "some")


def test_a_limit_that_cannot_decode_an_image_raises_instead_of_reporting_a_rate():
    jpegs = make_jpegs(4, 256)
    jpegs[3] = jpegs[3][: len(jpegs[3]) // 2]  # truncated: libjpeg-turbo warns of the premature end
    limit = c.DecodeLimit(jpegs, c.ImageTask("center", 224, 8), "whole")
    with pytest.raises(DecodeError):
        epoch_rate(limit)
