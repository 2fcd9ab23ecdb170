"""The conditional rANS stream's layout: constants, lane plan, header, validation.

One definition shared by the NumPy reference (``rans_reference.py``) and the CUDA
kernels (``cuda/rans.cu``, which mirror the constants); docs/FORMAT.md section 6
describes the same bytes in prose.

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
from ..framing import read_prefix, xxh64
from . import layout as L
from .cdf_tables import PRECISION

MAGIC = b"VZRC"
VERSION = 1
# magic, version, lanes, reserved, n, group_symbols, escapes, tables id (low 32 bits of the fingerprint)
PREFIX = struct.Struct("<4sBBHIIII")
HEAD = PREFIX.size + 8  # then the u64 checksum

RANS_L = 1 << 23  # lower bound of a state after renormalisation
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
        raise InvalidArgumentError(f"lane_bytes={lane_bytes} must be >= 1 and lane_symbols={lane_symbols} in 1..{MAX_LANE_SYMBOLS}")
    if n == 0:
        return Plan(0, 0, 0)
    want = max(1, -(-est_bytes // lane_bytes), -(-n // lane_symbols))
    want = min(want, max(1, n // MIN_LANE_SYMBOLS))
    if want <= MAX_LANES:
        return Plan(n, want, n)
    groups = -(-want // MAX_LANES)
    return Plan(n, MAX_LANES, -(-n // groups))


def checksum(prefix, body) -> int:
    return xxh64(prefix, body)


def pack(p: Plan, escapes: int, tables_id: int, sizes: np.ndarray, groups: bytes, escape_stream: bytes) -> bytes:
    prefix = PREFIX.pack(MAGIC, VERSION, p.lanes, 0, p.n, p.group_symbols, escapes, tables_id & 0xFFFFFFFF)
    body = b"".join((np.asarray(sizes, "<u4").tobytes(), groups, escape_stream))
    return b"".join((prefix, struct.pack("<Q", checksum(prefix, body)), body))


@dataclass(frozen=True)
class Parsed:
    plan: Plan
    escapes: int
    starts: np.ndarray  # int64, offset of each group's stream in ``buf``
    sizes: np.ndarray  # int64, bytes of each group's stream
    buf: memoryview
    escape_stream: memoryview


def parse(buf, n: int, tables_id: int) -> Parsed:
    """Check every field, size and the checksum before anything is allocated or decoded.

    ``n``: the number of symbols the caller expects (the size of its index array).
    """
    mv, (lanes, reserved, count, group_symbols, escapes, tid) = read_prefix(
        buf, "conditional rANS stream", PREFIX, HEAD, MAGIC, VERSION
    )
    (stored,) = struct.unpack_from("<Q", mv, PREFIX.size)
    if checksum(mv[: PREFIX.size], mv[HEAD:]) != stored:
        raise CorruptStreamError("conditional rANS stream checksum mismatch: the stream is corrupt or truncated")
    if reserved:
        raise CorruptStreamError(f"conditional rANS stream reserved field is {reserved}, not 0")
    if count > MAX_SYMBOLS:
        raise LimitExceededError(f"conditional rANS stream claims {count} symbols, over the limit of {MAX_SYMBOLS}")
    if count != n:
        raise CorruptStreamError(f"conditional rANS stream holds {count} symbols but {n} indexes were given")
    if tid != tables_id & 0xFFFFFFFF:
        raise UnsupportedFormatError(
            f"conditional rANS stream was written with CDF tables {tid:08x}; these tables are {tables_id & 0xFFFFFFFF:08x}"
        )
    if count == 0:
        if lanes or group_symbols or escapes or len(mv) != HEAD:
            raise CorruptStreamError("empty conditional rANS stream with non-zero fields or a body")
        z = np.zeros(0, np.int64)
        return Parsed(Plan(0, 0, 0), 0, z, z, mv, mv[HEAD:HEAD])
    if not (1 <= lanes <= MAX_LANES and 1 <= group_symbols <= count and escapes <= count):
        raise CorruptStreamError(
            f"conditional rANS stream has {lanes} lanes, {group_symbols} symbols per group, {escapes} escapes "
            f"for {count} symbols"
        )
    p = Plan(count, lanes, group_symbols)
    if p.steps > MAX_STEPS:
        raise LimitExceededError(f"conditional rANS stream has {p.steps} steps per lane, over the limit of {MAX_STEPS}")
    table_end = HEAD + 4 * p.groups
    if len(mv) < table_end:
        raise CorruptStreamError(f"conditional rANS stream of {len(mv)} bytes cannot hold its {p.groups}-group table")
    sizes = np.frombuffer(mv, "<u4", p.groups, HEAD).astype(np.int64)
    if np.any(sizes < STATE_BYTES * lanes) or np.any(sizes > p.max_group_bytes()):
        raise CorruptStreamError("conditional rANS stream has a group size outside what its symbols allow")
    ends = table_end + np.cumsum(sizes)
    rest = len(mv) - int(ends[-1])
    if rest < 0 or (rest > 0) != (escapes > 0):
        raise CorruptStreamError(
            f"conditional rANS stream groups end at byte {int(ends[-1])} of {len(mv)}, with {escapes} escapes"
        )
    return Parsed(p, escapes, ends - sizes, sizes, mv, mv[int(ends[-1]) :])


def pieces(buf) -> dict[str, int]:
    """A stream's bytes by what they hold (for reports of overhead; the stream is not checked):
    header, group sizes, lane states, escapes (the escape stream) and body (the coded bytes)."""
    mv = memoryview(buf).cast("B")
    _, _, lanes, _, n, group_symbols, _, _ = PREFIX.unpack_from(mv, 0)
    p = Plan(n, lanes, group_symbols)
    sizes = np.frombuffer(mv, "<u4", p.groups, HEAD).astype(np.int64)
    escapes = len(mv) - HEAD - 4 * p.groups - int(sizes.sum())
    states = STATE_BYTES * lanes * p.groups
    return {"header": HEAD, "group_sizes": 4 * p.groups, "lane_states": states, "escapes": escapes,
            "body": int(sizes.sum()) - states}
