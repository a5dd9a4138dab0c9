"""Reading the array a denoising candidate returned (docs/method.md §5d "What the candidate returns"):
base64 of .npy bytes, checked before anything is allocated.

The candidate's process writes these bytes (it can write its own output.json and exit), so
nothing in them is trusted: the header is parsed by NumPy's header reader (a literal, never
pickle), then its dtype must be a plain real number type of at most 8 bytes, its shape exactly
the expected cells x genes, and the bytes after the header exactly shape x itemsize; only then is
the array made, as a view of bytes already held (`numpy.frombuffer`), and copied.
Every failure is a reason string (the candidate's verdict), never an exception.
"""

from __future__ import annotations

import base64
import binascii
import io
from typing import Any

import numpy as np

ALLOWED_KINDS = "biuf"  # bool, signed and unsigned integers, floats: real numbers only (no object, complex, record)
MAX_ITEMSIZE = 8  # float64 / int64 at most: the sandbox's output limit is sized for 8 bytes per entry
MAX_HEADER_BYTES = 10_000  # NumPy's own default cap on an .npy header (numpy.lib.format max_header_size)


def decode_output(output: Any, shape: tuple[int, int]) -> tuple[np.ndarray | None, str]:
    """(the array, "") or (None, why not) from the driver's {"npy": base64 of .npy bytes}."""
    if not isinstance(output, dict) or not isinstance(output.get("npy"), str):
        return None, "the program returned no array (expected the driver's {'npy': ...})"
    try:
        raw = base64.b64decode(output["npy"], validate=True)
    except (binascii.Error, ValueError) as err:
        return None, f"the returned array is not base64: {err}"
    return read_npy(raw, shape)


def read_npy(raw: bytes, shape: tuple[int, int]) -> tuple[np.ndarray | None, str]:
    """(the array of `shape`, in its own dtype, "") or (None, why not): the header is checked before any allocation."""
    header, reason = _header(raw)
    if header is None:
        return None, reason
    (got_shape, fortran, dtype), offset = header
    if dtype.hasobject or dtype.fields is not None or dtype.subdtype is not None or dtype.kind not in ALLOWED_KINDS:
        return None, f"the returned array has dtype {dtype}: real numbers (bool, int, uint, float) only"
    if dtype.itemsize > MAX_ITEMSIZE:
        return None, f"the returned array has dtype {dtype} of {dtype.itemsize} bytes; at most {MAX_ITEMSIZE} bytes per value"
    if not isinstance(got_shape, tuple) or tuple(got_shape) != tuple(shape):
        return None, f"magic_denoise returned shape {got_shape}; expected {tuple(shape)}, the shape of its input"
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    body = len(raw) - offset
    if body != expected:
        return None, (
            f"the returned array's data is {body} bytes; its header ({dtype}, shape {got_shape}) "
            f"needs exactly {expected} (a truncated or padded .npy)"
        )
    flat = np.frombuffer(raw, dtype=dtype, count=int(np.prod(shape)), offset=offset)
    array = flat.reshape(shape, order="F" if fortran else "C")
    return np.array(array, dtype=dtype.newbyteorder("=")), ""  # a copy in native byte order, its dtype kept (subnormals are judged in it)


def _header(raw: bytes) -> tuple[tuple[tuple[Any, bool, np.dtype], int] | None, str]:
    """((shape, fortran_order, dtype), the data's offset) or (None, why not), read by NumPy's literal parser."""
    stream = io.BytesIO(raw)
    try:
        major, minor = np.lib.format.read_magic(stream)
        if (major, minor) == (1, 0):
            fields = np.lib.format.read_array_header_1_0(stream, max_header_size=MAX_HEADER_BYTES)
        elif (major, minor) == (2, 0):
            fields = np.lib.format.read_array_header_2_0(stream, max_header_size=MAX_HEADER_BYTES)
        else:
            return None, f"the returned .npy has format version {major}.{minor}, which is not supported"
    except (ValueError, EOFError, OSError, TypeError, SyntaxError, MemoryError, RecursionError, OverflowError) as err:
        return None, f"the returned array's .npy header could not be read: {type(err).__name__}: {str(err)[:200]}"
    shape, fortran, dtype = fields
    if not isinstance(dtype, np.dtype):
        return None, "the returned array's .npy header names no dtype"
    return ((shape, bool(fortran), dtype), stream.tell()), ""
