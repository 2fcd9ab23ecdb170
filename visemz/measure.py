"""The figures every part of visemz reports, each computed one way: PSNR, bits per pixel, median times.

PSNR's peak, the value range a reconstruction's error is measured against, is set by the
reference's dtype:

- integer images: the dtype's whole range, 255 for uint8 and 65535 for uint16 (whatever bits a
  detector fills), so scores compare across images, codecs and reports;
- float arrays (float32 images, float64 sums of frames or tensors): the reference's own value
  range, max - min (1 when the reference is constant), as error-bounded compressors (SZ, ZFP)
  define it.

``verify``, the evaluation, the stacking report and the benchmarks all call ``psnr``.
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Any, Callable

import numpy as np

from .errors import InvalidArgumentError


def integer_peak(dtype) -> float:
    """The whole range of an integer dtype: 255 for uint8, 65535 for uint16."""
    info = np.iinfo(dtype)
    return float(info.max) - float(info.min)


def peak(ref: np.ndarray) -> float:
    """The PSNR peak of a reference array (see the module notes)."""
    if np.issubdtype(ref.dtype, np.integer):
        return integer_peak(ref.dtype)
    if not np.issubdtype(ref.dtype, np.floating):
        raise InvalidArgumentError(f"PSNR of a {ref.dtype} array: expected integer or float values")
    return (float(np.ptp(ref)) or 1.0) if ref.size else 1.0


def mse(ref: np.ndarray, rec: np.ndarray) -> float:
    if ref.shape != rec.shape:
        raise InvalidArgumentError(f"cannot compare a {rec.shape} reconstruction with a {ref.shape} reference")
    return float(np.mean((ref.astype(np.float64) - rec.astype(np.float64)) ** 2))


def psnr(ref: np.ndarray, rec: np.ndarray, data_range: float | None = None) -> float:
    """PSNR in dB of ``rec`` against ``ref`` (NumPy arrays of one shape); inf when they are equal.

    ``data_range`` overrides the peak of ``ref``'s dtype."""
    err = mse(ref, rec)
    top = peak(ref) if data_range is None else float(data_range)
    return math.inf if err == 0 else 10.0 * math.log10(top**2 / err)


def max_abs_error(ref: np.ndarray, rec: np.ndarray) -> float:
    if ref.shape != rec.shape:
        raise InvalidArgumentError(f"cannot compare a {rec.shape} reconstruction with a {ref.shape} reference")
    return float(np.max(np.abs(ref.astype(np.float64) - rec.astype(np.float64)))) if ref.size else 0.0


def pixel_count(shape, paged: bool = False) -> int:
    """Pixels of an image for bpp: H x W of an HxW[xC] image (channels do not count), times P for
    a (P, H, W[, C]) page stack."""
    return math.prod(int(s) for s in (shape[:3] if paged else shape[:2]))


def bpp(nbytes: int, pixels: int) -> float:
    """Bits per pixel of ``nbytes`` real output bytes."""
    return 8.0 * nbytes / pixels


def median_seconds(fn: Callable[[], Any], reps: int, *, warmup: int = 0, sync: Callable[[], Any] | None = None,
                   reset: Callable[[], Any] | None = None) -> tuple[float, Any]:
    """(median wall seconds of ``reps`` timed calls of ``fn``, the last call's result).

    ``warmup`` untimed calls come first (compilation, connections, allocators); ``sync`` (e.g.
    ``torch.cuda.synchronize``) runs around each timed call so that queued device work counts;
    ``reset`` runs untimed before every call, e.g. to restore an input a call works on in place.
    """
    if reps < 1:
        raise InvalidArgumentError(f"reps={reps}: at least one timed run is needed")
    sync = sync or (lambda: None)
    reset = reset or (lambda: None)
    out = None
    for _ in range(warmup):
        reset()
        out = fn()
    times = []
    for _ in range(reps):
        reset()
        sync()
        t0 = time.perf_counter()
        out = fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out
