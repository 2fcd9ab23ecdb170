"""The block stream's layout: constants, header, section sizes, width choice.

One definition shared by the NumPy reference and the CUDA kernels (which
mirror these constants in ``cuda/block.cuh``); docs/FORMAT.md describes the
same bytes in prose.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from ..errors import CorruptStreamError, LimitExceededError, UnsupportedFormatError

MAGIC = b"VZBK"
VERSION = 1
HEADER = struct.Struct("<4sBBBBQII")  # magic, version, policy, flags, width, n, ntiles, payload
HEADER_SIZE = HEADER.size  # 24

TILE_VALUES = 8192  # values per tile: the unit of offsets (and of one GPU thread block)
GLOBAL_BLOCK = 64  # values per block under the global-width policy (6-bit outlier index)
PERBLOCK_BLOCK = 32  # values per block under the per-block policy (one warp)
# Truncation widths the global policy chooses from.  Any t in 1..8 keeps every block
# byte-aligned (64 values * t bits = 8t bytes), so widths need not be powers of two.
GLOBAL_WIDTHS = tuple(range(1, 9))
MAX_VALUES = 1 << 29  # keeps every payload offset inside a u32

FLAG_BITSHUFFLE = 1

POLICIES = {"global": 0, "block": 1}
POLICY_NAMES = {v: k for k, v in POLICIES.items()}

# Magnitude categories of a sign-shifted value u: its bit length up to 8 (category = t
# holds exactly the values that fit in t bits), then 9 for 9..16 bits, 10 for 17..24, 11 for 25..32.
N_CATEGORIES = 12
CATEGORY_BOUNDS = np.array([1 << b for b in range(9)] + [1 << 16, 1 << 24], dtype=np.uint32)
OUTLIER_BYTES = np.array([0] + [1] * 8 + [2, 3, 4], dtype=np.int64)  # bytes to store u, by category


@dataclass(frozen=True)
class Header:
    policy: int
    bitshuffle: bool
    width: int
    n: int
    ntiles: int
    payload: int

    def pack(self) -> bytes:
        flags = FLAG_BITSHUFFLE if self.bitshuffle else 0
        return HEADER.pack(MAGIC, VERSION, self.policy, flags, self.width, self.n, self.ntiles, self.payload)


def block_size(policy: int) -> int:
    return GLOBAL_BLOCK if policy == POLICIES["global"] else PERBLOCK_BLOCK


def n_tiles(n: int) -> int:
    return -(-n // TILE_VALUES)


def n_blocks(policy: int, n: int) -> int:
    return -(-n // block_size(policy))


def chunk_flags(width: int, bitshuffle: bool) -> int:
    """Zero-chunk flags per global block: one per bit-plane (bitshuffle), else one per block."""
    return width if bitshuffle else 1


def meta_size(policy: int, n: int, width: int = 8, bitshuffle: bool = True) -> int:
    """Bytes of per-block metadata.

    global: per block, its chunk flags then one outlier flag, bit-packed LSB first;
    block: one width byte per block.
    """
    nb = n_blocks(policy, n)
    if policy == POLICIES["global"]:
        return -(-nb * (chunk_flags(width, bitshuffle) + 1) // 8)
    return nb


def table_offset() -> int:
    return HEADER_SIZE


def meta_offset(n: int) -> int:
    return HEADER_SIZE + 4 * n_tiles(n)


def payload_offset(policy: int, n: int, width: int = 8, bitshuffle: bool = True) -> int:
    return meta_offset(n) + meta_size(policy, n, width, bitshuffle)


def max_payload(policy: int, n: int) -> int:
    """Worst-case payload bytes, for allocating GPU output before sizes are known."""
    tiles = n_tiles(n)
    if policy == POLICIES["global"]:
        # chunks (1 B/value at t=8) + count byte per block + index byte + 4 value bytes per value
        return tiles * (TILE_VALUES * 6 + TILE_VALUES // GLOBAL_BLOCK)
    return tiles * TILE_VALUES * 4


def max_stream_size(policy: int, n: int) -> int:
    return payload_offset(policy, n) + max_payload(policy, n)  # meta at its largest (t = 8)


def max_raw_size(n: int) -> int:
    """The largest block stream of at most ``n`` values under either policy: what a reader that expects no
    more than ``n`` values may accept as an ints stream's raw size, before it decompresses anything."""
    return max(max_stream_size(p, n) for p in POLICIES.values())


def check_declared(n: int, count: int | None = None, max_count: int | None = None, what: str = "block stream") -> None:
    """A stream's declared number of values against what its reader expects: exactly ``count``, or at most
    ``max_count`` (the reader's shape bounds every allocation that follows)."""
    if count is not None and n != count:
        raise CorruptStreamError(f"{what} declares {n} values where {count} are expected")
    if max_count is not None and n > max_count:
        raise CorruptStreamError(f"{what} declares {n} values, more than the {max_count} it may hold")


def check_policy(policy: str) -> int:
    if policy not in POLICIES:
        raise UnsupportedFormatError(f"policy={policy!r}: expected one of {sorted(POLICIES)}")
    return POLICIES[policy]


SAFE_DTYPES = ("int8", "int16", "int32", "uint8", "uint16")  # every value fits int32 exactly


def check_dtype(name: str) -> None:
    if name not in SAFE_DTYPES:
        raise UnsupportedFormatError(f"dtype {name} cannot be encoded losslessly as int32; use int8/16/32 or uint8/16")


def check_count(n: int) -> None:
    if n > MAX_VALUES:
        raise LimitExceededError(f"{n} values exceed the block stream's limit of {MAX_VALUES} (2**29) values")


def choose_width(
    value_counts: np.ndarray, block_min: np.ndarray, block_max: np.ndarray, planes: np.ndarray, nb: int,
    bitshuffle: bool,
) -> int:
    """Exact block-stream size of each global width; the smallest wins (ties: narrower).

    ``value_counts[c]``: values of category c; ``block_min[c]``: blocks whose smallest
    non-zero category is c (c = 0: all-zero block); ``block_max[c]``: blocks whose
    largest category is c; ``planes[t - 1]``: non-zero bit-planes over all blocks when
    values of up to t bits are kept.  The CUDA kernel computes the same integers.
    """
    best = None
    for t in GLOBAL_WIDTHS:
        if bitshuffle:
            chunk_bytes = 8 * int(planes[t - 1])
        else:
            chunk_bytes = 8 * t * int(block_min[1 : t + 1].sum())
        with_outliers = int(block_max[t + 1 :].sum())
        outliers = int(value_counts[t + 1 :].sum())
        value_bytes = int((value_counts[t + 1 :] * OUTLIER_BYTES[t + 1 :]).sum())
        meta = -(-nb * (chunk_flags(t, bitshuffle) + 1) // 8)
        size = chunk_bytes + with_outliers + outliers + value_bytes + meta
        if best is None or size < best[0]:
            best = (size, t)
    return best[1]


def parse_header(buf: memoryview, total: int | None = None) -> Header:
    """Validate the fixed header and every derived size against the stream length (default: len(buf))."""
    total = len(buf) if total is None else total
    if len(buf) < HEADER_SIZE:
        raise CorruptStreamError(f"block stream of {len(buf)} bytes is shorter than its {HEADER_SIZE}-byte header")
    magic, version, policy, flags, width, n, ntiles, payload = HEADER.unpack_from(buf, 0)
    if magic != MAGIC:
        raise CorruptStreamError(f"block stream magic {magic!r} is not {MAGIC!r}")
    if version != VERSION:
        raise UnsupportedFormatError(f"block stream version {version} (this build reads version {VERSION})")
    if policy not in POLICY_NAMES:
        raise CorruptStreamError(f"block stream policy code {policy} is unknown")
    if flags & ~FLAG_BITSHUFFLE:
        raise CorruptStreamError(f"block stream flags 0x{flags:02x} has unknown bits")
    if n > MAX_VALUES:
        raise LimitExceededError(f"block stream claims {n} values, over the limit of {MAX_VALUES}")
    if ntiles != n_tiles(n):
        raise CorruptStreamError(f"block stream has {ntiles} tiles for {n} values (expected {n_tiles(n)})")
    if policy == POLICIES["global"]:
        if width not in GLOBAL_WIDTHS and not (n == 0 and width == 0):
            raise CorruptStreamError(f"block stream global width {width} is not one of {GLOBAL_WIDTHS}")
    elif width != 0:
        raise CorruptStreamError(f"block stream per-block policy with width field {width} (must be 0)")
    expected = payload_offset(policy, n, width, bool(flags & FLAG_BITSHUFFLE)) + payload
    if payload > max_payload(policy, n) or expected != total:
        raise CorruptStreamError(
            f"block stream of {total} bytes does not match its header ({n} values, payload {payload} bytes)"
        )
    return Header(policy, bool(flags & FLAG_BITSHUFFLE), width, n, ntiles, payload)


def tile_ends(buf: memoryview, hdr: Header) -> np.ndarray:
    """The tile table, checked to be non-decreasing and to end at the payload size."""
    ends = np.frombuffer(buf, dtype="<u4", count=hdr.ntiles, offset=table_offset()).astype(np.int64)
    if hdr.ntiles:
        if np.any(np.diff(ends) < 0) or ends[0] < 0 or ends[-1] != hdr.payload:
            raise CorruptStreamError("block stream tile table is not a non-decreasing list ending at the payload size")
    elif hdr.payload:
        raise CorruptStreamError(f"empty block stream with a payload of {hdr.payload} bytes")
    return ends
