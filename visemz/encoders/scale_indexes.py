"""Scale -> CDF table index, the same on every device: CompressAI's rule plus a list of exceptions.

The hyperprior's scales come from a float64 synthesis, and float64 results differ
between a CPU and a GPU in their last bits (summation order, fused multiply-adds).  A
scale that lies that close to a table boundary could get a different index on the
decoding device, and the symbol would be decoded with the wrong distribution.  So the
encoder lists every position whose scale lies within a relative ``rel_tol`` of a
boundary, with the index it used; the decoder computes indexes from its own scales and
overrides the listed positions.  A position the encoder did not list was more than
``rel_tol`` away from every boundary, so the decoder's scale (off by far less) falls on
the same side of each: same index.

Why 1e-8.  An output of a float64 convolution is a sum of K products; any two summation
orders differ by at most 2 (K - 1) u sum |terms| (u = 2**-53; Higham, Accuracy and
Stability, 4.2).  For the mean-scale hyper-synthesis's last layer (a 3 x 3 convolution
over 3M/2 channels: K = 2592 for M = 192) that is 5.8e-13 times sum |terms| / |output|:
a relative gap of 1e-8 allows that ratio to reach 1.7e4, where an output that sits on a
table scale (0.11 or more) would need terms some ten thousand times larger than itself
that cancel; the earlier layers' differences reach the output through the same kind of
sum.  Measured: CompressAI's N=128/M=192 hyper-synthesis with random weights, its last
layer summed in reversed channel order, moved no output by more than 9e-15 relative
(tests/test_scale_indexes.py perturbs scales by up to rel_tol / 2).
The cost is small: with CompressAI's 64 scales (a factor 1.13 apart) a fraction
2 rel_tol / ln 1.13 = 1.6e-7 of the positions is listed, 0.05 per 768 x 512 image.

Section layout (``encode_scale_exceptions``): empty bytes when nothing is listed, else
an ints stream (global policy, no entropy stage) of 2k int32 values: the first listed
position, the k - 1 gaps to the next ones, then the k indexes.
"""

from __future__ import annotations

import functools

import numpy as np

from .. import cuda
from .. import device as dev
from ..errors import CorruptStreamError, InvalidArgumentError, checked_first_on_error
from . import decode_ints, encode_ints, rans_gpu

__all__ = ["DEFAULT_REL_TOL", "scale_indexes", "encode_scale_exceptions", "decode_and_apply_scale_exceptions",
           "read_scale_exceptions", "apply_scale_exceptions"]

DEFAULT_REL_TOL = 1e-8


def _xp(a):
    return cuda.require_cupy() if cuda.is_gpu_array(a) else np


def _check_table(scale_table) -> np.ndarray:
    t = np.asarray(dev.as_numpy(scale_table), np.float64)
    if t.ndim != 1 or t.size < 1 or not np.all(np.isfinite(t)) or np.any(t <= 0) or np.any(np.diff(t) <= 0):
        raise InvalidArgumentError("scale_table must be a non-empty, strictly increasing list of positive scales")
    return t


def _check_tol(rel_tol: float) -> float:
    if not 0 < rel_tol < 1e-3:
        raise InvalidArgumentError(f"rel_tol={rel_tol} must lie in (0, 1e-3)")
    return float(rel_tol)


def _scales(scales, check_finite: bool = True):
    xp = _xp(scales)
    s = cuda.as_cupy(scales) if xp is not np else np.asarray(scales)
    if s.dtype != xp.float64:
        raise InvalidArgumentError(f"scales must be float64 (a float64 hyper-synthesis), got {s.dtype}")
    if check_finite:
        _check_finite(xp, s)
    return xp, s


def _check_finite(xp, s) -> None:
    if s.size and not bool(xp.isfinite(s).all()):
        _refuse_nonfinite()


def _refuse_nonfinite() -> None:
    raise InvalidArgumentError("scales hold NaN or infinite values")


def _thresholds(xp, table: np.ndarray):
    """The table's scales but the last (the boundaries between indexes), on the scales' device."""
    thr = table[:-1]
    return thr if xp is np else _device_thresholds(thr.tobytes(), xp.cuda.Device().id)


@functools.lru_cache(maxsize=16)
def _device_thresholds(thr: bytes, device_id: int):
    """A model's thresholds on one GPU, copied once (per table and device), not per image."""
    return cuda.resident_copy([np.frombuffer(thr, np.float64)], device_id)[0]


def _index(xp, thresholds, s):
    """CompressAI's build_indexes: the number of table scales (all but the last) below s."""
    return xp.searchsorted(thresholds, s, side="left").astype(xp.int32)


def scale_indexes(scales, scale_table, rel_tol: float = DEFAULT_REL_TOL):
    """(indexes shaped like scales, int32; flat positions whose index could round either way, int64).

    scales: float64 NumPy or cupy array (cupy in, cupy out).  The index of s is the number
    of entries of scale_table[:-1] smaller than s (so scales below the first entry get 0,
    above the last but one the last index), which is GaussianConditional.build_indexes.
    """
    on_gpu = cuda.is_gpu_array(scales)
    xp, s = _scales(scales, check_finite=not on_gpu)  # on a GPU: checked below, in the same host read
    # on a GPU the scales' finiteness is read later, with the indexes: the scales' error first, as on the CPU
    with checked_first_on_error(lambda: _check_finite(xp, s), (InvalidArgumentError,) if on_gpu else ()):
        tol, table = _check_tol(rel_tol), _check_table(scale_table)
    if on_gpu:
        with cuda.after_torch(scales):
            return _gpu_indexes(s, table, tol)
    thr = _thresholds(xp, table)
    flat = s.reshape(-1)
    idx = _index(xp, thr, flat)
    near = _index(xp, thr, flat * (1 - tol)) != _index(xp, thr, flat * (1 + tol))
    return idx.reshape(s.shape), np.flatnonzero(near).astype(np.int64)


def _gpu_indexes(s, table: np.ndarray, tol: float):
    """``scale_indexes`` on a GPU: one kernel (cuda/rans.cu, scale_index) gives the indexes, the listed flags and
    the counts of non-finite scales and listed positions, and one host read brings the counts back.  Listed
    positions are almost never there (0.05 per Kodak image), so the flatnonzero, which reads its count from the
    device (a second sync), rarely runs."""
    cp = cuda.require_cupy()
    flat = cp.ascontiguousarray(s.reshape(-1))
    n = flat.size
    idx, near, counts = cp.empty(n, cp.int32), cp.empty(n, cp.uint8), cp.zeros(2, cp.uint64)
    if n:
        # 1 - tol and 1 + tol in Python's float64, the factors the CPU path multiplies by
        rans_gpu.kernel("scale_index")((rans_gpu.grid(n),), (rans_gpu.THREADS,), (
            flat, np.int64(n), _thresholds(cp, table), np.int32(table.size - 1), np.float64(1 - tol),
            np.float64(1 + tol), idx, near, counts))
    nonfinite, count = (int(v) for v in counts.get())
    if nonfinite:
        _refuse_nonfinite()
    ambiguous = cp.flatnonzero(near).astype(cp.int64) if count else cp.zeros(0, cp.int64)
    return idx.reshape(s.shape), ambiguous


def encode_scale_exceptions(indexes, ambiguous) -> bytes:
    """The exception section: the listed positions and the indexes the encoder used there."""
    if getattr(ambiguous, "size", None) == 0:
        return b""  # nothing listed (the usual case): no read from the device
    pos = np.asarray(dev.as_numpy(ambiguous), np.int64).reshape(-1)
    if pos.size == 0:
        return b""
    if np.any(np.diff(pos) <= 0) or pos[0] < 0 or pos[-1] >= indexes.size:
        raise InvalidArgumentError("ambiguous positions must be increasing flat positions inside the index array")
    used = np.asarray(dev.as_numpy(indexes.reshape(-1)[_xp(indexes).asarray(pos)]), np.int64)
    data = np.concatenate([pos[:1], np.diff(pos), used]).astype(np.int32)
    return encode_ints(data, policy="global", entropy="none")


def decode_and_apply_scale_exceptions(buf, scales, scale_table, rel_tol: float = DEFAULT_REL_TOL):
    """The decoder's indexes (shaped like scales, on the scales' device) with the listed positions overridden.

    Each listed position is checked: increasing and inside the array, its index in range,
    and the decoder's own scale within 2 rel_tol of a boundary between the listed index
    and its own (the encoder's scale was within rel_tol; the devices differ by far less).
    Anything else raises CorruptStreamError.
    """
    idx, s, table, tol = _own_indexes(scales, scale_table, rel_tol)
    if len(memoryview(buf).cast("B")) == 0:
        return idx.reshape(s.shape)
    pos, listed = read_scale_exceptions(buf, s.size, table.size)
    return _override(idx, s, table, tol, pos, listed)


def read_scale_exceptions(buf, total: int, table_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(listed positions, their indexes), int64 NumPy arrays, of an exception section over ``total`` symbols
    (empty arrays for an empty section), its positions and indexes checked; CorruptStreamError otherwise.
    For a section shared by several arrays of scales (the slices of a channel-context model's latent, one after
    the other): each array's positions are then handed to ``apply_scale_exceptions``."""
    if len(memoryview(buf).cast("B")) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    data = decode_ints(buf, max_count=2 * total).astype(np.int64)  # a position and an index per listed symbol
    k = data.size // 2
    if data.size % 2 or k == 0:
        raise CorruptStreamError(f"scale exception section holds {data.size} values, not 2 per listed position")
    gaps, listed = data[:k], data[k:]
    pos = np.cumsum(gaps)
    if gaps[0] < 0 or np.any(gaps[1:] < 1) or pos[-1] >= total:
        raise CorruptStreamError(f"scale exception positions must increase inside the {total} symbols")
    if np.any(listed < 0) or np.any(listed >= table_size):
        raise CorruptStreamError(f"scale exception index outside 0..{table_size - 1}")
    return pos, listed


def apply_scale_exceptions(scales, scale_table, positions: np.ndarray, listed: np.ndarray,
                           rel_tol: float = DEFAULT_REL_TOL):
    """The decoder's indexes of ``scales`` with ``listed`` at ``positions`` (flat, within these scales; from
    ``read_scale_exceptions``), each checked as ``decode_and_apply_scale_exceptions`` checks them."""
    idx, s, table, tol = _own_indexes(scales, scale_table, rel_tol)
    if positions.size == 0:
        return idx.reshape(s.shape)
    return _override(idx, s, table, tol, np.asarray(positions, np.int64), np.asarray(listed, np.int64))


def _own_indexes(scales, scale_table, rel_tol: float):
    """(the decoder's own flat indexes, the checked scales, the table, the tolerance)."""
    on_gpu = cuda.is_gpu_array(scales)
    xp, s = _scales(scales, check_finite=not on_gpu)  # on a GPU: read with the indexes' counts
    with checked_first_on_error(lambda: _check_finite(xp, s), (InvalidArgumentError,) if on_gpu else ()):
        tol, table = _check_tol(rel_tol), _check_table(scale_table)
    flat = s.reshape(-1)
    if not on_gpu:
        return _index(xp, _thresholds(xp, table), flat), s, table, tol
    with cuda.after_torch(scales):
        return _gpu_indexes(s, table, tol)[0].reshape(-1), s, table, tol


def _override(idx, s, table: np.ndarray, tol: float, pos: np.ndarray, listed: np.ndarray):
    """``idx`` with ``listed`` at ``pos``, each listed position's own scale checked to be near a boundary of it."""
    xp, thr = _xp(s), table[:-1]
    mine = np.asarray(dev.as_numpy(s.reshape(-1)[xp.asarray(pos)]), np.float64)
    lo = _index(np, thr, mine * (1 - 2 * tol))
    hi = _index(np, thr, mine * (1 + 2 * tol))
    bad = (lo == hi) | (listed < lo) | (listed > hi)
    if np.any(bad):
        p = int(pos[np.flatnonzero(bad)[0]])
        raise CorruptStreamError(f"scale exception at position {p}: its scale is not near a boundary of the listed "
                                 "index")
    idx[xp.asarray(pos)] = xp.asarray(listed.astype(np.int32))
    return idx.reshape(s.shape)
