"""What every visemz binary format starts with: a bytes view, a magic, a version, xxh64; and LEB128 varints.

Shared by the .vsz container, the ints stream and the conditional rANS stream, so all refuse
foreign or newer data the same way, before looking at anything else.
"""

from __future__ import annotations

import struct

import numpy as np
import xxhash

from .errors import CorruptStreamError, UnsupportedFormatError

MAX_VARINT_BYTES = 10  # a LEB128 u64


def xxh64(*parts) -> int:
    h = xxhash.xxh64()
    for p in parts:
        h.update(p)
    return h.intdigest()


def read_prefix(buf, what: str, fixed: struct.Struct, head: int, magic: bytes, version: int | tuple[int, ...]):
    """(byte view, fields after magic and version) of a buffer whose prefix is ``fixed``.

    ``head`` is the number of bytes the format needs before it can check anything else; ``version``
    the version this build reads (or a tuple of them).
    """
    versions = (version,) if isinstance(version, int) else tuple(version)
    try:
        mv = memoryview(buf).cast("B")
    except TypeError:
        raise UnsupportedFormatError(f"expected a bytes-like {what}, got {type(buf).__name__}") from None
    if len(mv) < head:
        raise CorruptStreamError(f"{what} of {len(mv)} bytes is shorter than its {head}-byte header")
    found, found_version, *fields = fixed.unpack_from(mv, 0)
    if found != magic:
        raise CorruptStreamError(f"not a {what}: magic {bytes(found)!r} is not {magic!r}")
    if found_version not in versions:
        reads = f"version {versions[0]}" if len(versions) == 1 else f"versions {', '.join(map(str, versions))}"
        raise UnsupportedFormatError(f"{what} version {found_version} (this build reads {reads})")
    return mv, fields


def write_varints(values) -> bytes:
    """Unsigned LEB128 of each value (non-negative integers below 2^64): 7 bits a byte, least significant
    group first, bit 7 set on every byte but a value's last."""
    v = np.asarray(values, dtype=np.uint64).reshape(-1)
    if v.size <= _SMALL:
        return _small_varints(v)
    nbytes = np.ones(v.size, np.int64)
    for k in range(1, _varint_bytes(int(v.max(initial=0)))):  # only as many passes as the largest value needs
        nbytes += v >= np.uint64(1 << (7 * k))
    out = np.empty(int(nbytes.sum()), np.uint8)
    starts = np.cumsum(nbytes) - nbytes
    for k in range(int(nbytes.max(initial=0))):
        m = nbytes > k
        more = np.where(nbytes[m] > k + 1, 0x80, 0).astype(np.uint8)
        out[starts[m] + k] = ((v[m] >> np.uint64(7 * k)) & np.uint64(0x7F)).astype(np.uint8) | more
    return out.tobytes()


_SMALL = 32  # up to this many values a Python loop beats NumPy's per-call overheads (host time)


def _varint_bytes(value: int) -> int:
    return max(1, -(-value.bit_length() // 7))


def _small_varints(v: np.ndarray) -> bytes:
    out = bytearray()
    for value in v.tolist():
        while value >= 0x80:
            out.append((value & 0x7F) | 0x80)
            value >>= 7
        out.append(value)
    return bytes(out)


def _small_read(data: bytes, pos: int, count: int, what: str, max_bytes: int) -> tuple[np.ndarray, int]:
    """``read_varints`` for a few values, in Python: the same values, positions and checks."""
    values, i = [], 0
    for _ in range(count):
        value, n = 0, 0
        while True:
            if i >= len(data):
                raise CorruptStreamError(f"{what}: the varints run past the end of their {len(data)} bytes")
            b = data[i]
            value |= (b & 0x7F) << (7 * n)
            i, n = i + 1, n + 1
            if b < 0x80:
                break
        if n > max_bytes or (n > 1 and b == 0) or (max_bytes == MAX_VARINT_BYTES and n == MAX_VARINT_BYTES and b > 1):
            raise CorruptStreamError(f"{what}: a varint is longer than {max_bytes} bytes, not minimal, or over 2^64")
        values.append(value)
    return np.array(values, np.uint64), pos + i


def read_varints(mv, pos: int, count: int, what: str, max_bytes: int = MAX_VARINT_BYTES) -> tuple[np.ndarray, int]:
    """(``count`` values as uint64, the position after them) of the LEB128 varints at ``pos`` of ``mv``.

    Each takes at most ``max_bytes`` bytes and has one encoding (no needless trailing zero group); a
    value of 10 bytes must stay below 2^64.  Work and memory follow ``count``, not the buffer: a
    count the buffer cannot hold is refused before anything is read."""
    if count == 0:
        return np.zeros(0, np.uint64), pos
    if count > len(mv) - pos:
        raise CorruptStreamError(f"{what}: {count} lengths cannot fit in the {max(0, len(mv) - pos)} bytes left")
    if count <= _SMALL:
        return _small_read(bytes(mv[pos:pos + count * max_bytes]), pos, count, what, max_bytes)
    region = np.frombuffer(mv, np.uint8, min(len(mv) - pos, count * max_bytes), pos)
    last = np.flatnonzero(region < 0x80)[:count]
    if last.size < count:
        raise CorruptStreamError(f"{what}: the varints run past the end of their {region.size} bytes")
    ends = last + 1
    starts = np.concatenate(([0], ends[:-1]))
    nbytes = ends - starts
    if nbytes.max() > max_bytes or np.any((nbytes > 1) & (region[last] == 0)) or \
            (max_bytes == MAX_VARINT_BYTES and np.any((nbytes == MAX_VARINT_BYTES) & (region[last] > 1))):
        raise CorruptStreamError(f"{what}: a varint is longer than {max_bytes} bytes, not minimal, or over 2^64")
    values = np.zeros(count, np.uint64)
    for k in range(int(nbytes.max())):
        m = nbytes > k
        values[m] |= (region[starts[m] + k] & 0x7F).astype(np.uint64) << np.uint64(7 * k)
    return values, pos + int(ends[-1])
