"""What every visemz binary format starts with: a bytes view, a magic, a version, xxh64.

Shared by the .vsz container and the ints stream, so both refuse foreign or newer data
the same way, before looking at anything else.
"""

from __future__ import annotations

import struct

import xxhash

from .errors import CorruptStreamError, UnsupportedFormatError


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
