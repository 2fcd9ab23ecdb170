"""Bjontegaard deltas (VCEG-M33) with piecewise cubic interpolation.

As in the JVET/VCEG common-test-condition spreadsheets: each curve is interpolated with a
monotone piecewise cubic (PCHIP) through its points in (log10 rate, quality), both curves
are integrated over the interval they share, and the mean gap is reported.
BD-rate: average rate difference at equal quality, in percent (negative = fewer bits).
BD-PSNR (or BD of any quality metric): average quality difference at equal rate.
"""

from __future__ import annotations

import numpy as np
from scipy.interpolate import PchipInterpolator

from ..errors import InvalidArgumentError


class BDError(InvalidArgumentError):
    """A curve that a Bjontegaard delta cannot be computed on (too few points, not monotone, no overlap)."""


def _curve(rate, quality, name: str) -> tuple[np.ndarray, np.ndarray]:
    """(log10 rate, quality), sorted by rate; both must increase strictly."""
    r = np.asarray(rate, dtype=np.float64)
    q = np.asarray(quality, dtype=np.float64)
    if r.ndim != 1 or r.shape != q.shape or r.size < 2:
        raise BDError(f"{name} curve needs at least 2 (rate, quality) points, got rate {r.shape} and quality {q.shape}")
    if not (np.all(np.isfinite(r)) and np.all(np.isfinite(q)) and np.all(r > 0)):
        raise BDError(f"{name} curve has a non-finite value or a rate <= 0: rates {r.tolist()}, quality {q.tolist()}")
    order = np.argsort(r)
    r, q = r[order], q[order]
    if np.any(np.diff(r) <= 0) or np.any(np.diff(q) <= 0):
        raise BDError(f"{name} curve: quality does not increase strictly with rate "
                      f"({list(zip(r.tolist(), q.tolist()))})")
    return np.log10(r), q


def _mean_gap(xa: np.ndarray, ya: np.ndarray, xb: np.ndarray, yb: np.ndarray) -> float:
    """Mean of (curve b - curve a) over the x interval both cover (x ascending)."""
    lo, hi = max(xa[0], xb[0]), min(xa[-1], xb[-1])
    if hi <= lo:
        raise BDError(f"the curves share no interval: [{xa[0]:.4g}, {xa[-1]:.4g}] and [{xb[0]:.4g}, {xb[-1]:.4g}]")
    area_a = PchipInterpolator(xa, ya).integrate(lo, hi)
    area_b = PchipInterpolator(xb, yb).integrate(lo, hi)
    return float((area_b - area_a) / (hi - lo))


def bd_rate(anchor_rate, anchor_quality, test_rate, test_quality) -> float:
    """Average rate change of test against anchor at equal quality, in percent."""
    lra, qa = _curve(anchor_rate, anchor_quality, "anchor")
    lrb, qb = _curve(test_rate, test_quality, "test")
    return (10.0 ** _mean_gap(qa, lra, qb, lrb) - 1.0) * 100.0


def bd_quality(anchor_rate, anchor_quality, test_rate, test_quality) -> float:
    """Average quality change of test against anchor at equal rate (BD-PSNR for PSNR, in dB)."""
    lra, qa = _curve(anchor_rate, anchor_quality, "anchor")
    lrb, qb = _curve(test_rate, test_quality, "test")
    return _mean_gap(lra, qa, lrb, qb)


bd_psnr = bd_quality
