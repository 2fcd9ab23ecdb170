"""Shared inputs and round-trip checks for encoder tests (numcodecs-style helpers)."""

from __future__ import annotations

import numpy as np

from visemz.encoders import decode_ints, encode_ints

EDGE_SIZES = (0, 1, 31, 32, 33, 63, 64, 65, 127, 129, 16383, 16384, 16385, 32769)
DISTRIBUTIONS = ("zeros", "latent", "heavy", "extremes", "uniform", "dense")
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


def make_ints(dist: str, n: int, seed: int, scale: float = 0.5) -> np.ndarray:
    """Integer arrays shaped like what the encoder meets in practice, plus its worst cases."""
    rng = np.random.default_rng(seed)
    if dist == "zeros":
        return np.zeros(n, np.int32)
    if dist == "latent":  # rounded Laplacian: most values 0, a few +-1, rare larger ones
        return np.round(rng.laplace(0.0, scale, n)).astype(np.int32)
    if dist == "heavy":  # Cauchy tails reach far into int32
        return np.clip(rng.standard_cauchy(n) * 50 * scale, INT32_MIN, INT32_MAX).astype(np.int32)
    if dist == "extremes":
        pool = np.array([INT32_MIN, INT32_MAX, INT32_MIN + 1, INT32_MAX - 1, 0, 1, -1], np.int32)
        return rng.choice(pool, n)
    if dist == "uniform":
        return rng.integers(INT32_MIN, INT32_MAX, n, dtype=np.int32, endpoint=True)
    if dist == "dense":  # smooth-field residuals: every value non-zero, moderate widths
        return rng.integers(-5000, 5000, n, dtype=np.int32)
    raise ValueError(dist)


def check_roundtrip(v: np.ndarray, **kwargs) -> bytes:
    buf = encode_ints(v, **kwargs)
    out = decode_ints(buf)
    assert out.dtype == np.int32 and out.shape == (v.size,)
    np.testing.assert_array_equal(out, v.reshape(-1).astype(np.int32))
    return buf


def damaged_copies(raw: bytes, seed: int):
    """Every byte of ``raw`` changed once to another random value: yields (position, damaged bytes)."""
    data = bytearray(raw)
    rng = np.random.default_rng(seed)
    for i in range(len(data)):
        old = data[i]
        data[i] = (old + int(rng.integers(1, 256))) % 256
        yield i, bytes(data)
        data[i] = old
