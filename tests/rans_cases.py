"""Inputs for the conditional rANS tests: tables, symbols and table indexes, CPU and GPU alike."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

from visemz.encoders.cdf_tables import CdfTables, default_scale_table, gaussian_scale_tables
from visemz.encoders.rans import prepare

GOLDEN = Path(__file__).parent / "fixtures" / "rans"
SIZES = (0, 1, 2, 31, 32, 33, 63, 65, 1000, 4097, 20_001)
KINDS = ("gaussian", "zeros", "escapes", "extremes")
# (lane_bytes, lane_symbols): the default plan, many lanes in one group, many groups of 32 lanes
PLANS = ((None, None), (8, 64), (1, 64))


@functools.lru_cache(maxsize=None)
def gaussian_tables() -> CdfTables:
    return gaussian_scale_tables(default_scale_table())


def make_case(kind: str, n: int, seed: int, tables: CdfTables | None = None):
    """(symbols, indexes) int32: Gaussian symbols with their table's scale, and harder cases."""
    rng = np.random.default_rng(seed)
    scales = default_scale_table()
    idx = rng.integers(0, scales.size, n).astype(np.int32)
    if kind == "zeros":
        return np.zeros(n, np.int32), idx
    if kind == "gaussian":
        return np.round(rng.normal(0, 1, n) * scales[idx]).astype(np.int32), idx
    if kind == "escapes":  # scales 8x too small for the data: a few percent of values leave their tables
        sym = np.round(rng.normal(0, 8, n) * scales[idx]).astype(np.int32)
        return sym, idx
    if kind == "extremes":  # int32's ends among small values, all through the escape stream
        sym = np.round(rng.normal(0, 1, n) * scales[idx]).astype(np.int32)
        k = max(1, n // 20) if n else 0
        pool = np.array([-(2**31), 2**31 - 1, -(2**31) + 1, 2**31 - 2, 5000, -5000], np.int64)
        sym[rng.integers(0, n, k)] = rng.choice(pool, k).astype(np.int32)
        return sym, idx
    raise ValueError(kind)


def ideal_bits(sym: np.ndarray, idx: np.ndarray, tables: CdfTables) -> float:
    """-sum log2 p of the symbols under the quantised tables (escapes: the escape symbol's cost)."""
    entry, _ = prepare(sym, idx, tables)
    freq = np.diff(tables.cdf.astype(np.int64), append=0)[entry]
    return float(-np.log2(freq / 65536).sum())
