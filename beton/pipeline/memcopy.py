"""A bounds-checked memcpy for compiled kernels.

numba's slice assignment (``out[:] = memory[a:b]``) copies element by element through an aliasing check, far
slower than memcpy on rows of a few KB (docs/loader.md, "Compilation"); a ctypes memcpy cannot be disk-cached
(numba refuses functions with ctypes pointers). This intrinsic emits LLVM's own memcpy, which caches like any
other code.
"""

from __future__ import annotations

import numba
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from beton.errors import DecodeError

__all__ = ["copy_bytes", "copy_array", "move_bytes"]


@intrinsic
def _memcpy(typingctx, destination, source, count):
    signature = types.void(types.intp, types.intp, types.intp)

    def codegen(context, builder, sig, args):
        destination_address, source_address, size = args
        cgutils.raw_memcpy(builder, builder.inttoptr(destination_address, cgutils.voidptr_t),
                           builder.inttoptr(source_address, cgutils.voidptr_t), size, 1)
        return context.get_dummy_value()

    return signature, codegen


@intrinsic
def _memmove(typingctx, destination, source, count):
    signature = types.void(types.intp, types.intp, types.intp)

    def codegen(context, builder, sig, args):
        destination_address, source_address, size = args
        cgutils.raw_memmove(builder, builder.inttoptr(destination_address, cgutils.voidptr_t),
                            builder.inttoptr(source_address, cgutils.voidptr_t), size, 1)
        return context.get_dummy_value()

    return signature, codegen


@numba.njit(nogil=True, cache=True)
def move_bytes(memory, destination, source, count):
    """Move ``count`` bytes within the 1-D uint8 array ``memory`` from offset ``source`` to ``destination``
    (overlapping ranges allowed, as memmove). Raises DecodeError instead of touching bytes outside it."""
    if count < 0 or destination < 0 or source < 0 or destination + count > memory.size \
            or source + count > memory.size:
        raise DecodeError("bytes to move lie outside the buffer")
    _memmove(memory.ctypes.data + destination, memory.ctypes.data + source, count)


@numba.njit(nogil=True, cache=True)
def copy_bytes(destination, source, start, count):
    """Copy ``count`` bytes of the 1-D uint8 array ``source`` from ``start`` into C-contiguous ``destination``.

    Raises DecodeError instead of writing out of bounds when the sizes do not fit.
    """
    if count != destination.nbytes:
        raise DecodeError("stored payload size does not match the field's dtype and shape")
    if start < 0 or start + count > source.size:
        raise DecodeError("payload lies outside the readable memory")
    _memcpy(destination.ctypes.data, source.ctypes.data + start, count)


@numba.njit(nogil=True, cache=True)
def copy_array(source, destination):
    """Copy every byte of ``source`` to the start of ``destination`` (FFCV's ``memcpy``; both contiguous).

    Raises DecodeError instead of writing out of bounds when ``source`` is larger than ``destination``.
    """
    count = source.size * source.itemsize
    if count > destination.size * destination.itemsize:
        raise DecodeError("memcpy: the source has more bytes than the destination holds")
    if not (source.flags.c_contiguous and destination.flags.c_contiguous):
        raise DecodeError("memcpy: source and destination must be contiguous arrays")
    _memcpy(destination.ctypes.data, source.ctypes.data, count)
