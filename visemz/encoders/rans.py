"""Conditional entropy coding: int32 symbols, each with its own CDF table, by interleaved rANS.

    buf = encode_conditional(symbols, indexes, tables)
    symbols = decode_conditional(buf, indexes, tables)

NumPy arrays run on the CPU (``rans_reference``); cupy arrays and torch CUDA tensors on
the GPU (``rans_gpu``).  Both write the same bytes, and either decodes the other's:
the tables are integers, the arithmetic is integer, and the lane plan is a function of
integers both sides compute alike.  docs/FORMAT.md section 6 gives the layout.

A value outside its table's range is coded as the table's escape symbol; its excess
beyond the range (value - hi > 0 above, value - lo < 0 below) goes, in symbol order, to
the end of the stream as a zigzag varint (version 1 streams, still read, hold them in an
ints stream), written on the CPU from the same integers on both devices.

With ``skip_freq`` F (default ``VISEMZ_RANS_SKIP_FREQ``; 0: none), the symbols whose table
gives the value 0 a frequency of at least F (``CdfTables.zero_freq``) stay out of the
lanes: each would cost a sequential step for almost no bits.  They decode to 0 but for
the rare non-zero ones, listed by position and value (stream version 3).  Which symbols
are skipped follows from the indexes, which encoder and decoder share.
"""

from __future__ import annotations

import numpy as np

from .. import cuda, defaults
from .. import device as dev
from ..config import whole_number
from ..errors import CorruptStreamError, InvalidArgumentError
from . import decode_ints
from . import layout as L
from . import rans_layout as RL
from . import rans_reference as reference
from .cdf_tables import COST_UNIT, CdfTables

__all__ = ["encode_conditional", "decode_conditional"]

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


def encode_conditional(symbols, indexes, tables: CdfTables, *, lane_bytes: int | None = None,
                       lane_symbols: int | None = None, skip_freq: int | None = None) -> bytes:
    """Code ``symbols[i]`` with table ``indexes[i]`` (same size; flattened in C order).

    lane_bytes / lane_symbols: the lane plan's targets (defaults: VISEMZ_RANS_LANE_BYTES,
    VISEMZ_RANS_LANE_SYMBOLS); the stream records the plan, so any plan decodes.  skip_freq:
    see the module notes (default VISEMZ_RANS_SKIP_FREQ); the plan then covers the coded symbols.
    """
    lane_bytes = defaults.get("rans_lane_bytes") if lane_bytes is None else int(lane_bytes)
    lane_symbols = defaults.get("rans_lane_symbols") if lane_symbols is None else int(lane_symbols)
    skip_freq = check_skip_freq(defaults.get("rans_skip_freq") if skip_freq is None else skip_freq)
    RL.plan(0, 0, lane_bytes, lane_symbols)  # checks them
    if cuda.is_gpu_array(symbols) or cuda.is_gpu_array(indexes):
        from . import rans_gpu

        with cuda.after_torch(symbols, indexes):
            return rans_gpu.encode(symbols, indexes, tables, lane_bytes, lane_symbols, skip_freq)
    s, t = check_inputs(np.asarray(symbols), np.asarray(indexes), tables)
    skip = None
    if skip_freq:
        coded, skip = split(np, s, t, tables.zero_freq, skip_freq)
        s, t = s[coded], t[coded]
    entry, escaped = prepare(s, t, tables)
    est = int(tables.cost[entry].sum(dtype=np.int64)) // (8 * COST_UNIT)
    p = RL.plan(s.size, est, lane_bytes, lane_symbols)
    start = tables.cdf[entry].astype(np.int64)
    sizes, groups = reference.encode_lanes(start, tables.cdf[entry + 1] - start, p)
    excess = escape_excess(s[escaped], t[escaped], tables)
    return RL.pack(p, excess.size, tables.fingerprint, sizes, groups, escape_stream(excess), skip)


def decode_conditional(buf, indexes, tables: CdfTables):
    """Symbols coded with ``indexes`` (int32, shaped like ``indexes``).

    NumPy ``indexes``: decoded on the CPU, a NumPy array.  cupy / torch CUDA ``indexes``:
    decoded on the GPU, a cupy array.  The indexes must be the encoder's.
    """
    if cuda.is_gpu_array(indexes):
        from . import rans_gpu

        with cuda.after_torch(indexes):  # its output is read on torch's stream too: ordered alike
            return rans_gpu.decode(buf, indexes, tables)
    idx = np.asarray(indexes)
    t = check_indexes(idx, tables)
    parsed = RL.parse(buf, t.size, tables.fingerprint)
    coded = coded_positions(np, t, tables.zero_freq, parsed)
    values = _decode_coded(parsed, t if coded is None else t[coded], tables)
    return merge(np, values, coded, parsed.skip, t.size).reshape(idx.shape)


def _decode_coded(parsed: RL.Parsed, t: np.ndarray, tables: CdfTables) -> np.ndarray:
    """The lanes' symbols (int32; their tables ``t``), escapes restored."""
    if t.size == 0:
        return np.zeros(0, np.int32)
    entry = reference.decode_lanes(parsed, t, tables)
    sym = entry - tables.cdf_start[t]
    escaped = sym == tables.n_symbols[t] - 1
    if int(escaped.sum()) != parsed.escapes:
        raise CorruptStreamError(f"conditional rANS stream decodes {int(escaped.sum())} escapes, its header "
                                 f"{parsed.escapes}")
    values = tables.offsets[t] + sym
    pos = np.flatnonzero(escaped)
    values[pos] = escaped_values(parsed.escape_stream, parsed.escapes, t[pos], tables)
    return values.astype(np.int32)


# ------------------------------------------------------------------ shared steps
def check_skip_freq(freq) -> int:
    """A skip threshold: 0 (skip none) or a zero frequency in 1..2**16; InvalidArgumentError naming it otherwise."""
    if not whole_number(freq) or not 0 <= freq <= RL.TOTAL_FREQ:
        raise InvalidArgumentError(f"skip_freq={freq!r}: expected 0 (skip none) or a frequency in 1..{RL.TOTAL_FREQ}")
    return int(freq)


def split(xp, s, t, zero_freq, freq: int) -> tuple[object, RL.Skip]:
    """The coded symbols' positions (``xp`` int64) and the skipped ones' exceptions (NumPy) of flat
    symbols ``s`` and valid table indexes ``t`` (NumPy or cupy alike; ``zero_freq`` on their device)."""
    skipped, coded = _skipped(xp, t, zero_freq, freq)
    listed = xp.flatnonzero(skipped & (s != 0))
    both = dev.as_numpy(xp.stack([listed, s[listed].astype(xp.int64)]))  # one read on a GPU
    return coded, RL.Skip(int(s.size), freq, both[0], both[1])


def coded_positions(xp, t, zero_freq, parsed: RL.Parsed):
    """Where a version-3 stream's coded symbols go among all ``t.size`` (``xp`` int64), checked against its
    header: the count of coded symbols, and every exception a skipped position; None for versions 1 and 2.
    ``t``: the decoder's valid table indexes (its device's), ``zero_freq`` on that device."""
    skip = parsed.skip
    if not skip.freq:
        return None
    skipped, coded = _skipped(xp, t, zero_freq, skip.freq)
    if coded.size != parsed.plan.n:
        raise CorruptStreamError(f"conditional rANS stream codes {parsed.plan.n} symbols, but its indexes leave "
                                 f"{coded.size} of {t.size} unskipped at zero frequency {skip.freq}")
    if skip.positions.size and not bool(skipped[xp.asarray(skip.positions)].all()):
        raise CorruptStreamError("conditional rANS stream lists an exception at a position its indexes do not skip")
    return coded


def _skipped(xp, t, zero_freq, freq: int):
    """Which symbols a threshold ``freq`` skips (bool mask) and where the coded ones are (int64): the one rule
    both encoder and decoder apply to the table indexes ``t``."""
    skipped = zero_freq[t] >= freq
    return skipped, xp.flatnonzero(~skipped)


def merge(xp, values, coded, skip: RL.Skip, n: int):
    """All ``n`` symbols (int32): the lanes' ``values`` at the ``coded`` positions (all of them when None),
    the skipped ones 0 but for the listed exceptions."""
    if coded is None:
        return values
    out = xp.zeros(n, xp.int32)
    out[coded] = values
    if skip.positions.size:
        out[xp.asarray(skip.positions)] = xp.asarray(skip.values.astype(np.int32))
    return out


def check_indexes(idx, tables: CdfTables) -> np.ndarray:
    """Flat int32 table indexes, each checked to name a table (NumPy or cupy)."""
    if idx.dtype.kind not in "iu":
        raise InvalidArgumentError(f"table indexes must be integers, got {idx.dtype}")
    if idx.size > RL.MAX_SYMBOLS:
        raise InvalidArgumentError(f"{idx.size} symbols exceed the conditional coder's limit of {RL.MAX_SYMBOLS}")
    flat = idx.reshape(-1)
    if flat.size and bool(((flat < 0) | (flat >= tables.n_tables)).any()):
        raise InvalidArgumentError(f"table indexes must lie in 0..{tables.n_tables - 1}")
    return flat.astype(np.int32)


def check_inputs(sym, idx, tables: CdfTables):
    L.check_dtype(sym.dtype.name)
    if sym.size != idx.size:
        raise InvalidArgumentError(f"{sym.size} symbols but {idx.size} table indexes")
    return sym.reshape(-1).astype(np.int32), check_indexes(idx, tables)


def prepare(s: np.ndarray, t: np.ndarray, tables: CdfTables) -> tuple[np.ndarray, np.ndarray]:
    """Each symbol's CDF entry (its escape's when out of range) and the escape mask."""
    v = s.astype(np.int64) - tables.offsets[t]
    last = tables.n_symbols[t] - 1
    escaped = (v < 0) | (v >= last)
    v = np.where(escaped, last, v)
    return tables.cdf_start[t] + v, escaped


def escape_excess(values: np.ndarray, t: np.ndarray, tables: CdfTables) -> np.ndarray:
    """Escaped values -> their excess beyond their table's range (never 0; fits int32 as lo <= 0 <= hi)."""
    lo = tables.offsets[t].astype(np.int64)
    hi = lo + tables.n_symbols[t] - 2
    v = values.astype(np.int64)
    return np.where(v > hi, v - hi, v - lo).astype(np.int32)


def escape_stream(excess: np.ndarray) -> bytes:
    return RL.escape_varints(excess)


def escaped_values(stream, count: int, t: np.ndarray, tables: CdfTables) -> np.ndarray:
    """The parsed stream's escapes (``Parsed.escape_stream``: the excesses, or a version-1 stream's ints
    stream of them) -> the escaped values (int64), each checked."""
    if count == 0:
        return np.zeros(0, np.int64)
    excess = stream if isinstance(stream, np.ndarray) else decode_ints(bytes(stream), count=count).astype(np.int64)
    if excess.size != count:
        raise CorruptStreamError(f"conditional rANS escape stream holds {excess.size} values, expected {count}")
    lo = tables.offsets[t].astype(np.int64)
    hi = lo + tables.n_symbols[t] - 2
    v = np.where(excess > 0, hi + excess, lo + excess)
    if np.any(excess == 0) or np.any(v < INT32_MIN) or np.any(v > INT32_MAX):
        raise CorruptStreamError("conditional rANS escape stream holds a zero excess or a value beyond int32")
    return v
