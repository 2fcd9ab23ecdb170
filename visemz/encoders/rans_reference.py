"""NumPy reference of the interleaved rANS lanes: the definition of the group bytes.

Every lane of every group steps together, so each step is a handful of array
operations over all lanes; Python loops run over steps (at most ``lane_symbols``) and
groups, never over symbols.  ``cuda/rans.cu`` writes the same bytes.
"""

from __future__ import annotations

import numpy as np

from ..errors import CorruptStreamError
from . import rans_layout as RL
from .cdf_tables import PRECISION, TOTAL, CdfTables

_SLOT_MASK = TOTAL - 1
_LOW = RL.RANS_L >> 8  # a decoded state below this needs two bytes
_CHECK = 64  # the decoder checks its read positions against the group ends every _CHECK steps


def _grid(values: np.ndarray, p: RL.Plan, fill: int) -> np.ndarray:
    """Flat per-symbol values -> (steps, groups, lanes), padding positions past n with ``fill``."""
    flat = np.full(p.groups * p.group_symbols, fill, np.int64)
    flat[: p.n] = values
    grid = np.full((p.groups, p.steps * p.lanes), fill, np.int64)
    grid[:, : p.group_symbols] = flat.reshape(p.groups, p.group_symbols)
    return np.ascontiguousarray(grid.reshape(p.groups, p.steps, p.lanes).transpose(1, 0, 2))


def _ungrid(grid: np.ndarray, p: RL.Plan) -> np.ndarray:
    flat = grid.transpose(1, 0, 2).reshape(p.groups, p.steps * p.lanes)[:, : p.group_symbols]
    return flat.reshape(-1)[: p.n]


def encode_lanes(start: np.ndarray, freq: np.ndarray, p: RL.Plan) -> tuple[np.ndarray, bytes]:
    """Each symbol's CDF start and frequency -> (group sizes, the groups' streams back to back).

    A padding position codes the identity symbol (start 0, frequency 2**16): no byte, same state.
    """
    if p.n == 0:
        return np.zeros(0, np.int64), b""
    st, fq = _grid(start, p, 0), _grid(freq, p, TOTAL)
    x_max = fq << RL.X_MAX_SHIFT  # ((L >> 16) << 8) * f: the encoder emits a byte while x >= x_max
    x = np.full((p.groups, p.lanes), RL.RANS_L, np.int64)
    before = np.empty((p.steps, p.groups, p.lanes), np.uint32)  # each step's state before renormalising
    count = np.empty((p.steps, p.groups, p.lanes), np.int64)  # and the bytes it emitted
    for j in range(p.steps - 1, -1, -1):
        f = fq[j]
        before[j] = x
        c = (x >= x_max[j]).astype(np.int64) + (x >= x_max[j] << 8)
        count[j] = c
        x >>= c << 3
        x = (x // f << PRECISION) + x % f + st[j]
    low = (before & 0xFF).astype(np.uint8)
    emit = np.stack([np.where(count == 2, (before >> 8) & 0xFF, low).astype(np.uint8), low], axis=-1)  # high byte first
    keep = np.arange(2) < count[..., None]
    body = emit.transpose(1, 0, 2, 3)[keep.transpose(1, 0, 2, 3)]  # group, step, lane, byte
    body_sizes = count.sum(axis=(0, 2), dtype=np.int64)
    states = x.astype("<u4").view(np.uint8).reshape(p.groups, -1)
    sizes = body_sizes + RL.STATE_BYTES * p.lanes
    out = np.empty(int(sizes.sum()), np.uint8)
    pos = src = 0
    for g in range(p.groups):
        out[pos : pos + states.shape[1]] = states[g]
        pos += states.shape[1]
        out[pos : pos + body_sizes[g]] = body[src : src + body_sizes[g]]
        pos += body_sizes[g]
        src += body_sizes[g]
    return sizes, out.tobytes()


def decode_lanes(parsed: RL.Parsed, table: np.ndarray, tables: CdfTables) -> np.ndarray:
    """Group streams and each symbol's table -> each symbol's CDF entry (int64, flat).

    Raises CorruptStreamError when a group reads past its end, stops short of it, or a
    lane does not come back to the encoder's initial state.
    """
    p = parsed.plan
    starts = parsed.starts
    ends = starts + parsed.sizes
    raw = np.frombuffer(parsed.buf, np.uint8)
    at = starts[:, None, None] + RL.STATE_BYTES * np.arange(p.lanes)[:, None] + np.arange(RL.STATE_BYTES)
    x = (raw[at].astype(np.int64) << (8 * np.arange(RL.STATE_BYTES))).sum(axis=2)  # u32 little-endian
    if np.any(x < RL.RANS_L) or np.any(x >= RL.RANS_L << 8):
        raise CorruptStreamError("conditional rANS stream has a lane state outside [2**23, 2**31)")
    pos = starts + RL.STATE_BYTES * p.lanes
    # pairs[i] = buf[i] << 8 | buf[i + 1]: a lane reading c bytes at i takes pairs[i] >> (16 - 8c).
    # Bounds are checked every _CHECK steps; the zeros after the buffer absorb an overrun meanwhile.
    buf = np.concatenate([np.frombuffer(parsed.buf, np.uint8), np.zeros(2 * p.lanes * _CHECK + 2, np.uint8)])
    pairs = buf[:-1].astype(np.int64) << 8 | buf[1:]
    # padding positions decode through a virtual identity table (entries [0, 2**16]) after the last one
    keys = np.concatenate([tables._keys, (np.int64(tables.n_tables) << (PRECISION + 1)) + np.array([0, TOTAL])])
    cdf = np.concatenate([tables.cdf, [0, TOTAL, TOTAL]]).astype(np.int64)
    freq = cdf[1:] - cdf[:-1]
    tkeys = _grid(table, p, tables.n_tables) << (PRECISION + 1)
    entries = np.empty_like(tkeys)
    for j in range(p.steps):
        slot = x & _SLOT_MASK
        e = np.searchsorted(keys, tkeys[j] + slot, side="right") - 1
        entries[j] = e
        x = freq[e] * (x >> PRECISION) + slot - cdf[e]
        shift = ((x < RL.RANS_L).astype(np.int64) + (x < _LOW)) << 3
        incl = np.cumsum(shift, axis=1) >> 3
        x = x << shift | pairs[pos[:, None] + incl - (shift >> 3)] >> (16 - shift)
        pos += incl[:, -1]
        if j % _CHECK == _CHECK - 1 and np.any(pos > ends):
            break
    if np.any(pos != ends) or np.any(x != RL.RANS_L):
        raise CorruptStreamError("conditional rANS stream does not decode to its initial states: it is corrupt")
    return _ungrid(entries, p)
