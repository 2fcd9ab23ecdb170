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

import zstandard

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


def parse(buf, max_values: int | None = None) -> Frames:
    """Validate sizes, limits and the checksum before anything is allocated or decoded.

    ``max_values``: the most values the reader may take from this stream (its shape's count); a raw
    size beyond the largest block stream of that many values is refused before any frame is read."""
    mv, (entropy, reserved, raw_size, chunk, nframes) = read_prefix(buf, "ints stream", PREFIX, HEAD, MAGIC, VERSION)
    (stored,) = struct.unpack_from("<Q", mv, PREFIX.size)
    if checksum(mv[: PREFIX.size], mv[HEAD:]) != stored:
        raise CorruptStreamError("ints stream checksum mismatch: the stream is corrupt or truncated")
    if entropy not in E.NAMES or reserved:
        raise CorruptStreamError(f"ints stream entropy code {entropy} (reserved {reserved}) is invalid")
    if raw_size > MAX_RAW:
        raise LimitExceededError(f"ints stream claims a {raw_size}-byte block stream, over the {MAX_RAW}-byte limit")
    if max_values is not None and raw_size > L.max_raw_size(max_values):
        raise CorruptStreamError(f"ints stream claims a {raw_size}-byte block stream, more than {max_values} values "
                                 f"can take ({L.max_raw_size(max_values)} bytes)")
    body = mv[HEAD:]
    if entropy == E.KINDS["none"]:
        if chunk or nframes or len(body) != raw_size:
            raise CorruptStreamError(f"uncompressed ints stream holds {len(body)} bytes but claims {raw_size}")
        return Frames(entropy, raw_size, 0, [body], [raw_size])
    if not (MIN_CHUNK <= chunk <= MAX_CHUNK):
        raise CorruptStreamError(f"ints stream frame size {chunk} outside {MIN_CHUNK}..{MAX_CHUNK}")
    if nframes != -(-raw_size // chunk) or len(body) < 4 * nframes:  # before the frames' bounds are listed
        raise CorruptStreamError(f"ints stream has {nframes} frames for {raw_size} bytes in chunks of {chunk}")
    bounds = E.chunk_bounds(raw_size, chunk)
    lengths = struct.unpack_from(f"<{nframes}I", body, 0)
    if 4 * nframes + sum(lengths) != len(body):
        raise CorruptStreamError("ints stream frame sizes do not add up to its length")
    frames, pos = [], 4 * nframes
    for n in lengths:
        frames.append(body[pos : pos + n])
        pos += n
    sizes = [b - a for a, b in bounds]
    if entropy == E.KINDS["zstd"]:
        for frame, size in zip(frames, sizes):
            check_zstd_frame(frame, size)
    return Frames(entropy, raw_size, chunk, frames, sizes)


def check_zstd_frame(frame, size: int) -> None:
    """A zstd frame's own header against the chunk it must hold, before anything is decompressed: a frame
    that declares another content size is refused (one that declares none is held to ``size`` by the
    decompressor's output bound)."""
    try:
        declared = zstandard.get_frame_parameters(frame).content_size
    except zstandard.ZstdError as e:
        raise CorruptStreamError(f"ints stream frame of {len(frame)} bytes has no valid zstd frame header: "
                                 f"{e}") from None
    if declared != zstandard.CONTENTSIZE_UNKNOWN and declared != size:
        raise CorruptStreamError(f"ints stream zstd frame declares {declared} bytes where its chunk holds {size}")


def declared_count(parsed: Frames) -> int | None:
    """The number of values a parsed stream's block stream declares, read from its 24-byte header alone (the
    first frame's start decompressed on the CPU); None for nvCOMP's ANS, which only a GPU reads."""
    if parsed.entropy == E.KINDS["ans"]:
        return None
    first = parsed.frames[0] if parsed.frames else b""
    if parsed.entropy == E.KINDS["zstd"]:
        try:
            first = zstandard.ZstdDecompressor().stream_reader(bytes(first)).read(L.HEADER_SIZE)
        except zstandard.ZstdError as e:
            raise CorruptStreamError(f"ints stream zstd frame does not decode: {e}") from None
    if len(first) < L.HEADER_SIZE:
        raise CorruptStreamError(f"ints stream's block stream is shorter than its {L.HEADER_SIZE}-byte header")
    return L.HEADER.unpack_from(first, 0)[5]
