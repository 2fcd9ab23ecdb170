"""Damaged, truncated and hostile streams always raise VisemzError, quickly and in bounded memory."""

import struct
import tracemalloc

import numpy as np
import pytest

from visemz.encoders import decode_ints, encode_ints, reference, stream
from visemz.encoders import layout as L
from visemz.errors import CorruptStreamError, LimitExceededError, VisemzError

from .helpers import damaged_copies, make_ints

MAX_PEAK = 64 << 20  # bytes any rejected stream may make us allocate


def _decode_must_fail(buf):
    tracemalloc.start()
    try:
        with pytest.raises(VisemzError):
            decode_ints(buf)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < MAX_PEAK, f"rejecting a {len(buf)}-byte stream allocated {peak} bytes"


@pytest.fixture(scope="module", params=["none", "zstd"])
def small_stream(request):
    return encode_ints(make_ints("latent", 700, seed=5, scale=2.0), entropy=request.param)


@pytest.mark.timeout(120)
def test_every_single_bit_flip_is_caught(small_stream):
    data = bytearray(small_stream)
    for i in range(len(data) * 8):
        data[i // 8] ^= 1 << (i % 8)
        with pytest.raises(VisemzError):
            decode_ints(bytes(data))
        data[i // 8] ^= 1 << (i % 8)
    np.testing.assert_array_equal(decode_ints(bytes(data)), make_ints("latent", 700, seed=5, scale=2.0))


def test_every_truncation_is_caught(small_stream):
    for cut in range(len(small_stream)):
        with pytest.raises(VisemzError):
            decode_ints(small_stream[:cut])
    with pytest.raises(CorruptStreamError):
        decode_ints(small_stream + b"\0")


def test_random_bytes_are_rejected():
    rng = np.random.default_rng(11)
    for size in (0, 1, 31, 32, 33, 100, 10_000, 1 << 20):
        _decode_must_fail(rng.integers(0, 256, size, dtype=np.uint8).tobytes())
    # random bodies behind a valid magic and a recomputed checksum
    for size in (8, 500, 50_000):
        body = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
        prefix = stream.PREFIX.pack(stream.MAGIC, 1, 1, 0, size * 3, 4096, 1 + size // 4096)
        _decode_must_fail(prefix + struct.pack("<Q", stream.checksum(prefix, body)) + body)


def _reframe(raw: bytes) -> bytes:
    """Wrap a (hand-made) block stream with a valid checksum, as an attacker could."""
    return stream.pack(len(raw), 0, 0, [raw])


def test_header_claiming_a_trillion_values_is_refused():
    raw = bytearray(reference.encode(np.zeros(10, np.int32), 0, True))
    struct.pack_into("<Q", raw, 8, 10**12)
    _decode_must_fail(_reframe(bytes(raw)))
    with pytest.raises(LimitExceededError, match="1000000000000"):
        decode_ints(_reframe(bytes(raw)))
    # and the outer stream claiming a huge block stream
    prefix = stream.PREFIX.pack(stream.MAGIC, 1, 1, 0, 10**12, 1 << 20, 1)
    body = struct.pack("<I", 4) + b"\0" * 4
    with pytest.raises(LimitExceededError):
        decode_ints(prefix + struct.pack("<Q", stream.checksum(prefix, body)) + body)


@pytest.mark.parametrize("policy", [0, 1])
def test_inconsistent_block_streams_with_valid_checksums(policy):
    """Every single-byte change inside the block stream, re-checksummed, decodes or fails cleanly."""
    raw = reference.encode(make_ints("heavy", 3000, seed=2, scale=0.2), policy, True)
    for _, damaged in damaged_copies(raw, seed=policy):
        try:
            assert decode_ints(_reframe(damaged)).dtype == np.int32
        except VisemzError:
            pass


def test_flags_past_the_end_are_rejected():
    raw = bytearray(reference.encode(np.ones(65, np.int32), 0, True))
    raw[L.meta_offset(65)] |= 0b11110000  # blocks 2 and 3 do not exist
    with pytest.raises(CorruptStreamError):
        decode_ints(_reframe(bytes(raw)))
