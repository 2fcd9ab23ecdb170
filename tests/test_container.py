import json
import struct

import numpy as np
import pytest
import xxhash

from visemz import container as C
from visemz.errors import CorruptStreamError, LimitExceededError, UnsupportedFormatError, VisemzError


def _sample() -> bytes:
    return C.pack("image", {"shape": [3, 4], "dtype": "uint8"}, {"y": b"\x01\x02\x03" * 50, "z": b"", "r": b"abc"})


def test_roundtrip():
    c = C.unpack(_sample())
    assert c.kind == "image" and c.meta == {"shape": [3, 4], "dtype": "uint8"}
    assert [bytes(c.sections[k]) for k in ("y", "z", "r")] == [b"\x01\x02\x03" * 50, b"", b"abc"]


def test_every_bit_flip_and_truncation_is_caught():
    data = bytearray(_sample())
    for i in range(len(data) * 8):
        data[i // 8] ^= 1 << (i % 8)
        with pytest.raises(VisemzError):
            C.unpack(bytes(data))
        data[i // 8] ^= 1 << (i % 8)
    for cut in range(len(data)):
        with pytest.raises(CorruptStreamError):
            C.unpack(bytes(data[:cut]))


def _rebuild(header: dict, sections: list[bytes], version=1, nsec=None) -> bytes:
    """A container written with arbitrary header contents and valid checksums."""
    hbytes = json.dumps(header).encode()
    table = b"".join(struct.pack("<QQ", len(s), xxhash.xxh64(s).intdigest()) for s in sections)
    total = C.HEAD + len(table) + len(hbytes) + sum(map(len, sections))
    fixed = C.FIXED.pack(C.MAGIC, version, 0, len(hbytes), len(sections) if nsec is None else nsec, 0, total)
    h = xxhash.xxh64()
    for p in (fixed, table, hbytes):
        h.update(p)
    return fixed + struct.pack("<Q", h.intdigest()) + table + hbytes + b"".join(sections)


def test_unknown_version_and_fields_are_named():
    with pytest.raises(UnsupportedFormatError, match="version 7"):
        C.unpack(_rebuild({"kind": "x", "sections": [], "meta": {}}, [], version=7))
    with pytest.raises(UnsupportedFormatError, match="colour"):
        C.unpack(_rebuild({"kind": "x", "sections": [], "meta": {}, "colour": 1}, []))
    with pytest.raises(CorruptStreamError, match="distinct"):
        C.unpack(_rebuild({"kind": "x", "sections": ["a", "a"], "meta": {}}, [b"1", b"2"]))


def test_sizes_are_checked_before_allocation():
    with pytest.raises(CorruptStreamError):
        C.unpack(_rebuild({"kind": "x", "sections": [], "meta": {}}, [], nsec=10**9 % (1 << 32)))
    good = bytearray(_sample())
    struct.pack_into("<Q", good, 24, 10**12)
    with pytest.raises(CorruptStreamError, match="1000000000000"):
        C.unpack(bytes(good))


def test_limits_on_writing():
    with pytest.raises(LimitExceededError):
        C.pack("x", {}, {str(i): b"" for i in range(C.MAX_SECTIONS + 1)})
    with pytest.raises(LimitExceededError):
        C.pack("x", {"pad": "a" * C.MAX_HEADER}, {})


def test_random_bytes_and_non_bytes():
    rng = np.random.default_rng(0)
    for n in (0, 10, 40, 41, 1000):
        with pytest.raises(VisemzError):
            C.unpack(rng.integers(0, 256, n, dtype=np.uint8).tobytes())
    with pytest.raises(UnsupportedFormatError):
        C.unpack(12345)
