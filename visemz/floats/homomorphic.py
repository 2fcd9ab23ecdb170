"""Homomorphic addition: the sum of two error-bounded streams, computed on their integer symbols.

``add(a, b, codec)`` decodes the per-block integers of both streams (Lorenzo residuals, or the
steps themselves with no predictor), adds them and re-encodes.  Prediction is linear in the
steps, so the summed residuals are the residuals of the summed steps: the result is
byte-for-byte ``codec.encode_values(decode(a) + decode(b))`` with exact (float64) decoding,
since 2eb qa + 2eb qb quantises back to qa + qb.  This NumPy version is the reference for the
fused GPU kernel (decode both blocks, add, re-encode, look-back offsets).
"""

from __future__ import annotations

import numpy as np

from ..errors import InvalidArgumentError, LimitExceededError
from .error_bounded import ErrorBounded
from .prediction import STEP_LIMIT


def add(a, b, codec: ErrorBounded) -> bytes:
    ra, da, pa = codec.residual_symbols(a)
    rb, db, pb = codec.residual_symbols(b)
    if da != db or ra.size != rb.size or pa != pb:
        raise InvalidArgumentError(f"cannot add a {ra.size}-value {da} stream ({pa}) to a {rb.size}-value {db} stream "
                                   f"({pb})")
    s = ra.astype(np.int64) + rb.astype(np.int64)
    if s.size and np.abs(s).max() >= STEP_LIMIT:
        raise LimitExceededError("the sum leaves int32: use a larger error bound for this many additions")
    return codec.encode_residuals(s.astype(np.int32), da, pa)
