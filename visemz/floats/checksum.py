"""The float streams' checksum: a u64 xxh64 right after a stream's fixed header, over every other byte."""

from __future__ import annotations

import struct

from ..errors import CorruptStreamError
from ..framing import xxh64


def compute(head, body) -> bytes:
    """The u64 xxh64 of a stream's fixed header and of everything after the checksum field: every other byte."""
    return struct.pack("<Q", xxh64(head, body))


def verify(mv: memoryview, head: int, what: str) -> None:
    """A stream whose u64 checksum follows its ``head`` fixed bytes: every other byte checked against it."""
    if len(mv) < head + 8:
        raise CorruptStreamError(f"{what} of {len(mv)} bytes is shorter than its {head + 8}-byte header")
    (stored,) = struct.unpack_from("<Q", mv, head)
    if xxh64(mv[:head], mv[head + 8:]) != stored:
        raise CorruptStreamError(f"{what} checksum mismatch: the stream is corrupt or truncated")

