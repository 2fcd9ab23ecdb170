import json
import struct
from pathlib import Path

import numpy as np
import pytest
import xxhash
import zstandard

from visemz import container as C
from visemz.errors import CorruptStreamError, LimitExceededError, UnsupportedFormatError, VisemzError
from visemz.framing import write_varints
from visemz.header_dictionary import DICTIONARIES

# what a dictionary's bytes must stay forever: files name it by number (docs/FORMAT.md, section 3)
DICTIONARY_XXH64 = {1: "3d67dec384d0c3fc"}
IMAGE_META = {"format": 5, "model": "mbt2018-mean-rgb", "model_id": "68c1431dce83918a", "quality": 3.0,
              "dtype": "uint8", "shape": [512, 768, 3], "range": [0.0, 255.0], "max_error": None, "residual": None,
              "entropy": "zstd",
              "tiles": {"size": 4096, "halo": [32, 16], "grid": [1, 1], "parts": ["y", "y_scales", "z"],
                        "symbols": ["y", "z"]}}


def _sample(version: int = C.VERSION) -> bytes:
    return C.pack("image", {"shape": [3, 4], "dtype": "uint8"}, {"y": b"\x01\x02\x03" * 50, "z": b"", "r": b"abc"},
                  version)


@pytest.mark.parametrize("version", C.VERSIONS)
def test_roundtrip(version):
    c = C.unpack(_sample(version))
    assert c.kind == "image" and c.meta == {"shape": [3, 4], "dtype": "uint8"} and c.version == version
    assert [bytes(c.sections[k]) for k in ("y", "z", "r")] == [b"\x01\x02\x03" * 50, b"", b"abc"]


@pytest.mark.parametrize("version", C.VERSIONS)
def test_every_bit_flip_and_truncation_is_caught(version):
    data = bytearray(_sample(version))
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
    good = bytearray(_sample(1))
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
    for n in (0, 10, 20, 21, 40, 41, 1000):
        with pytest.raises(VisemzError):
            C.unpack(rng.integers(0, 256, n, dtype=np.uint8).tobytes())
    with pytest.raises(UnsupportedFormatError):
        C.unpack(12345)


# ------------------------------------------------------------------ version 2
def write_varint(v: int) -> bytes:
    return write_varints([v])


def _rebuild2(stored: bytes, sections: list[bytes], coding: int = 1, lengths: bytes | None = None, nsec=None) -> bytes:
    """A version-2 container with a given stored header (and, if given, raw length bytes) and a valid checksum."""
    if lengths is None:
        lengths = write_varints([len(stored), *map(len, sections)])
    prefix = C.MAGIC + struct.pack("<HBB", 2, len(sections) if nsec is None else nsec, coding)
    h = xxhash.xxh64()
    for p in (prefix, lengths, stored, *sections):
        h.update(p)
    return prefix + struct.pack("<Q", h.intdigest()) + lengths + stored + b"".join(sections)


def _compressed(header: dict) -> bytes:
    return C._compress_header(json.dumps(header, separators=(",", ":")).encode(), 1)


def test_dictionaries_never_change():
    assert {k: xxhash.xxh64(v).hexdigest() for k, v in DICTIONARIES.items()} == DICTIONARY_XXH64


def test_an_image_header_compresses_to_a_fraction():
    buf = C.pack("image", IMAGE_META, {"tile_index": b"", "tiles": b""})
    raw = len(json.dumps({"kind": "image", "sections": ["tile_index", "tiles"], "meta": IMAGE_META},
                         separators=(",", ":")))
    c = C.unpack(buf)
    assert c.meta == IMAGE_META and buf[11] == 1 and c.header_bytes < raw / 4
    assert len(buf) == 20 + 3 + c.header_bytes  # three one-byte lengths: the header's and two empty sections'


def test_a_header_that_does_not_shrink_is_stored_as_it_is(monkeypatch):
    monkeypatch.setattr(C, "_compress_header", lambda raw, coding: raw + b"!")  # as zstd does on a tiny header
    buf = C.pack("x", {"a": 1}, {"a": b"1"})
    assert buf[11] == C.RAW_HEADER and C.unpack(buf).meta == {"a": 1}
    assert C.unpack(_rebuild2(b'{"kind":"x","sections":[],"meta":{}}', [], coding=C.RAW_HEADER)).kind == "x"


def test_version_2_damage_behind_a_valid_checksum_is_named():
    good = _compressed({"kind": "x", "sections": ["a"], "meta": {}})
    assert C.unpack(_rebuild2(good, [b"abc"])).kind == "x"
    with pytest.raises(UnsupportedFormatError, match="coding 9"):
        C.unpack(_rebuild2(good, [b"abc"], coding=9))
    with pytest.raises(CorruptStreamError, match="zstd frame"):
        C.unpack(_rebuild2(good[:-2] + bytes([good[-2] ^ 0x55, good[-1]]), [b"abc"]))
    with pytest.raises(CorruptStreamError, match="container header"):
        C.unpack(_rebuild2(b"\xc0" + bytes(range(40)), [b"abc"]))
    with pytest.raises(CorruptStreamError, match="not valid JSON"):
        C.unpack(_rebuild2(b"{nope", [b"abc"], coding=C.RAW_HEADER))
    with pytest.raises(CorruptStreamError, match="names 1 sections, table has 2"):
        C.unpack(_rebuild2(good, [b"abc", b"d"]))
    with pytest.raises(CorruptStreamError, match="distinct"):
        C.unpack(_rebuild2(_compressed({"kind": "x", "sections": ["a", "a"], "meta": {}}), [b"1", b"2"]))


def test_version_2_sizes_are_checked_before_allocation():
    good = _compressed({"kind": "x", "sections": ["a"], "meta": {}})
    huge = write_varint(10**15)
    with pytest.raises(CorruptStreamError, match="over the limit"):  # header length
        C.unpack(_rebuild2(good, [b"abc"], lengths=huge + write_varint(3)))
    with pytest.raises(CorruptStreamError, match="add up"):  # a section length
        C.unpack(_rebuild2(good, [b"abc"], lengths=write_varint(len(good)) + huge))
    with pytest.raises(CorruptStreamError, match="not minimal"):
        C.unpack(_rebuild2(good, [b"abc"], lengths=write_varint(len(good)) + b"\x83\x00"))
    with pytest.raises(CorruptStreamError, match="longer than 10"):
        C.unpack(_rebuild2(good, [b"abc"], lengths=b"\xff" * 11 + b"\x01"))
    with pytest.raises(CorruptStreamError, match="section count"):
        C.unpack(_rebuild2(good, [b"abc"], nsec=200))
    # a frame that claims a header over 1 MiB is refused before it is decompressed
    big = json.dumps({"kind": "x", "sections": [], "meta": {"pad": "a" * (C.MAX_HEADER + 10)}}).encode()
    frame = zstandard.ZstdCompressor(dict_data=C._zstd(1)[0], compression_params=zstandard.ZstdCompressionParameters(
        format=zstandard.FORMAT_ZSTD1_MAGICLESS, write_content_size=1, write_dict_id=0)).compress(big)
    with pytest.raises(CorruptStreamError, match="over the limit of 1048576"):
        C.unpack(_rebuild2(frame, []))
    # and one without a content size (a writer of version 2 always writes it)
    frame = zstandard.ZstdCompressor(dict_data=C._zstd(1)[0], compression_params=zstandard.ZstdCompressionParameters(
        format=zstandard.FORMAT_ZSTD1_MAGICLESS, write_content_size=0, write_dict_id=0)).compress(b"{}")
    with pytest.raises(CorruptStreamError, match="over the limit"):
        C.unpack(_rebuild2(frame, []))


def test_writing_an_unknown_version_is_refused():
    with pytest.raises(UnsupportedFormatError, match="version 3"):
        C.pack("x", {}, {}, version=3)


def test_format_md_holds_dictionary_1_byte_for_byte():
    text = (Path(__file__).resolve().parents[1] / "docs" / "FORMAT.md").read_text()
    block = text.split("Dictionary 1, ASCII", 1)[1].split("```\n", 2)[1]
    assert "".join(block.splitlines()).encode() == DICTIONARIES[1]


@pytest.mark.parametrize("top", [1, 127, 128, 1 << 14, 1 << 35, 1 << 63])
@pytest.mark.parametrize("n", [0, 1, 31, 32, 33, 200])
def test_varints_small_and_large_paths_write_the_same_bytes(monkeypatch, n, top):
    """write_varints loops in Python for a few values and vectorises for many: both are LEB128, read back alike."""
    from visemz import framing

    v = np.random.default_rng(n).integers(0, top, n, dtype=np.uint64, endpoint=True)
    got = framing.write_varints(v)
    monkeypatch.setattr(framing, "_SMALL", -1)
    assert framing.write_varints(v) == got
    monkeypatch.setattr(framing, "_SMALL", 1 << 20)
    assert framing.write_varints(v) == got
    values, end = framing.read_varints(memoryview(got), 0, n, "test")
    np.testing.assert_array_equal(values, v)
    assert end == len(got)


def test_varints_small_and_large_readers_agree_on_any_bytes(monkeypatch):
    """read_varints' Python loop (a few values) and its vectorised path: the same values and end, or both
    CorruptStreamError, on valid and on random bytes."""
    from visemz import framing

    rng = np.random.default_rng(7)

    def read(buf, count, max_bytes, small):
        monkeypatch.setattr(framing, "_SMALL", 1 << 20 if small else -1)
        try:
            values, end = framing.read_varints(memoryview(buf), 1, count, "test", max_bytes)
            return values.tolist(), end
        except CorruptStreamError:
            return "corrupt"

    for trial in range(400):
        if trial % 2:
            buf = bytes(rng.integers(0, 256, int(rng.integers(1, 40)), dtype=np.uint8))
        else:
            buf = b"\x00" + write_varints(rng.integers(0, 1 << int(rng.integers(1, 64)), int(rng.integers(1, 12)),
                                                       dtype=np.uint64))
        for count in (1, 3, 8):
            for max_bytes in (5, 10):
                assert read(buf, count, max_bytes, True) == read(buf, count, max_bytes, False), (buf, count, max_bytes)
