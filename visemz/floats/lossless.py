"""The lossless float codec: ``Lossless()``, ZipCCL-style exponent coding.

The exponent field of each value becomes a 3-bit code when it is one of the 7 most frequent
exponents, else code 7 plus an entry in an escape list; sign and mantissa bits are kept raw at a
fixed stride.  CUDA tensors and cupy arrays are encoded on the GPU (``gpu.py``) into the same bytes;
``encode_device`` / ``decode_device`` keep the compressed form in device memory for NCCL.

It follows numcodecs' Codec shape: ``codec_id``, ``encode``/``decode``, ``get_config``/``from_config``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from .. import cuda
from ..encoders import decode_ints, encode_ints
from ..errors import CorruptStreamError
from ..framing import read_prefix
from . import checksum, gpu
from .dtypes import CODES, FLOATS, as_array, check_float

# version 1: no checksum (the device wire form keeps its layout); 2 (written today): a checksum after the header
LL_MAGIC, LL_VERSION = b"VZLL", 2
LL_HEAD = struct.Struct("<4sBB7sQ")  # magic, version, dtype code, top-7 exponents, n
LL_TABLE = 32  # four u64 part lengths after the header (version 2: after the checksum)
ESCAPE = 7


@dataclass(frozen=True)
class Lossless:
    """Exact coding of float tensors: 3-bit exponent codes + escapes, raw sign and mantissa."""

    codec_id: str = "visemz-lossless"

    def encode(self, x) -> bytes:
        if cuda.is_gpu_array(x):
            wire, _name = gpu.ll_encode(x, FLOATS, self._head)
            return self._seal(gpu.ll_bytes(wire.get().tobytes(), LL_HEAD.size + LL_TABLE))
        a, name = as_array(x)
        check_float(name)
        bits, ebits, mbits, utype = FLOATS[name]
        u = a.reshape(-1).view(utype) if a.dtype != utype else a.reshape(-1)
        exp = ((u >> mbits) & ((1 << ebits) - 1)).astype(np.uint32)  # up to 8 bits
        rest = ((u >> (mbits + ebits)) << mbits) | (u & ((1 << mbits) - 1))  # sign then mantissa, 1 + mbits bits
        counts = np.bincount(exp, minlength=256)
        top = np.argsort(-counts, kind="stable")[:7]
        lut = np.full(256, ESCAPE, np.uint8)
        lut[top] = np.arange(7, dtype=np.uint8)
        codes = lut[exp]
        esc = np.flatnonzero(codes == ESCAPE)
        packed = _pack3(codes)
        rest_bytes = _pack_fixed(rest.astype(np.uint32), 1 + mbits)
        gaps = np.diff(esc, prepend=0).astype(np.int32) if esc.size else np.zeros(0, np.int32)
        parts = [packed, rest_bytes, encode_ints(gaps, policy="global", entropy="none"),
                 exp[esc].astype(np.uint8).tobytes()]
        table = struct.pack(f"<{len(parts)}Q", *(len(p) for p in parts))
        return self._seal(self._head(name, bytes(top.astype(np.uint8)), u.size) + table + b"".join(parts))

    @staticmethod
    def _head(name: str, top: bytes, n: int) -> bytes:
        """The fixed header of version 1, as the device wire form carries it."""
        return LL_HEAD.pack(LL_MAGIC, 1, CODES[name], top, n)

    @staticmethod
    def _seal(v1: bytes) -> bytes:
        """Version-1 bytes (CPU- or GPU-made alike) -> the version-2 stream: version 2 in the header, then the
        checksum of every other byte, then the rest as it was."""
        head = v1[:4] + bytes([LL_VERSION]) + v1[5:LL_HEAD.size]
        rest = v1[LL_HEAD.size:]
        return head + checksum.compute(head, rest) + rest

    def encode_device(self, x):
        """CUDA tensor / cupy array -> (device buffer, dtype name).  The buffer is this format with the
        escape gaps as a raw block stream instead of a checksummed ints stream (for NCCL only)."""
        return gpu.ll_encode(x, FLOATS, self._head)

    def decode_device(self, buf, n: int, dtype: str):
        """Device buffer from ``encode_device`` -> float64 cupy array of the ``n`` exact values."""
        return gpu.bits_to_float64(gpu.ll_decode_wire(buf, n, dtype, FLOATS, LL_HEAD), dtype)

    def decode(self, buf, count: int | None = None) -> np.ndarray:
        """Bytes (version 1 or 2) -> the flat values (bf16 as its uint16 bit patterns); ``count``: the number
        of values the caller expects, held to the stream's before anything is allocated."""
        what = "lossless stream"
        mv, (code, top, n) = read_prefix(buf, what, LL_HEAD, LL_HEAD.size, LL_MAGIC, (1, LL_VERSION))
        pos = LL_HEAD.size
        if mv[4] == LL_VERSION:
            checksum.verify(mv, pos, what)
            pos += 8
        if len(mv) < pos + LL_TABLE:
            raise CorruptStreamError(f"{what} of {len(mv)} bytes is shorter than its {pos + LL_TABLE}-byte header")
        if code >= len(FLOATS):
            raise CorruptStreamError(f"lossless stream dtype code {code} is unknown")
        if count is not None and n != count:
            raise CorruptStreamError(f"lossless stream holds {n} values where {count} are expected")
        name = list(FLOATS)[code]
        bits, ebits, mbits, utype = FLOATS[name]
        sizes = struct.unpack_from("<4Q", mv, pos)
        rest_len = (n * (1 + mbits) + 7) // 8
        pos += LL_TABLE
        # every part's size fits the buffer before anything is allocated: n is at most 8/3 values a byte
        if sizes[0] != (3 * n + 7) // 8 or sizes[1] != rest_len or pos + sum(sizes) != len(mv) or sizes[3] > n:
            raise CorruptStreamError(f"lossless stream sizes {sizes} do not fit {n} values of {name}")
        codes = _unpack3(np.frombuffer(mv, np.uint8, sizes[0], pos), n)
        want = np.flatnonzero(codes == ESCAPE)
        gaps = decode_ints(mv[pos + sizes[0] + sizes[1] : pos + sizes[0] + sizes[1] + sizes[2]], count=want.size,
                           entropy="none")
        esc = np.cumsum(gaps.astype(np.int64))
        rest = _unpack_fixed(np.frombuffer(mv, np.uint8, sizes[1], pos + sizes[0]), 1 + mbits, n)
        raw_exp = np.frombuffer(mv, np.uint8, sizes[3], pos + sizes[0] + sizes[1] + sizes[2])
        if raw_exp.size != esc.size or not np.array_equal(esc, want):
            raise CorruptStreamError("lossless stream escape list disagrees with its codes")
        table = np.frombuffer(bytes(top), np.uint8).astype(np.uint32)
        exp = table[np.minimum(codes, 6)]
        exp[want] = raw_exp
        if ebits < 8 and np.any(exp >> ebits):
            raise CorruptStreamError(f"lossless stream exponent exceeds {ebits} bits")
        sign = rest >> mbits
        u = (sign << (ebits + mbits)) | (exp << mbits) | (rest & ((1 << mbits) - 1))
        return u.astype(utype) if name == "bfloat16" else u.astype(utype).view(name)

    def get_config(self) -> dict:
        return {"id": self.codec_id}

    @classmethod
    def from_config(cls, config: dict) -> "Lossless":
        return cls()


def _pack_fixed(v: np.ndarray, nbits: int) -> bytes:
    """Values of ``nbits`` bits each, packed LSB first at a fixed stride of nbits."""
    if nbits % 8 == 0:  # byte-aligned widths (bf16: 8, fp32: 24) skip the bit matrix
        return v.astype("<u4").view(np.uint8).reshape(-1, 4)[:, : nbits // 8].tobytes()
    bits = ((v[:, None] >> np.arange(nbits, dtype=np.uint32)) & 1).astype(np.uint8)
    return np.packbits(bits.reshape(-1), bitorder="little").tobytes()


def _unpack_fixed(b: np.ndarray, nbits: int, n: int) -> np.ndarray:
    if nbits % 8 == 0:
        out = np.zeros((n, 4), np.uint8)
        out[:, : nbits // 8] = b.reshape(n, nbits // 8)
        return out.view("<u4").reshape(-1).astype(np.uint32)
    bits = np.unpackbits(b, bitorder="little")[: n * nbits].reshape(n, nbits).astype(np.uint32)
    return (bits << np.arange(nbits, dtype=np.uint32)).sum(1, dtype=np.uint64).astype(np.uint32)


def _pack3(codes: np.ndarray) -> bytes:
    return _pack_fixed(codes.astype(np.uint32), 3)


def _unpack3(b: np.ndarray, n: int) -> np.ndarray:
    return _unpack_fixed(b, 3, n).astype(np.uint8)
