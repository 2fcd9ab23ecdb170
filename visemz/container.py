"""The .vsz container: magic, version, a JSON header and checksummed sections.

Version 2 (written today; docs/FORMAT.md section 3 has the byte layout)::

    0   8  magic b"\\x89VSZ\\r\\n\\x1a\\n"
    8   2  format version (2)
    10  1  number of sections (at most 64)
    11  1  header coding: 0 JSON as is, k >= 1 JSON in a zstd frame with dictionary k (``header_dictionary``)
    12  8  xxh64 of bytes [0, 12) and [20, end): everything else
    20     LEB128 lengths: the stored header's, then each section's
    ...    the header (JSON: {"kind": str, "sections": [names], "meta": {...}}, UTF-8)
    ...    the sections, back to back, in table order

Version 1 (still read, and written on request): 40 fixed bytes with the total length and a checksum
of the header, a table of u64 length and xxh64 per section, the JSON header as is.

The parser checks every size against the buffer and the limits before it allocates anything, then
every checksum, and rejects unknown versions and fields.
"""

from __future__ import annotations

import functools
import json
import math
import struct
from dataclasses import dataclass, field
from typing import Any

import zstandard

from .errors import CorruptStreamError, LimitExceededError, UnsupportedFormatError
from .framing import read_prefix, read_varints, write_varints, xxh64
from .header_dictionary import DICTIONARIES

MAGIC = b"\x89VSZ\r\n\x1a\n"
VERSION = 2
VERSIONS = (1, 2)
# version 1: 32 fixed bytes, then the u64 header checksum, then a (length, xxh64) entry per section
FIXED = struct.Struct("<8sHHIIIQ")
HEAD = FIXED.size + 8
ENTRY = struct.Struct("<QQ")
# version 2: magic, version, sections, header coding, then the u64 checksum of everything else
FIXED2 = struct.Struct("<8sHBBQ")
MAX_HEADER = 1 << 20
MAX_SECTIONS = 64
HEADER_KEYS = {"kind", "sections", "meta"}
RAW_HEADER = 0  # version 2 header coding: JSON as is
# zstd frames of the header: no magic, no checksum (the container's covers them), no dictionary id (the
# coding byte is it), the content size always written (the reader checks it before it allocates).  Level 9:
# on a Kodak image's 346-byte header 39 bytes in 11 us, as small as levels up to 22 (40 bytes, 35 us).
ZSTD_LEVEL = 9


@dataclass(frozen=True)
class Container:
    kind: str
    meta: dict[str, Any]
    sections: dict[str, memoryview] = field(default_factory=dict)
    header_bytes: int = 0  # the header's bytes as stored (what reports of a file's overhead count)
    version: int = VERSION  # the container version it was read from


@functools.lru_cache(maxsize=None)
def _zstd(coding: int) -> tuple[zstandard.ZstdCompressionDict, zstandard.ZstdCompressionParameters]:
    """A header coding's dictionary, digested once, and the frame parameters.  Compressors and decompressors
    are made per call: zstandard's are not safe for concurrent use, and the pipeline's threads pack and unpack."""
    params = zstandard.ZstdCompressionParameters.from_level(
        ZSTD_LEVEL, format=zstandard.FORMAT_ZSTD1_MAGICLESS, write_checksum=0, write_content_size=1, write_dict_id=0)
    d = zstandard.ZstdCompressionDict(DICTIONARIES[coding], dict_type=zstandard.DICT_TYPE_RAWCONTENT)
    d.precompute_compress(compression_params=params)
    return d, params


def _compress_header(raw: bytes, coding: int) -> bytes:
    d, params = _zstd(coding)
    return zstandard.ZstdCompressor(dict_data=d, compression_params=params).compress(raw)


def _decompress_header(stored: memoryview, coding: int) -> bytes:
    if coding not in DICTIONARIES:
        raise UnsupportedFormatError(f"container header coding {coding} (this build knows dictionaries "
                                     f"{sorted(DICTIONARIES)})")
    dctx = zstandard.ZstdDecompressor(dict_data=_zstd(coding)[0], format=zstandard.FORMAT_ZSTD1_MAGICLESS)
    data = bytes(stored)
    try:
        size = zstandard.get_frame_parameters(data, format=zstandard.FORMAT_ZSTD1_MAGICLESS).content_size
        if size > MAX_HEADER:  # the unknown size (2^64 - 1) included
            raise CorruptStreamError(f"container header claims {size} bytes, over the limit of {MAX_HEADER}")
        raw = dctx.decompress(data, max_output_size=MAX_HEADER, allow_extra_data=False)
    except zstandard.ZstdError as e:
        raise CorruptStreamError(f"container header is not a zstd frame with dictionary {coding}: {e}") from None
    if len(raw) != size:
        raise CorruptStreamError(f"container header decompressed to {len(raw)} bytes, its frame says {size}")
    return raw


def pack(kind: str, meta: dict[str, Any], sections: dict[str, bytes], version: int = VERSION) -> bytes:
    """A container of ``sections`` (in their order) with a header of ``kind`` and ``meta``; ``version`` 1
    writes the previous layout (for compatibility tests and fixtures)."""
    if version not in VERSIONS:
        raise UnsupportedFormatError(f"container version {version!r}: this build writes {list(VERSIONS)}")
    names = list(sections)
    if len(names) > MAX_SECTIONS:
        raise LimitExceededError(f"{len(names)} sections exceed the limit of {MAX_SECTIONS}")
    header = json.dumps({"kind": kind, "sections": names, "meta": meta}, separators=(",", ":"), allow_nan=False)
    hbytes = header.encode()
    if len(hbytes) > MAX_HEADER:
        raise LimitExceededError(f"container header of {len(hbytes)} bytes exceeds {MAX_HEADER}")
    bodies = [memoryview(sections[n]).cast("B") for n in names]
    if version == 2:
        return _pack2(hbytes, bodies)
    table = b"".join(ENTRY.pack(len(b), xxh64(b)) for b in bodies)
    total = HEAD + len(table) + len(hbytes) + sum(len(b) for b in bodies)
    fixed = FIXED.pack(MAGIC, 1, 0, len(hbytes), len(names), 0, total)
    return b"".join([fixed, struct.pack("<Q", xxh64(fixed, table, hbytes)), table, hbytes, *bodies])


def _pack2(hbytes: bytes, bodies: list[memoryview]) -> bytes:
    """Version 2: the header compressed with the newest dictionary where that is smaller, else as is."""
    coding = max(DICTIONARIES)
    stored = _compress_header(hbytes, coding)
    if len(stored) >= len(hbytes):
        coding, stored = RAW_HEADER, hbytes
    lengths = write_varints([len(stored), *(len(b) for b in bodies)])
    prefix = FIXED2.pack(MAGIC, 2, len(bodies), coding, 0)[:12]
    digest = xxh64(prefix, lengths, stored, *bodies)
    return b"".join([prefix, struct.pack("<Q", digest), lengths, stored, *bodies])


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


MAX_INT_DIGITS = 20  # a header integer is a size, count or version: 20 digits hold every u64


class _LongInt:
    """A JSON integer too long for any header field, kept as its digit count so the check can name its field
    (Python's int() refuses over 4300 digits with a bare ValueError, and a long one costs quadratic time)."""

    def __init__(self, text: str):
        self.digits = len(text.lstrip("-"))


def _parse_int(text: str):
    return int(text) if len(text) <= MAX_INT_DIGITS + 1 else _LongInt(text)


def _reject_constant(name: str):
    raise CorruptStreamError(f"container header holds the non-JSON constant {name}")


def _unique_keys(pairs: list) -> dict:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen = [k for k, _ in pairs]
        raise CorruptStreamError(f"container header repeats the key {next(k for k in seen if seen.count(k) > 1)!r}")
    return obj


def _check_values(value, path: str) -> None:
    """Every number of a header finite (JSON's 1e400 parses to inf) and every integer of a bounded size,
    else CorruptStreamError naming the field."""
    if isinstance(value, _LongInt):
        raise CorruptStreamError(f"container header field {path} holds an integer of {value.digits} digits")
    if isinstance(value, float) and not math.isfinite(value):
        raise CorruptStreamError(f"container header field {path} holds {value}, not a finite number")
    if isinstance(value, dict):
        for k, v in value.items():
            _check_values(v, f"{path}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _check_values(v, f"{path}[{i}]")


def _header(raw: memoryview) -> dict[str, Any]:
    try:
        obj = json.loads(bytes(raw).decode("utf-8"), parse_constant=_reject_constant, parse_int=_parse_int,
                         object_pairs_hook=_unique_keys)
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
    try:
        _check_values(obj["meta"], "meta")
    except RecursionError:
        raise CorruptStreamError("container header meta is nested too deeply") from None
    return obj


def unpack(buf) -> Container:
    mv, _ = read_prefix(buf, ".vsz container", FIXED2, FIXED2.size, MAGIC, VERSIONS)
    return _unpack2(mv) if FIXED2.unpack_from(mv)[1] == 2 else _unpack1(mv)


def _unpack2(mv: memoryview) -> Container:
    _, _, nsec, coding, stored = FIXED2.unpack_from(mv, 0)
    if nsec > MAX_SECTIONS:
        raise CorruptStreamError(f"container section count {nsec} is over the limit of {MAX_SECTIONS}")
    values, pos = read_varints(mv, FIXED2.size, nsec + 1, "container lengths")
    lengths = [int(n) for n in values]
    hlen = lengths[0]
    if hlen > MAX_HEADER:
        raise CorruptStreamError(f"container header length {hlen} is over the limit of {MAX_HEADER}")
    if pos + sum(lengths) != len(mv):
        raise CorruptStreamError(f"container lengths add up to {pos + sum(lengths)} bytes but {len(mv)} are present "
                                 f"(truncated or padded)")
    if xxh64(mv[:12], mv[FIXED2.size:]) != stored:
        raise CorruptStreamError("container checksum mismatch")
    raw = mv[pos:pos + hlen]
    header = _header(raw if coding == RAW_HEADER else memoryview(_decompress_header(raw, coding)))
    if len(header["sections"]) != nsec:
        raise CorruptStreamError(f"container header names {len(header['sections'])} sections, table has {nsec}")
    pos += hlen
    sections = {}
    for name, length in zip(header["sections"], lengths[1:]):
        sections[name] = mv[pos:pos + length]
        pos += length
    return Container(header["kind"], header["meta"], sections, hlen, 2)


def _unpack1(mv: memoryview) -> Container:
    if len(mv) < HEAD:
        raise CorruptStreamError(f".vsz container of {len(mv)} bytes is shorter than its {HEAD}-byte header")
    _, _, reserved, hlen, nsec, reserved2, total = FIXED.unpack_from(mv, 0)
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
    return Container(header["kind"], header["meta"], sections, hlen, 1)
