"""The ints stream: a block stream wrapped in its entropy stage and a checksum.

Layout (little-endian; docs/FORMAT.md has the full description)::

    0   4  magic b"VZIS"
    4   1  version (1)
    5   1  entropy: 0 none, 1 zstd, 2 ans
    6   2  reserved, 0
    8   8  raw size: bytes of the block stream
    16  4  chunk: uncompressed bytes per frame (0 when entropy is none)
    20  4  number of frames
    24  8  xxh64 of bytes [0, 24) and [32, end)
    32     frame sizes, u32 each, then the frames (entropy none: the block stream itself)
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from ..errors import CorruptStreamError, LimitExceededError
from ..framing import read_prefix, xxh64
from . import entropy as E
from . import layout as L

MAGIC = b"VZIS"
VERSION = 1
PREFIX = struct.Struct("<4sBBHQII")  # 24 bytes, then the u64 checksum
HEAD = PREFIX.size + 8
MAX_RAW = L.max_stream_size(L.POLICIES["global"], L.MAX_VALUES)  # largest block stream possible
MIN_CHUNK, MAX_CHUNK = 4096, 16 << 20


@dataclass(frozen=True)
class Frames:
    """A parsed, checksum-verified ints stream: where each frame lies."""

    entropy: int
    raw_size: int
    chunk: int
    frames: list[memoryview]  # compressed frames (or the raw block stream for entropy none)
    sizes: list[int]  # decompressed size of each frame


def checksum(prefix: bytes | memoryview, body: bytes | memoryview) -> int:
    return xxh64(prefix, body)


def pack(raw_size: int, entropy: int, chunk: int, frames: list) -> bytes:
    """Frame list (bytes-like) -> a complete ints stream."""
    if entropy == E.KINDS["none"]:
        chunk, table, nframes = 0, b"", 0
    else:
        nframes = len(frames)
        table = struct.pack(f"<{nframes}I", *(len(f) for f in frames))
    prefix = PREFIX.pack(MAGIC, VERSION, entropy, 0, raw_size, chunk, nframes)
    body = b"".join([table, *frames])
    return b"".join((prefix, struct.pack("<Q", checksum(prefix, body)), body))


def parse(buf) -> Frames:
    """Validate sizes, limits and the checksum before anything is allocated or decoded."""
    mv, (entropy, reserved, raw_size, chunk, nframes) = read_prefix(buf, "ints stream", PREFIX, HEAD, MAGIC, VERSION)
    (stored,) = struct.unpack_from("<Q", mv, PREFIX.size)
    if checksum(mv[: PREFIX.size], mv[HEAD:]) != stored:
        raise CorruptStreamError("ints stream checksum mismatch: the stream is corrupt or truncated")
    if entropy not in E.NAMES or reserved:
        raise CorruptStreamError(f"ints stream entropy code {entropy} (reserved {reserved}) is invalid")
    if raw_size > MAX_RAW:
        raise LimitExceededError(f"ints stream claims a {raw_size}-byte block stream, over the {MAX_RAW}-byte limit")
    body = mv[HEAD:]
    if entropy == E.KINDS["none"]:
        if chunk or nframes or len(body) != raw_size:
            raise CorruptStreamError(f"uncompressed ints stream holds {len(body)} bytes but claims {raw_size}")
        return Frames(entropy, raw_size, 0, [body], [raw_size])
    if not (MIN_CHUNK <= chunk <= MAX_CHUNK):
        raise CorruptStreamError(f"ints stream frame size {chunk} outside {MIN_CHUNK}..{MAX_CHUNK}")
    bounds = E.chunk_bounds(raw_size, chunk)
    if nframes != len(bounds) or len(body) < 4 * nframes:
        raise CorruptStreamError(f"ints stream has {nframes} frames for {raw_size} bytes in chunks of {chunk}")
    lengths = struct.unpack_from(f"<{nframes}I", body, 0)
    if 4 * nframes + sum(lengths) != len(body):
        raise CorruptStreamError("ints stream frame sizes do not add up to its length")
    frames, pos = [], 4 * nframes
    for n in lengths:
        frames.append(body[pos : pos + n])
        pos += n
    return Frames(entropy, raw_size, chunk, frames, [b - a for a, b in bounds])
