"""The .vsz container: magic, version, a JSON header and checksummed sections.

Layout (little-endian; docs/FORMAT.md has the full description)::

    0   8  magic b"\\x89VSZ\\r\\n\\x1a\\n"
    8   2  format version (1)
    10  2  reserved, 0
    12  4  JSON header length (at most 1 MiB)
    16  4  number of sections (at most 64)
    20  4  reserved, 0
    24  8  total length of the container in bytes
    32  8  xxh64 of bytes [0, 32), the section table and the JSON header
    40     section table: per section a u64 length and the u64 xxh64 of its bytes
    ...    JSON header (UTF-8): {"kind": str, "sections": [names], "meta": {...}}
    ...    the sections, back to back, in table order

The parser checks every size against the buffer and the limits before it
allocates anything, then every checksum, and rejects unknown versions and fields.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from typing import Any

from .errors import CorruptStreamError, LimitExceededError, UnsupportedFormatError
from .framing import read_prefix, xxh64

MAGIC = b"\x89VSZ\r\n\x1a\n"
VERSION = 1
FIXED = struct.Struct("<8sHHIIIQ")  # 32 bytes, then the u64 header checksum
HEAD = FIXED.size + 8
ENTRY = struct.Struct("<QQ")
MAX_HEADER = 1 << 20
MAX_SECTIONS = 64
HEADER_KEYS = {"kind", "sections", "meta"}


@dataclass(frozen=True)
class Container:
    kind: str
    meta: dict[str, Any]
    sections: dict[str, memoryview] = field(default_factory=dict)


def pack(kind: str, meta: dict[str, Any], sections: dict[str, bytes]) -> bytes:
    names = list(sections)
    if len(names) > MAX_SECTIONS:
        raise LimitExceededError(f"{len(names)} sections exceed the limit of {MAX_SECTIONS}")
    header = json.dumps({"kind": kind, "sections": names, "meta": meta}, separators=(",", ":"), allow_nan=False)
    hbytes = header.encode()
    if len(hbytes) > MAX_HEADER:
        raise LimitExceededError(f"container header of {len(hbytes)} bytes exceeds {MAX_HEADER}")
    bodies = [memoryview(sections[n]).cast("B") for n in names]
    table = b"".join(ENTRY.pack(len(b), xxh64(b)) for b in bodies)
    total = HEAD + len(table) + len(hbytes) + sum(len(b) for b in bodies)
    fixed = FIXED.pack(MAGIC, VERSION, 0, len(hbytes), len(names), 0, total)
    return b"".join([fixed, struct.pack("<Q", xxh64(fixed, table, hbytes)), table, hbytes, *bodies])


def check_meta(meta: dict[str, Any], keys: set[str], kind: str, version: int, dtypes) -> None:
    """What a kind's meta is checked for first: exactly ``keys`` (a key this build does not know
    is a newer writer's: UnsupportedFormatError; a missing one, damage), this build's ``version``
    of the kind, and a dtype it decodes."""
    unknown, missing = set(meta) - keys, keys - set(meta)
    if unknown:
        raise UnsupportedFormatError(f"{kind} header has unknown fields {sorted(unknown)}")
    if missing:
        raise CorruptStreamError(f"{kind} header lacks fields {sorted(missing)}")
    if meta["format"] != version:
        raise UnsupportedFormatError(f"{kind} format {meta['format']!r} (this build reads {version})")
    if meta["dtype"] not in dtypes:
        raise UnsupportedFormatError(f"{kind} dtype {meta['dtype']!r} is not one of {list(dtypes)}")


def _reject_constant(name: str):
    raise CorruptStreamError(f"container header holds the non-JSON constant {name}")


def _header(raw: memoryview) -> dict[str, Any]:
    try:
        obj = json.loads(bytes(raw).decode("utf-8"), parse_constant=_reject_constant)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise CorruptStreamError(f"container header is not valid JSON: {type(e).__name__}") from None
    if not isinstance(obj, dict):
        raise CorruptStreamError("container header is not a JSON object")
    unknown = set(obj) - HEADER_KEYS
    if unknown:
        raise UnsupportedFormatError(f"container header has unknown fields {sorted(unknown)}")
    if not isinstance(obj.get("kind"), str) or not isinstance(obj.get("meta"), dict):
        raise CorruptStreamError("container header needs a string 'kind' and an object 'meta'")
    names = obj.get("sections")
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names) or len(set(names)) != len(names):
        raise CorruptStreamError("container header 'sections' is not a list of distinct names")
    return obj


def unpack(buf) -> Container:
    mv, (reserved, hlen, nsec, reserved2, total) = read_prefix(buf, ".vsz container", FIXED, HEAD, MAGIC, VERSION)
    if total != len(mv):
        raise CorruptStreamError(f"container claims {total} bytes but {len(mv)} are present (truncated or padded)")
    if hlen > MAX_HEADER or nsec > MAX_SECTIONS or reserved or reserved2:
        raise CorruptStreamError(f"container header length {hlen} or section count {nsec} is out of bounds")
    table_end = HEAD + ENTRY.size * nsec
    if table_end + hlen > len(mv):
        raise CorruptStreamError("container section table and header run past its end")
    (stored,) = struct.unpack_from("<Q", mv, FIXED.size)
    if xxh64(mv[: FIXED.size], mv[HEAD:table_end], mv[table_end : table_end + hlen]) != stored:
        raise CorruptStreamError("container header checksum mismatch")
    entries = [ENTRY.unpack_from(mv, HEAD + ENTRY.size * i) for i in range(nsec)]
    header = _header(mv[table_end : table_end + hlen])
    if len(header["sections"]) != nsec:
        raise CorruptStreamError(f"container header names {len(header['sections'])} sections, table has {nsec}")
    pos = table_end + hlen
    if pos + sum(length for length, _ in entries) != len(mv):
        raise CorruptStreamError("container section lengths do not add up to its length")
    sections = {}
    for name, (length, digest) in zip(header["sections"], entries):
        body = mv[pos : pos + length]
        if xxh64(body) != digest:
            raise CorruptStreamError(f"container section {name!r} checksum mismatch")
        sections[name] = body
        pos += length
    return Container(header["kind"], header["meta"], sections)
