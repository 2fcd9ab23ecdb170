"""The GPU path of the conditional rANS coder: cupy RawModule kernels from ``cuda/rans.cu``.

Symbols, indexes and the lanes' work stay on the device.  The encoder's host reads back
three totals (code length, escapes, bad indexes) to plan the lanes, the group sizes, and
the final bytes; the decoder's, one status word (escapes, error bits, bad indexes).  The
bytes equal the NumPy reference's (tests/test_rans_gpu.py).  Escapes are rare: their few
values go through the host and the CPU ints encoder, which is where the reference puts
them too.  With a skip threshold (stream version 3) the coded symbols are gathered on the
device by the same cupy calls as the reference's NumPy ones (``rans.split``,
``rans.coded_positions``, ``rans.merge``); that costs the encoder three more host waits (the
index check, the gather's count, the exceptions) and the decoder three (the index check, the
gather's count, the exceptions' check).
"""

from __future__ import annotations

import functools
from importlib import resources

import numpy as np

from .. import cuda
from ..errors import CorruptStreamError, InvalidArgumentError, checked_first_on_error
from . import gpu, rans
from . import layout as L
from . import rans_layout as RL
from .cdf_tables import COST_UNIT, CdfTables

THREADS = 256
WARP = 32
GATHER_SCAN_GROUPS = 256  # above this many groups the gather takes its offsets from a scan


@functools.lru_cache(maxsize=None)
def _module(device_id: int):
    cp = cuda.require_cupy()
    src = resources.files("visemz.encoders").joinpath("cuda/rans.cu").read_text()
    with cp.cuda.Device(device_id):
        return cp.RawModule(code=src, options=("-std=c++17",))


def kernel(name: str):
    cp = cuda.require_cupy()
    return _module(cp.cuda.Device().id).get_function(name)


@functools.lru_cache(maxsize=32)
def _device_tables(tables: CdfTables, device_id: int) -> dict:
    """The tables' integer arrays on one GPU (cached per tables object and device: copied once, not per image)."""
    names = ("cdf", "cdf_start", "offsets", "cost", "lut", "zero_freq")
    host = (tables.cdf, tables.cdf_start, tables.offsets, tables.cost, tables.lut.reshape(-1), tables.zero_freq)
    return dict(zip(names, cuda.resident_copy([np.ascontiguousarray(a, np.int32) for a in host], device_id)))


def _tables(tables: CdfTables) -> dict:
    cp = cuda.require_cupy()
    return _device_tables(tables, cp.cuda.Device().id)


def grid(n: int) -> int:
    """Blocks of THREADS for a grid-stride loop over n items: enough to fill the GPU, no more than n needs."""
    return max(1, min(-(-n // THREADS), gpu.sm_count() * 8))


def _flat_int32(a, what: str):
    cp = cuda.require_cupy()
    a = cuda.as_cupy(a)
    if a.dtype.kind not in "iu":
        raise InvalidArgumentError(f"{what} must be integers, got {a.dtype}")
    return cp.ascontiguousarray(a.reshape(-1), dtype=cp.int32)


def _flat_indexes(indexes, tables: CdfTables):
    """Flat int32 table indexes.  Indexes of a wider type are range-checked before the cast (one host
    wait), which would otherwise wrap 2**32 + k to k; narrower ones are checked by the kernels."""
    a = cuda.as_cupy(indexes)
    if a.dtype.kind in "iu" and a.dtype.itemsize >= 4 and a.dtype != cuda.require_cupy().int32:
        rans.check_indexes(a, tables)
    return _flat_int32(a, "table indexes")


# ------------------------------------------------------------------ encode
def encode(symbols, indexes, tables: CdfTables, lane_bytes: int, lane_symbols: int, skip_freq: int = 0) -> bytes:
    cp = cuda.require_cupy()
    sym_in = cuda.as_cupy(symbols)
    L.check_dtype(sym_in.dtype.name)
    sym = _flat_int32(sym_in, "symbols")
    idx = _flat_indexes(indexes, tables)
    n = sym.size
    if idx.size != n:
        raise InvalidArgumentError(f"{n} symbols but {idx.size} table indexes")
    if n > RL.MAX_SYMBOLS:
        raise InvalidArgumentError(f"{n} symbols exceed the conditional coder's limit of {RL.MAX_SYMBOLS}")
    tb = _tables(tables)
    skip = None
    if skip_freq:  # the skipped symbols leave the lanes: every index checked first, as the reference does
        rans.check_indexes(idx, tables)
        coded, skip = rans.split(cp, sym, idx, tb["zero_freq"], skip_freq)
        sym, idx = sym[coded], idx[coded]
        n = sym.size
    code = cp.empty((n, 2), cp.uint32)  # per symbol (start | freq << 16, reciprocal of freq): rans_prepare
    esc = cp.empty(n, cp.uint8)
    totals = cp.zeros(3, cp.uint64)
    if n:
        kernel("rans_prepare")((grid(n),), (THREADS,), (
            sym, idx, np.int64(n), tb["cdf_start"], tb["offsets"], tb["cost"], tb["cdf"], np.int32(tables.n_tables),
            code, esc, totals))
    bits, n_esc, bad = (int(v) for v in totals.get())
    _check_indexes(bad, tables)
    est = bits // (8 * COST_UNIT)
    p = RL.plan(n, est, lane_bytes, lane_symbols)
    sizes, body = _encode_lanes(code, p, est)
    excess = np.zeros(0, np.int32)
    if n_esc:
        pos = cp.flatnonzero(esc)
        excess = rans.escape_excess(sym[pos].get(), idx[pos].get(), tables)
    return RL.pack(p, excess.size, tables.fingerprint, sizes, body, rans.escape_stream(excess), skip)


def _encode_lanes(code, p: RL.Plan, est_bytes: int) -> tuple[np.ndarray, bytes]:
    """The groups' sizes (int64) and their streams, end to end: one host read (two when ``est_bytes`` fell short)."""
    cp = cuda.require_cupy()
    if p.n == 0:
        return np.zeros(0, np.int64), b""
    stride = RL.STATE_BYTES * p.lanes + 2 * p.group_symbols
    scratch = cp.empty(p.groups * stride, cp.uint8)
    # One buffer: the groups' u32 sizes, then their gathered streams, so that one read brings both back
    # (the sizes were once a host read of their own, before the gather).  The host does not know
    # the streams' total before that read: it reads as far as ``guess``, which the streams do not pass
    # (the estimate counts each symbol's cost rounded up, plus the lane states and a margin), and reads
    # the rest in a second copy if they ever do.  The gather still places each group by the sizes'
    # prefix sum on the device, so the bytes are those of the two-read path.
    head = 4 * p.groups
    packed = cp.empty(head + int(p.max_group_bytes().sum()), cp.uint8)
    sizes = packed[:head].view(cp.uint32)
    kernel("rans_encode")((p.groups,), (WARP,), (
        code, np.int64(p.n), np.int32(p.lanes), np.int64(p.group_symbols), np.int32(p.steps),
        scratch, np.int64(stride), sizes))
    # few groups: each block sums the sizes before it (0: no ends); many: one scan (those sums grow quadratically)
    ends = cp.cumsum(sizes.astype(cp.int64)) if p.groups > GATHER_SCAN_GROUPS else np.uint64(0)
    kernel("rans_gather")((p.groups,), (THREADS,), (scratch, np.int64(stride), sizes, ends, packed[head:]))
    guess = min(packed.size - head, _read_guess(est_bytes, p))
    host = packed[: head + guess].get()
    host_sizes = host[:head].view("<u4").astype(np.int64)
    total = int(host_sizes.sum())
    if total <= guess:
        return host_sizes, host[head : head + total].tobytes()
    return host_sizes, host[head:].tobytes() + packed[head + guess : head + total].get().tobytes()


def _read_guess(est_bytes: int, p: RL.Plan) -> int:
    """Bytes of the groups' streams that the encoder's one read brings back: the estimate (each symbol's cost,
    rounded up), 1/64 more, and per lane its state and a margin for its last, partly filled bytes."""
    return est_bytes + est_bytes // 64 + (RL.STATE_BYTES + 16) * p.lanes * p.groups + 64


# ------------------------------------------------------------------ decode
def decode(buf, indexes, tables: CdfTables):
    cp = cuda.require_cupy()
    idx_in = cuda.as_cupy(indexes)
    idx = _flat_indexes(idx_in, tables)
    n = idx.size
    if n > RL.MAX_SYMBOLS:
        raise InvalidArgumentError(f"{n} symbols exceed the conditional coder's limit of {RL.MAX_SYMBOLS}")
    # The range check is not read here but with the decoder's status (one host read per section,
    # not two), so the host parses the stream while the GPU still computes the indexes (the y section's
    # come from the hyper-synthesis).  The kernels read tables at ``safe`` (a bad index replaced by 0) and
    # the check is reported first, as before: a bad index, then the stream's damage.
    # [escape count, error bits, bad indexes]: the decoder's error word is the low half (little-endian) of
    # the second u64, so that all three come back in one host read
    status = cp.zeros(3, cp.uint64)
    safe = cp.empty(n, cp.int32)
    if n:
        kernel("rans_safe_indexes")((grid(n),), (THREADS,), (idx, np.int64(n), np.int32(tables.n_tables), safe,
                                                              status[2:]))
    # on an error path only, where its wait costs nothing per image
    with checked_first_on_error(lambda: _check_indexes(int(status[2].get()), tables)):
        parsed = RL.parse(buf, n, tables.fingerprint)
    tb = _tables(tables)
    coded = None
    if parsed.skip.freq:  # version 3: its count of coded symbols is checked now, so the bad indexes first
        _check_indexes(int(status[2].get()), tables)
        coded = rans.coded_positions(cp, safe, tb["zero_freq"], parsed)
        safe = safe[coded]
    out = _decode_coded(parsed, safe, tables, tb, status)
    return rans.merge(cp, out, coded, parsed.skip, n).reshape(idx_in.shape)


def _decode_coded(parsed: RL.Parsed, safe, tables: CdfTables, tb: dict, status):
    """The lanes' symbols (cupy int32) of tables ``safe`` (valid indexes), escapes restored; ``status``:
    [escapes, error bits, bad indexes of the caller's], the last read here with the others."""
    cp = cuda.require_cupy()
    n = safe.size
    out = cp.empty(n, cp.int32)
    if n == 0:  # no indexes, or a version-3 stream's, checked before the gather
        return out
    p = parsed.plan
    data = cp.asarray(np.frombuffer(parsed.buf, np.uint8))
    spans = cp.asarray(np.concatenate([parsed.starts, parsed.sizes]))  # the groups' starts, then sizes: one copy
    entry = cp.empty(n, cp.int32)
    count, err = status[0:1], status[1:2].view(cp.uint32)
    kernel("rans_decode")((p.groups,), (WARP,), (
        data, spans[: p.groups], spans[p.groups :], safe, np.int64(n), np.int32(p.lanes),
        np.int64(p.group_symbols), np.int32(p.steps), tb["cdf"], tb["cdf_start"], tb["lut"], entry, err))
    esc = cp.empty(n, cp.uint8)
    kernel("rans_values")((grid(n),), (THREADS,), (entry, safe, np.int64(n), tb["cdf_start"], tb["offsets"], out,
                                                    esc, count))
    n_esc, code, n_bad = (int(v) for v in status.get())
    _check_indexes(n_bad, tables)
    if code:
        raise CorruptStreamError(f"conditional rANS stream is corrupt (GPU decoder error bits 0x{code:x})")
    if n_esc != parsed.escapes:
        raise CorruptStreamError(f"conditional rANS stream decodes {n_esc} escapes, its header {parsed.escapes}")
    if n_esc:
        pos = cp.flatnonzero(esc)
        values = rans.escaped_values(parsed.escape_stream, n_esc, safe[pos].get(), tables)
        out[pos] = cp.asarray(values.astype(np.int32))
    return out


def _check_indexes(n_bad: int, tables: CdfTables) -> None:
    if n_bad:
        raise InvalidArgumentError(f"table indexes must lie in 0..{tables.n_tables - 1} ({n_bad} do not)")
