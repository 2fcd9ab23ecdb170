"""Homomorphic addition: the sum of two error-bounded streams, computed on their integer symbols.

``add(a, b, codec)`` decodes the per-block symbols of both streams, adds them and re-encodes;
the result is byte-for-byte ``codec.encode_values(decode(a) + decode(b))`` with exact (float64)
decoding, since 2eb qa + 2eb qb quantises back to qa + qb.  This NumPy version is the
reference for the fused GPU kernel (decode both blocks, add, re-encode, look-back offsets).
"""

from __future__ import annotations

import numpy as np

from ..errors import InvalidArgumentError, LimitExceededError
from .codecs import ErrorBounded


def add(a, b, codec: ErrorBounded) -> bytes:
    qa, da = codec.symbols(a)
    qb, db = codec.symbols(b)
    if da != db or qa.size != qb.size:
        raise InvalidArgumentError(f"cannot add a {qa.size}-value {da} stream to a {qb.size}-value {db} stream")
    s = qa.astype(np.int64) + qb.astype(np.int64)
    if s.size and np.abs(s).max() >= 2**31 - 1:
        raise LimitExceededError("the sum leaves int32: use a larger error bound for this many additions")
    return codec.encode_symbols(s.astype(np.int32), da)
