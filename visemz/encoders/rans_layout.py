"""The conditional rANS stream's layout: constants, lane plan, header, validation.

One definition shared by the NumPy reference (``rans_reference.py``) and the CUDA
kernels (``cuda/rans.cu``, which mirror the constants); docs/FORMAT.md section 6
describes the same bytes in prose.  Version 2 stores the counts and the group sizes as
LEB128 varints and each escape's excess as a zigzag varint; version 1 (still read) has
fixed u32 fields and the escapes in an ints stream.  Version 3 is version 2 with skipped
symbols: those whose table makes a 0 nearly certain (its zero frequency at least the
stream's threshold) are left out of the lanes, and the few of them that are not 0 are
listed after the escapes (``Skip``).  The group bytes are the same in all three.

The coder: 32-bit states in [L, 256 L) with L = 2**23, byte-wise renormalisation and
16-bit probabilities (ryg's rans_byte arithmetic).  The n symbols are cut into groups of
``group_symbols`` consecutive symbols; in a group, symbol i belongs to lane i % lanes and
is that lane's step i // lanes.  A group's lanes share one byte stream in decoder order:
every lane's initial state (u32, little-endian, lane 0 first), then step after step, in
lane order, the 0, 1 or 2 bytes each lane reads.  Groups are independent (one GPU warp
each); lanes in a group step together (one warp, ballots for the byte positions).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from ..errors import CorruptStreamError, InvalidArgumentError, LimitExceededError, UnsupportedFormatError
from ..framing import read_prefix, read_varints, write_varints, xxh64
from . import layout as L
from .cdf_tables import PRECISION

MAGIC = b"VZRC"
VERSION = 2  # written when no symbol is skipped
VERSION_SKIP = 3  # written with a skip threshold
VERSIONS = (1, 2, 3)
# version 1: magic, version, lanes, reserved, n, group_symbols, escapes, tables id (low 32 bits of the
# fingerprint), then the u64 checksum; u32 group sizes; the escapes as an ints stream
PREFIX = struct.Struct("<4sBBHIIII")
HEAD = PREFIX.size + 8
# version 2: magic, version, lanes, tables id, then the u64 checksum; then varints n, group_symbols,
# escapes, the group sizes; the groups; each escape's excess as a zigzag varint
# version 3: the same prefix; varints total, skip frequency, n (the coded symbols), group_symbols, escapes,
# exceptions; the group sizes; the groups; the escapes; the exceptions' position gaps and zigzag values
PREFIX2 = struct.Struct("<4sBBI")
HEAD2 = PREFIX2.size + 8
GROUP_SIZE_BYTES = 5  # a group size is below 2^32 (4 lanes + 2 bytes a symbol): at most 5 varint bytes
EXCESS_BYTES = 5  # an escape's zigzag excess is a u32
POSITION_BYTES = 5  # a skipped symbol's position is below 2^29

RANS_L = 1 << 23  # lower bound of a state after renormalisation
TOTAL_FREQ = 1 << PRECISION  # a table's frequencies add up to this
X_MAX_SHIFT = 23 - PRECISION + 8  # the encoder emits a byte while x >= f << 15, i.e. ((L >> 16) << 8) * f
STATE_BYTES = 4
MAX_LANES = 32  # lanes of one group: one warp
MAX_SYMBOLS = L.MAX_VALUES  # 2**29, as the block stream
MIN_LANE_SYMBOLS = 64  # the planner never gives a lane fewer symbols (except when n itself is smaller)
MAX_LANE_SYMBOLS = 1 << 20  # largest lane_symbols the planner takes
MAX_STEPS = MAX_LANE_SYMBOLS + 2  # steps of a stream, which bound a decoder's sequential work


@dataclass(frozen=True)
class Plan:
    """How n symbols are spread over lanes: ``lanes`` per group, ``group_symbols`` per group."""

    n: int
    lanes: int
    group_symbols: int

    @property
    def groups(self) -> int:
        return -(-self.n // self.group_symbols) if self.n else 0

    @property
    def steps(self) -> int:
        return -(-self.group_symbols // self.lanes) if self.n else 0

    def group_lengths(self) -> np.ndarray:
        g = np.arange(self.groups, dtype=np.int64)
        return np.minimum(self.group_symbols, self.n - g * self.group_symbols)

    def max_group_bytes(self) -> np.ndarray:
        """Largest possible stream of each group: the states and 2 bytes per symbol."""
        return STATE_BYTES * self.lanes + 2 * self.group_lengths()


def plan(n: int, est_bytes: int, lane_bytes: int, lane_symbols: int) -> Plan:
    """Lanes for n symbols whose code is about est_bytes long.

    Each lane costs about 3.5 bytes (its 4-byte final state carries about half a byte of
    data), so lanes are given about ``lane_bytes`` of code each, and at most
    ``lane_symbols`` symbols each (which bounds the sequential steps, hence the latency).
    Up to 32 lanes form one group; beyond, groups of 32.  Both encoders compute the same
    integers, so they choose the same plan.
    """
    if not (1 <= lane_bytes and 1 <= lane_symbols <= MAX_LANE_SYMBOLS):
        raise InvalidArgumentError(f"lane_bytes={lane_bytes} must be >= 1 and lane_symbols={lane_symbols} in "
                                   f"1..{MAX_LANE_SYMBOLS}")
    if n == 0:
        return Plan(0, 0, 0)
    want = max(1, -(-est_bytes // lane_bytes), -(-n // lane_symbols))
    want = min(want, max(1, n // MIN_LANE_SYMBOLS))
    if want <= MAX_LANES:
        return Plan(n, want, n)
    groups = -(-want // MAX_LANES)
    return Plan(n, MAX_LANES, -(-n // groups))


@dataclass(frozen=True)
class Skip:
    """Version 3's skipped symbols: of ``total`` symbols, those whose table's zero frequency
    (``CdfTables.zero_freq``) is at least ``freq`` are not in the lanes; they decode to 0 but for the
    ``positions`` (strictly increasing, int64, among the skipped ones), which hold ``values`` (non-zero)."""

    total: int
    freq: int
    positions: np.ndarray
    values: np.ndarray


NO_SKIP = Skip(0, 0, np.zeros(0, np.int64), np.zeros(0, np.int64))  # what a version-1 or -2 stream parses to


def checksum(prefix, body) -> int:
    return xxh64(prefix, body)


def pack(p: Plan, escapes: int, tables_id: int, sizes: np.ndarray, groups: bytes, escape_stream: bytes,
         skip: Skip | None = None) -> bytes:
    """A version-2 stream, or version 3 with ``skip`` (the plan then covers the coded symbols only):
    ``escape_stream`` is ``escape_varints`` of the excesses (b"" without escapes)."""
    prefix = PREFIX2.pack(MAGIC, VERSION if skip is None else VERSION_SKIP, p.lanes, tables_id & 0xFFFFFFFF)
    counts = [p.n, p.group_symbols, escapes]
    tail = b""
    if skip is not None:
        counts = [skip.total, skip.freq, *counts, skip.positions.size]
        tail = exception_varints(skip.positions, skip.values)
    body = b"".join((write_varints(counts), write_varints(np.asarray(sizes, np.int64)), groups, escape_stream, tail))
    return b"".join((prefix, struct.pack("<Q", checksum(prefix, body)), body))


def escape_varints(excess: np.ndarray) -> bytes:
    """Escape excesses (int32, never 0) as zigzag varints: (e << 1) ^ (e >> 31), then LEB128."""
    e = np.asarray(excess, np.int64)
    return write_varints((e << 1) ^ (e >> 63))


def exception_varints(positions: np.ndarray, values: np.ndarray) -> bytes:
    """Version 3's non-zero skipped symbols: each position as its gap after the one before (the first as
    itself, then p_k - p_(k-1) - 1), then each value as ``escape_varints`` writes an excess."""
    pos = np.asarray(positions, np.int64)
    gaps = np.diff(pos, prepend=-1) - 1
    return write_varints(gaps) + escape_varints(values)


@dataclass(frozen=True)
class Parsed:
    plan: Plan
    escapes: int
    starts: np.ndarray  # int64, offset of each group's stream in ``buf``
    sizes: np.ndarray  # int64, bytes of each group's stream
    buf: memoryview
    escape_stream: memoryview | np.ndarray  # version 1: the ints stream of the excesses; 2, 3: the excesses (int64)
    skip: Skip = NO_SKIP  # version 3's skipped symbols (freq 0: none skipped)
    listed_at: int | None = None  # version 3: where the exceptions start in ``buf`` (None for versions 1 and 2)


def parse(buf, n: int | None, tables_id: int | None) -> Parsed:
    """Check every field, size and the checksum before anything is allocated or decoded.

    ``n``: the number of symbols the caller expects (the size of its index array: a version-3 stream's
    total, skipped symbols included); ``tables_id``: the fingerprint of the caller's CDF tables.  ``None``
    takes the header's own value, for a report that has no indexes or tables to check the stream against
    (``pieces``); a decoder always passes both.  Which symbols a version-3 stream skipped depends on the
    indexes, so the decoder checks those counts itself (``rans.coded_positions``).
    """
    mv, _ = read_prefix(buf, "conditional rANS stream", PREFIX2, PREFIX2.size, MAGIC, VERSIONS)
    return {1: _parse1, 2: _parse2, 3: _parse3}[mv[4]](mv, n, tables_id)


def _check_counts(count: int, n: int | None, tid: int, tables_id: int | None) -> None:
    if count > MAX_SYMBOLS:
        raise LimitExceededError(f"conditional rANS stream claims {count} symbols, over the limit of {MAX_SYMBOLS}")
    if n is not None and count != n:
        raise CorruptStreamError(f"conditional rANS stream holds {count} symbols but {n} indexes were given")
    if tables_id is not None and tid != tables_id & 0xFFFFFFFF:
        raise UnsupportedFormatError(
            f"conditional rANS stream was written with CDF tables {tid:08x}; these tables are "
            f"{tables_id & 0xFFFFFFFF:08x}"
        )


def _check_plan(lanes: int, count: int, group_symbols: int, escapes: int) -> Plan:
    if not (1 <= lanes <= MAX_LANES and 1 <= group_symbols <= count and escapes <= count):
        raise CorruptStreamError(
            f"conditional rANS stream has {lanes} lanes, {group_symbols} symbols per group, {escapes} escapes "
            f"for {count} symbols"
        )
    p = Plan(count, lanes, group_symbols)
    if p.steps > MAX_STEPS:
        raise LimitExceededError(f"conditional rANS stream has {p.steps} steps per lane, over the limit of {MAX_STEPS}")
    return p


def _groups(mv: memoryview, p: Plan, sizes: np.ndarray, table_end: int) -> tuple[np.ndarray, int]:
    """Each group's start, checked against what its symbols allow, and where the groups end."""
    if np.any(sizes < STATE_BYTES * p.lanes) or np.any(sizes > p.max_group_bytes()):
        raise CorruptStreamError("conditional rANS stream has a group size outside what its symbols allow")
    ends = table_end + np.cumsum(sizes)
    if int(ends[-1]) > len(mv):
        raise CorruptStreamError(f"conditional rANS stream groups end at byte {int(ends[-1])} of {len(mv)}")
    return ends - sizes, int(ends[-1])


def _checked_prefix(mv: memoryview, counts: int) -> tuple[int, int, np.ndarray, int]:
    """Versions 2 and 3: (lanes, tables id, the ``counts`` leading varints, the position after them),
    the checksum checked first."""
    if len(mv) < HEAD2:
        raise CorruptStreamError(f"conditional rANS stream of {len(mv)} bytes is shorter than its {HEAD2}-byte header")
    _, _, lanes, tid = PREFIX2.unpack_from(mv, 0)
    (stored,) = struct.unpack_from("<Q", mv, PREFIX2.size)
    if checksum(mv[: PREFIX2.size], mv[HEAD2:]) != stored:
        raise CorruptStreamError("conditional rANS stream checksum mismatch: the stream is corrupt or truncated")
    values, pos = read_varints(mv, HEAD2, counts, "conditional rANS stream counts")
    return lanes, tid, values, pos


def _lanes(mv: memoryview, pos: int, lanes: int, count: int, group_symbols: int, escapes: int):
    """The plan, the groups' starts and sizes, and where the groups end (``pos``: where the group sizes start)."""
    if count == 0:
        if lanes or group_symbols or escapes:
            raise CorruptStreamError("empty conditional rANS stream with non-zero fields or a body")
        z = np.zeros(0, np.int64)
        return Plan(0, 0, 0), z, z, pos
    p = _check_plan(lanes, count, group_symbols, escapes)
    sizes, table_end = read_varints(mv, pos, p.groups, "conditional rANS stream group sizes", GROUP_SIZE_BYTES)
    sizes = sizes.astype(np.int64)
    starts, end = _groups(mv, p, sizes, table_end)
    return p, starts, sizes, end


def _parse2(mv: memoryview, n: int | None, tables_id: int | None) -> Parsed:
    lanes, tid, counts, pos = _checked_prefix(mv, 3)
    count, group_symbols, escapes = (int(v) for v in counts)
    _check_counts(count, n, tid, tables_id)
    p, starts, sizes, end = _lanes(mv, pos, lanes, count, group_symbols, escapes)
    excess, end = _zigzags(mv, end, escapes, "escape excesses")
    _check_end(mv, end)
    return Parsed(p, escapes, starts, sizes, mv, excess)


def _parse3(mv: memoryview, n: int | None, tables_id: int | None) -> Parsed:
    lanes, tid, counts, pos = _checked_prefix(mv, 6)
    total, freq, count, group_symbols, escapes, exceptions = (int(v) for v in counts)
    _check_counts(total, n, tid, tables_id)
    if not 1 <= freq <= TOTAL_FREQ or count > total or exceptions > total - count:
        raise CorruptStreamError(f"conditional rANS stream skips at zero frequency {freq} and codes {count} of {total} "
                                 f"symbols with {exceptions} exceptions")
    p, starts, sizes, end = _lanes(mv, pos, lanes, count, group_symbols, escapes)
    excess, end = _zigzags(mv, end, escapes, "escape excesses")
    listed_at = end
    gaps, end = read_varints(mv, end, exceptions, "conditional rANS stream exception positions", POSITION_BYTES)
    # every gap below N before the sum, so that a sum of up to N of them cannot wrap
    positions = np.cumsum(np.minimum(gaps, total).astype(np.int64) + 1) - 1
    if exceptions and int(positions[-1]) >= total:
        raise CorruptStreamError(f"conditional rANS stream lists exceptions at or beyond position {total}")
    values, end = _zigzags(mv, end, exceptions, "exception values")
    _check_end(mv, end)
    return Parsed(p, escapes, starts, sizes, mv, excess, Skip(total, freq, positions, values), listed_at)


def _zigzags(mv: memoryview, pos: int, count: int, what: str) -> tuple[np.ndarray, int]:
    """``count`` zigzag varints at ``pos``, each a non-zero int32 (int64), and the position after them."""
    zz, end = read_varints(mv, pos, count, f"conditional rANS stream {what}", EXCESS_BYTES)
    if np.any(zz == 0) or np.any(zz >> np.uint64(32)):
        raise CorruptStreamError(f"conditional rANS stream holds {what} that are not {count} non-zero int32 values")
    zz = zz.astype(np.int64)
    return (zz >> 1) ^ -(zz & 1), end


def _check_end(mv: memoryview, end: int) -> None:
    if end != len(mv):
        raise CorruptStreamError(f"conditional rANS stream has {len(mv) - end} bytes after its last field")


def _parse1(mv: memoryview, n: int | None, tables_id: int | None) -> Parsed:
    if len(mv) < HEAD:
        raise CorruptStreamError(f"conditional rANS stream of {len(mv)} bytes is shorter than its {HEAD}-byte header")
    _, _, lanes, reserved, count, group_symbols, escapes, tid = PREFIX.unpack_from(mv, 0)
    (stored,) = struct.unpack_from("<Q", mv, PREFIX.size)
    if checksum(mv[: PREFIX.size], mv[HEAD:]) != stored:
        raise CorruptStreamError("conditional rANS stream checksum mismatch: the stream is corrupt or truncated")
    if reserved:
        raise CorruptStreamError(f"conditional rANS stream reserved field is {reserved}, not 0")
    _check_counts(count, n, tid, tables_id)
    if count == 0:
        if lanes or group_symbols or escapes or len(mv) != HEAD:
            raise CorruptStreamError("empty conditional rANS stream with non-zero fields or a body")
        z = np.zeros(0, np.int64)
        return Parsed(Plan(0, 0, 0), 0, z, z, mv, mv[HEAD:HEAD])
    p = _check_plan(lanes, count, group_symbols, escapes)
    table_end = HEAD + 4 * p.groups
    if len(mv) < table_end:
        raise CorruptStreamError(f"conditional rANS stream of {len(mv)} bytes cannot hold its {p.groups}-group table")
    sizes = np.frombuffer(mv, "<u4", p.groups, HEAD).astype(np.int64)
    starts, end = _groups(mv, p, sizes, table_end)
    if (len(mv) > end) != (escapes > 0):
        raise CorruptStreamError(f"conditional rANS stream groups end at byte {end} of {len(mv)}, with {escapes} "
                                 "escapes")
    return Parsed(p, escapes, starts, sizes, mv, mv[end:])


def pieces(buf) -> dict[str, int]:
    """A stream's bytes by what they hold (for reports of overhead): header (fixed fields, counts and group
    sizes), lane states, escapes, exceptions (version 3's non-zero skipped symbols) and body (the lanes'
    coded bytes).  The stream is checked by ``parse``, against the symbol count and tables its own header
    states."""
    parsed = parse(buf, None, None)
    p, size = parsed.plan, len(parsed.buf)
    listed = 0 if parsed.listed_at is None else size - parsed.listed_at
    if p.n == 0:
        return {"header": size - listed, "lane_states": 0, "escapes": 0, "exceptions": listed, "body": 0}
    table_end, coded = int(parsed.starts[0]), int(parsed.sizes.sum())
    states = STATE_BYTES * p.lanes * p.groups
    return {"header": table_end, "lane_states": states, "escapes": size - table_end - coded - listed,
            "exceptions": listed, "body": coded - states}
