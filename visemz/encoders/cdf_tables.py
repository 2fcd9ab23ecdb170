"""Integer CDF tables for the conditional rANS coder, and their two constructors.

A table describes one discrete distribution over the values ``offset .. offset + m - 2``
plus one **escape** symbol (``m`` symbols in all): ``m + 1`` integer CDF entries that
start at 0, end at ``2**16`` and strictly increase, so every symbol, the escape
included, has a frequency of at least 1.  Values outside a table's range are coded as
its escape plus a raw value in a side stream (``rans.py``).

The tables are computed once, in float64 on the CPU, and then used only as integers:
the GPU and the CPU code with the very same arrays, so they write the same bytes.  The
float64 step may differ in its last bit between machines (libm, scipy), so tables are
meant to be built once (at weight-export time) and shipped with the weights
(``to_dict`` / ``from_dict``), not rebuilt on the decoding machine; every rANS stream
records the tables' fingerprint and refuses tables that differ.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from scipy import special

from ..errors import InvalidArgumentError
from ..framing import xxh64

PRECISION = 16
TOTAL = 1 << PRECISION
LUT_BITS = 8  # the GPU decoder's first guess of a symbol: one entry per 2**(16 - 8) slots
MAX_TABLES = 1 << 16
MAX_ENTRIES = 1 << 24  # CDF entries over all tables (CompressAI's 64 scales need about 28 thousand)
KEYS = ("cdf", "cdf_start", "offsets")
COST_UNIT = 256  # cost table unit: 1/256 bit


@dataclass(frozen=True, eq=False)
class CdfTables:
    """CDFs of ``n_tables`` distributions, back to back (all int32).

    cdf: every table's ``m + 1`` entries, table after table.
    cdf_start: ``n_tables + 1`` positions; table t is ``cdf[cdf_start[t] : cdf_start[t + 1]]``.
    offsets: per table, the value that its symbol 0 codes (<= 0; the range holds 0).
    """

    cdf: np.ndarray
    cdf_start: np.ndarray
    offsets: np.ndarray

    def __post_init__(self):
        for name in KEYS:
            a = np.asarray(getattr(self, name))
            if a.ndim != 1 or a.dtype.kind not in "iu":
                raise InvalidArgumentError(f"CDF tables: {name} must be a 1-D integer array, got {a.dtype} {a.shape}")
            a = np.ascontiguousarray(a, dtype=np.int64)
            object.__setattr__(self, name, a)
        _validate(self.cdf, self.cdf_start, self.offsets)
        for name in KEYS:
            a = getattr(self, name).astype(np.int32)
            a.flags.writeable = False
            object.__setattr__(self, name, a)

    # ------------------------------------------------------------ properties
    @property
    def n_tables(self) -> int:
        return int(self.offsets.size)

    @functools.cached_property
    def n_symbols(self) -> np.ndarray:
        """Symbols per table, the escape included (int64)."""
        return np.diff(self.cdf_start.astype(np.int64)) - 1

    @functools.cached_property
    def fingerprint(self) -> int:
        """xxh64 of the precision and the three arrays: what a stream records of its tables."""
        return xxh64(b"visemz-cdf16", *(np.ascontiguousarray(getattr(self, k), "<i4").tobytes() for k in KEYS))

    @functools.cached_property
    def cost(self) -> np.ndarray:
        """Per CDF entry, the code length of its symbol in 1/256 bit (floor(256 log2 f) exactly,
        in integers), 0 for each table's last entry.  Only the lane planner uses it."""
        freq = np.diff(self.cdf.astype(np.int64), append=TOTAL)
        freq[self.cdf_start[1:] - 1] = TOTAL  # last entries: no symbol, cost 0
        values, inverse = np.unique(freq, return_inverse=True)
        log = np.array([(int(f) ** COST_UNIT).bit_length() - 1 for f in values], np.int64)  # floor(256 log2 f)
        return (PRECISION * COST_UNIT - log[inverse]).astype(np.int32)

    @functools.cached_property
    def zero_freq(self) -> np.ndarray:
        """Per table, the frequency of the value 0 (every table's range holds it), int32: how nearly
        certain a 0 is.  A version-3 stream skips the symbols whose table's zero frequency reaches its
        threshold (``rans.py``), so this is part of the format and computed from the integers alone."""
        zero = self.cdf_start[:-1].astype(np.int64) - self.offsets
        return (self.cdf[zero + 1].astype(np.int64) - self.cdf[zero]).astype(np.int32)

    @functools.cached_property
    def lut(self) -> np.ndarray:
        """(n_tables, 2**LUT_BITS) int32: for slot bucket b, the symbol whose interval holds slot b << 8."""
        t = np.repeat(np.arange(self.n_tables), 1 << LUT_BITS)
        slots = np.tile(np.arange(0, TOTAL, TOTAL >> LUT_BITS), self.n_tables)
        return (self.locate(t, slots) - self.cdf_start[t]).astype(np.int32).reshape(self.n_tables, -1)

    @functools.cached_property
    def _keys(self) -> np.ndarray:
        """Every entry as (table << 17) + cdf value: one strictly increasing array for searchsorted."""
        table = np.repeat(np.arange(self.n_tables, dtype=np.int64), np.diff(self.cdf_start))
        return (table << (PRECISION + 1)) + self.cdf

    def locate(self, table: np.ndarray, slot: np.ndarray) -> np.ndarray:
        """CDF entry e of table ``table`` with cdf[e] <= slot < cdf[e + 1] (int64 arrays, slot < 2**16)."""
        query = (table.astype(np.int64) << (PRECISION + 1)) + slot
        return np.searchsorted(self._keys, query, side="right") - 1

    # --------------------------------------------------------- serialisation
    def to_dict(self, prefix: str = "") -> dict[str, np.ndarray]:
        """The arrays as int32, named ``prefix + cdf`` etc. (e.g. for a safetensors file)."""
        return {prefix + k: np.array(getattr(self, k), np.int32) for k in KEYS}

    @classmethod
    def from_dict(cls, d: dict, prefix: str = "") -> "CdfTables":
        missing = [prefix + k for k in KEYS if prefix + k not in d]
        if missing:
            raise InvalidArgumentError(f"CDF tables lack arrays {missing}")
        return cls(*(np.asarray(d[prefix + k]) for k in KEYS))


def _validate(cdf: np.ndarray, cdf_start: np.ndarray, offsets: np.ndarray) -> None:
    t = offsets.size
    if not 1 <= t <= MAX_TABLES:
        raise InvalidArgumentError(f"CDF tables: {t} tables, expected 1..{MAX_TABLES}")
    if cdf_start.size != t + 1 or cdf_start[0] != 0 or cdf_start[-1] != cdf.size or cdf.size > MAX_ENTRIES:
        raise InvalidArgumentError(
            f"CDF tables: cdf_start must be {t + 1} positions from 0 to len(cdf) = {cdf.size} (at most {MAX_ENTRIES})"
        )
    m = np.diff(cdf_start) - 1  # symbols per table
    if np.any(m < 2) or np.any(m > TOTAL):
        bad = int(np.flatnonzero((m < 2) | (m > TOTAL))[0])
        raise InvalidArgumentError(f"CDF table {bad} has {m[bad]} symbols; expected 2..{TOTAL} (values + escape)")
    first, last = cdf[cdf_start[:-1]], cdf[cdf_start[1:] - 1]
    steps = np.diff(cdf)
    steps[cdf_start[1:-1] - 1] = 1  # table boundaries are not steps
    if np.any(first != 0) or np.any(last != TOTAL) or np.any(steps < 1):
        raise InvalidArgumentError(f"CDF tables must start at 0, end at {TOTAL} and strictly increase")
    if np.any(offsets > 0) or np.any(offsets + m - 2 < 0) or np.any(offsets < -(1 << 30)):
        bad = int(np.flatnonzero((offsets > 0) | (offsets + m - 2 < 0) | (offsets < -(1 << 30)))[0])
        raise InvalidArgumentError(f"CDF table {bad}: values {offsets[bad]}..{offsets[bad] + m[bad] - 2} must hold 0")


# ------------------------------------------------------------------ quantisation
def quantize_pmf(probs) -> np.ndarray:
    """Probabilities (>= 0, any positive sum) -> integer frequencies >= 1 that sum to 2**16.

    Start from the rounded scaled probabilities (at least 1 each), then move the excess or
    the deficit one unit at a time where it costs the fewest expected bits (greedy on the
    exact change of sum(p log2 f)), in rounds of distinct symbols; ties go to the lower index.
    """
    p = np.asarray(probs, np.float64)
    if p.ndim != 1 or not 1 <= p.size <= TOTAL or not np.all(np.isfinite(p)) or np.any(p < 0) or p.sum() <= 0:
        raise InvalidArgumentError(f"quantize_pmf needs 1..{TOTAL} finite probabilities >= 0 with a positive sum")
    p = p / p.sum()
    f = np.maximum(1, np.floor(p * TOTAL + 0.5)).astype(np.int64)
    while (d := int(f.sum()) - TOTAL) != 0:
        if d > 0:  # take units from the symbols where a unit is worth the least
            cand = np.flatnonzero(f > 1)
            loss = p[cand] * np.log2(f[cand] / (f[cand] - 1))
            pick = cand[np.argsort(loss, kind="stable")[:d]]
            f[pick] -= 1
        else:  # give units where a unit is worth the most
            gain = p * np.log2((f + 1) / f)
            pick = np.argsort(-gain, kind="stable")[:-d]
            f[pick] += 1
    return f


def _tables(probs: Sequence[np.ndarray], offsets: Sequence[int]) -> CdfTables:
    freqs = [quantize_pmf(p) for p in probs]
    cdf = np.concatenate([np.concatenate([[0], np.cumsum(f)]) for f in freqs])
    start = np.concatenate([[0], np.cumsum([f.size + 1 for f in freqs])])
    return CdfTables(cdf, start, np.asarray(offsets, np.int64))


def default_scale_table(levels: int = 64, lo: float = 0.11, hi: float = 256.0) -> np.ndarray:
    """CompressAI's default scale table (64 log-spaced scales from 0.11 to 256), in float64."""
    return np.exp(np.linspace(np.log(lo), np.log(hi), levels))


def gaussian_scale_tables(scale_table, tail_mass: float = 1e-9) -> CdfTables:
    """One table per scale of ``scale_table``: CompressAI's GaussianConditional, in float64.

    For scale s: values -c..c with c = ceil(s * q), q the standard normal quantile that
    leaves tail_mass / 2 in each tail; p(v) = Phi((0.5 - |v|) / s) - Phi((-0.5 - |v|) / s)
    (through erfc, on the side of the smaller tail, as CompressAI does); the escape gets
    the mass left outside, 2 Phi((-0.5 - c) / s).
    """
    scales = np.asarray(scale_table, np.float64)
    if scales.ndim != 1 or scales.size < 1 or not np.all(np.isfinite(scales)) or np.any(scales <= 0):
        raise InvalidArgumentError("scale_table must be a non-empty list of finite positive scales")
    if np.any(np.diff(scales) <= 0):
        raise InvalidArgumentError("scale_table must be strictly increasing")
    if not 0 < tail_mass < 1:
        raise InvalidArgumentError(f"tail_mass={tail_mass} must lie in (0, 1)")
    q = -special.ndtri(tail_mass / 2)
    centers = np.ceil(scales * q).astype(np.int64)
    if np.any(2 * centers + 2 > TOTAL):
        raise InvalidArgumentError(f"scale {scales.max()} needs more than {TOTAL} symbols at tail_mass {tail_mass}")
    probs = []
    for s, c in zip(scales, centers):
        v = np.abs(np.arange(-c, c + 1, dtype=np.float64))
        upper = _phi((0.5 - v) / s)
        lower = _phi((-0.5 - v) / s)
        probs.append(np.append(upper - lower, 2 * _phi((-0.5 - c) / s)))
    return _tables(probs, -centers)


def _phi(x: np.ndarray) -> np.ndarray:
    """Standard normal CDF through erfc (precise in the lower tail)."""
    return 0.5 * special.erfc(-x / np.sqrt(2.0))


def from_pmfs(pmfs: Sequence, tail_masses: Sequence[float], offsets: Sequence[int]) -> CdfTables:
    """Tables from explicit probability mass functions, e.g. a factorized prior's channels.

    pmfs[t]: probabilities of the values offsets[t], offsets[t] + 1, ...; tail_masses[t]:
    the mass outside them (the escape's).  For CompressAI's EntropyBottleneck these are,
    per channel, its ``_likelihood`` at ``median - minima + arange(minima + maxima + 1)``,
    ``sigmoid(lower[0]) + sigmoid(-upper[-1])`` and ``-minima`` (what its ``update()``
    computes), taken once when the weights are exported.
    """
    if not (len(pmfs) == len(tail_masses) == len(offsets)) or not pmfs:
        raise InvalidArgumentError("from_pmfs needs as many pmfs, tail masses and offsets, at least one")
    probs = []
    for t, (pmf, tail) in enumerate(zip(pmfs, tail_masses)):
        pmf = np.asarray(pmf, np.float64).reshape(-1)
        if pmf.size < 1 or not np.all(np.isfinite(pmf)) or np.any(pmf < 0) or not (0 <= tail < 1):
            raise InvalidArgumentError(f"pmf {t}: needs finite probabilities >= 0 and a tail mass in [0, 1)")
        probs.append(np.append(pmf, tail))
    return _tables(probs, offsets)


def logistic_tables(scales, centres, tail_mass: float = 1e-6) -> CdfTables:
    """One table per (scale, centre), scale-major (table ``i * len(centres) + j``): a logistic distribution of
    scale ``scales[i]`` centred at ``centres[j]`` (in [-0.5, 0.5]) over unit bins, in float64.

    p(v) = S((v + 0.5 - c) / s) - S((v - 0.5 - c) / s), S the logistic sigmoid, for v in -n..n with
    n = ceil(s ln(2 / tail_mass)) + 1; the escape gets the mass outside.  The residual coder's family
    (``visemz/image/residual_coder.py``)."""
    scales, centres = np.asarray(scales, np.float64), np.asarray(centres, np.float64)
    if scales.ndim != 1 or scales.size < 1 or not np.all(np.isfinite(scales)) or np.any(scales <= 0):
        raise InvalidArgumentError("logistic_tables needs a non-empty list of finite positive scales")
    if centres.ndim != 1 or centres.size < 1 or np.any(np.abs(centres) > 0.5):
        raise InvalidArgumentError("logistic_tables needs a non-empty list of centres in [-0.5, 0.5]")
    if not 0 < tail_mass < 1:
        raise InvalidArgumentError(f"tail_mass={tail_mass} must lie in (0, 1)")
    probs, offsets = [], []
    for s in scales:
        n = int(np.ceil(s * np.log(2.0 / tail_mass))) + 1
        if 2 * n + 2 > TOTAL:
            raise InvalidArgumentError(f"scale {s} needs more than {TOTAL} symbols at tail_mass {tail_mass}")
        v = np.arange(-n, n + 1, dtype=np.float64)
        for c in centres:
            upper, lower = special.expit((v + 0.5 - c) / s), special.expit((v - 0.5 - c) / s)
            outside = special.expit((-n - 0.5 - c) / s) + special.expit((-n - 0.5 + c) / s)  # both tails, by symmetry
            probs.append(np.append(upper - lower, outside))
            offsets.append(-n)
    return _tables(probs, offsets)


def uniform_tables(max_bits: int) -> CdfTables:
    """Table b - 1 for b = 1..max_bits: the values 0 .. 2**b - 1 alike (and an escape at the least frequency)."""
    if not 1 <= max_bits <= PRECISION - 1:
        raise InvalidArgumentError(f"uniform tables of 1..{max_bits} bits: at most {PRECISION - 1}")
    probs = [np.append(np.ones(1 << b), 1.0 / TOTAL) for b in range(1, max_bits + 1)]
    return _tables(probs, [0] * max_bits)


def concatenate(*tables: CdfTables) -> CdfTables:
    """Several table sets as one: the second's tables numbered after the first's, and so on."""
    cdf = np.concatenate([t.cdf for t in tables])
    starts, base = [np.zeros(1, np.int64)], 0
    for t in tables:
        starts.append(t.cdf_start[1:].astype(np.int64) + base)
        base += t.cdf.size
    return CdfTables(cdf, np.concatenate(starts), np.concatenate([t.offsets for t in tables]))
