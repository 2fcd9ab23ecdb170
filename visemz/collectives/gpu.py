"""The collectives' float codecs on the GPU: everything stays in device memory.

Byte for byte the same as the NumPy path in ``codecs.py`` (tests/test_collectives_gpu.py):

- error-bounded: q = rint(float64(x) / (2 eb)) with cupy (IEEE division and round-half-even,
  exactly NumPy's; torch is avoided here because it divides by a host scalar as a multiply by
  its reciprocal), then the shared block encoder's per-block kernel;
- homomorphic add: ``block_add`` in ``encoders/cuda/block.cu``, one fused kernel;
- lossless: the exponent histogram, top-7 table and 3-bit codes vectorised in cupy; the escape
  gaps go through the shared encoder's global-width kernel.

Device-resident forms (what the NCCL collectives move) carry no checksum: NCCL delivers bytes
intact, the ranks agree on every setting first, and the kernels still check each stream's
structure.  The ``bytes`` forms (``ErrorBounded.encode`` etc.) add the ints stream's checksum
on the host.  cupy runs on torch's current stream, so torch, cupy and NCCL work stays ordered.
"""

from __future__ import annotations

import contextlib
import struct
from dataclasses import dataclass

import numpy as np

from .. import device as dev
from ..encoders import entropy as E
from ..encoders import gpu as G
from ..encoders import layout as L
from ..encoders import stream
from ..config import DEFAULTS
from ..errors import CorruptStreamError, InvalidArgumentError, LimitExceededError, UnsupportedFormatError, VisemzError

BLOCK = L.POLICIES["block"]
GLOBAL = L.POLICIES["global"]
_TORCH_FLOATS = {"float32": "float32", "float16": "float16", "bfloat16": "bfloat16"}


@contextlib.contextmanager
def torch_stream():
    """Run cupy work on torch's current CUDA stream (so NCCL and torch ops see it in order)."""
    cp = dev.require_cupy()
    import torch

    s = torch.cuda.current_stream()
    with cp.cuda.Device(s.device.index), cp.cuda.ExternalStream(s.cuda_stream):
        yield cp


def float_bits(x) -> tuple[object, str]:
    """A flat cupy view of a CUDA float tensor or cupy array and its dtype name (bf16 as uint16 bits)."""
    cp = dev.require_cupy()
    if hasattr(x, "detach"):  # torch CUDA tensor
        import torch

        name = str(x.dtype).replace("torch.", "")
        if name not in _TORCH_FLOATS:
            raise UnsupportedFormatError(f"dtype {name} is not a float the collectives codecs take")
        t = x.detach().contiguous().reshape(-1)
        if name == "bfloat16":
            return cp.asarray(t.view(torch.int16)).view(cp.uint16), name
        return cp.asarray(t), name
    a = cp.ascontiguousarray(dev.as_cupy(x)).reshape(-1)
    if a.dtype.name not in ("float32", "float16"):
        raise UnsupportedFormatError(f"dtype {a.dtype.name} is not a float the collectives codecs take")
    return a, a.dtype.name


def to_float64(a, name: str):
    cp = dev.require_cupy()
    if name == "bfloat16":
        return (a.astype(cp.uint32) << 16).view(cp.float32).astype(cp.float64)
    return a.astype(cp.float64)


# --------------------------------------------------------------- error-bounded
@dataclass(frozen=True)
class DeviceStream:
    """A block stream in device memory: ``data`` (uint8, capacity >= size), its byte count on the device."""

    data: object  # cupy uint8
    size: object  # cupy uint64, shape (1,)
    n: int

    def nbytes(self) -> int:
        """The stream's length (one small device-to-host read)."""
        return int(self.size.get()[0])

    def bytes_view(self):
        return self.data[: self.nbytes()]


def quantize(v64, eb: float):
    """float64 values on the device -> int32 steps of 2 eb, exactly NumPy's ``rint(v / (2 eb))``."""
    cp = dev.require_cupy()
    q = cp.rint(v64 / cp.float64(2 * eb))
    if q.size:
        m = float(cp.abs(q).max())  # NaN and Inf propagate into the maximum: one host read checks all
        if not np.isfinite(m):
            raise InvalidArgumentError("tensor holds NaN or Inf: error-bounded compression needs finite values")
        if m >= 2**31 - 1:
            raise LimitExceededError(
                f"values up to {float(cp.abs(v64).max()):.3g} need more than int32 steps of 2*eb={2 * eb:g}")
    return q.astype(cp.int32)


def encode_symbols(q) -> DeviceStream:
    """int32 symbols on the device -> their per-block, bitshuffled block stream (no host sync)."""
    L.check_count(q.size)
    data, size = G.encode_block_stream(q, BLOCK, True)
    return DeviceStream(data, size, int(q.size))


def eb_encode(x, eb: float) -> tuple[DeviceStream, str]:
    with torch_stream():
        a, name = float_bits(x)
        return encode_symbols(quantize(to_float64(a, name), eb)), name


def eb_symbols(s: DeviceStream):
    """Device stream -> int32 symbols on the device (reads the 24-byte header and an error word)."""
    with torch_stream():
        out = G.decode_block_stream(s.bytes_view())
    if out.size != s.n:
        raise CorruptStreamError(f"device stream holds {out.size} values, expected {s.n}")
    return out


def eb_values(s: DeviceStream, eb: float):
    """Exact reconstruction 2 eb q as float64 on the device (NumPy's ``q * (2 eb)``)."""
    cp = dev.require_cupy()
    with torch_stream():
        return eb_symbols(s).astype(cp.float64) * (2 * eb)


def stream_bytes(s: DeviceStream) -> bytes:
    """The ints stream (entropy none) of a device block stream: what ``encode_ints`` writes on the CPU."""
    with torch_stream():
        raw = s.bytes_view().get().tobytes()
    return stream.pack(len(raw), E.KINDS["none"], DEFAULTS.entropy_chunk, [raw])


class _AddCells:
    """Per-(device, stream) result cells of block_add: [stream size, error word]."""

    def __init__(self, cp):
        self.cells = cp.zeros(2, cp.uint64)


_CELLS: dict = {}


def _cells(cp):
    key = (cp.cuda.Device().id, cp.cuda.get_current_stream().ptr)
    if key not in _CELLS:
        _CELLS[key] = _AddCells(cp)
    return _CELLS[key].cells


ADD_ERRORS = {1: "tile table", 2: "block width over 32", 4: "tile size", 64: "sum leaves int32", 128: "header"}


def add(a: DeviceStream, b: DeviceStream, inplace: bool = False) -> DeviceStream:
    """Homomorphic sum of two device streams with the fused ``block_add`` kernel.

    ``inplace=True`` leaves the sum in ``a.data``: the kernel writes a scratch stream (its tiles
    move, so writing over an input other thread blocks still read would corrupt it) and a
    sized copy on the same stream moves it back; ``a.data`` must hold the worst case, which
    ``encode_symbols`` and the transport's receive buffers allocate.
    Raises like the NumPy ``homomorphic.add``: a sum that leaves int32 is LimitExceededError.
    """
    if a.n != b.n:
        raise InvalidArgumentError(f"cannot add a {a.n}-value stream to a {b.n}-value stream")
    cap = L.max_stream_size(BLOCK, a.n)
    if inplace and a.data.size < cap:
        raise LimitExceededError(f"in-place add needs a {cap}-byte buffer, the stream has {a.data.size}")
    with torch_stream() as cp:
        sa, sb = a.bytes_view(), b.bytes_view()
        n, ntiles = a.n, L.n_tiles(a.n)
        out = cp.empty(cap, cp.uint8)
        if n == 0:
            out[: L.HEADER_SIZE] = cp.asarray(np.frombuffer(L.Header(BLOCK, True, 0, 0, 0, 0).pack(), np.uint8))
            size = cp.asarray([L.HEADER_SIZE], cp.uint64)
        else:
            status, _stats, _size, counter = G._workspace(cp.cuda.Device().id, cp.cuda.get_current_stream().ptr).reset(ntiles)
            cells = _cells(cp)
            cells.fill(0)
            G.kernel("block_add")((ntiles,), (G.THREADS,), (
                sa, np.int64(sa.size), sb, np.int64(sb.size), np.int64(n), np.int32(1), out, status, counter,
                cells[0:1], cells[1:2].view(cp.int32)))
            size_word, err = (int(v) for v in cells.get())  # one read: size and error bits
            if err & 64:
                raise LimitExceededError("the sum leaves int32: use a larger error bound for this many additions")
            if err:
                raise CorruptStreamError("homomorphic add input is inconsistent: " + ", ".join(
                    w for bit, w in ADD_ERRORS.items() if err & bit))
            if size_word > cap:
                raise VisemzError(f"GPU homomorphic add failed (reported size {size_word:#x})")
            size = cells[0:1].copy()
        if not inplace:
            return DeviceStream(out, size, n)
        G.kernel("copy_sized")((min(-(-cap // G.THREADS), 4096),), (G.THREADS,), (out, a.data, size, np.int64(cap)))
        return DeviceStream(a.data, size, n)


# ------------------------------------------------------------------- lossless
def _pack3(codes):
    """3-bit codes, LSB first: every 8 codes fill 3 bytes (NumPy's packbits order)."""
    cp = dev.require_cupy()
    n = codes.size
    c = cp.zeros(-(-n // 8) * 8, cp.uint32)
    c[:n] = codes
    c = c.reshape(-1, 8)
    word = c[:, 0]
    for k in range(1, 8):
        word = word | (c[:, k] << (3 * k))
    out = cp.stack([word & 255, (word >> 8) & 255, word >> 16], axis=1).astype(cp.uint8).reshape(-1)
    return out[: (3 * n + 7) // 8]


def _unpack3(b, n: int):
    cp = dev.require_cupy()
    pad = cp.zeros(-(-b.size // 3) * 3, cp.uint32)
    pad[: b.size] = b
    t = pad.reshape(-1, 3)
    word = t[:, 0] | (t[:, 1] << 8) | (t[:, 2] << 16)
    return ((word[:, None] >> (3 * cp.arange(8, dtype=cp.uint32))) & 7).reshape(-1)[:n].astype(cp.uint8)


def _pack_fixed(v, nbits: int):
    """Same bytes as codecs._pack_fixed (nbits-bit values LSB first at a fixed stride)."""
    cp = dev.require_cupy()
    if nbits % 8 == 0:
        return v.astype(cp.uint32).view(cp.uint8).reshape(-1, 4)[:, : nbits // 8].reshape(-1)
    bits = ((v[:, None] >> cp.arange(nbits, dtype=cp.uint32)) & 1).astype(cp.uint8).reshape(-1)
    pad = cp.zeros(-(-bits.size // 8) * 8, cp.uint8)
    pad[: bits.size] = bits
    return (pad.reshape(-1, 8) << cp.arange(8, dtype=cp.uint8)).sum(1, dtype=cp.uint8)


def _unpack_fixed(b, nbits: int, n: int):
    cp = dev.require_cupy()
    if nbits % 8 == 0:
        out = cp.zeros((n, 4), cp.uint8)
        out[:, : nbits // 8] = b.reshape(n, nbits // 8)
        return out.view(cp.uint32).reshape(-1)
    bits = ((b[:, None] >> cp.arange(8, dtype=cp.uint8)) & 1).reshape(-1)[: n * nbits].reshape(n, nbits)
    return (bits.astype(cp.uint32) << cp.arange(nbits, dtype=cp.uint32)).sum(1, dtype=cp.uint32)


@dataclass(frozen=True)
class LosslessParts:
    """A lossless encoding in device memory: the 7-exponent table and the four sections."""

    name: str
    n: int
    top: bytes
    codes: object  # packed 3-bit codes
    rest: object  # sign + mantissa at a fixed stride
    gaps: object  # escape positions as gaps: a global-width block stream
    exps: object  # the escaped exponents, one byte each


def ll_encode(x, floats: dict) -> LosslessParts:
    """ZipCCL exponent coding on the device; reads 7 table bytes and the escape count."""
    with torch_stream() as cp:
        u, name = float_bits(x)
        bits, ebits, mbits, _ = floats[name]
        u = u.view(cp.uint32 if bits == 32 else cp.uint16).astype(cp.uint32)
        exp = (u >> mbits) & ((1 << ebits) - 1)
        rest = ((u >> (mbits + ebits)) << mbits) | (u & ((1 << mbits) - 1))
        counts = cp.bincount(exp.astype(cp.int32), minlength=256).astype(cp.int64)
        # NumPy's stable argsort of -counts: most frequent first, ties to the smaller exponent
        top = cp.argsort(-(counts * 256 + (255 - cp.arange(256))))[:7]
        lut = cp.full(256, 7, cp.uint8)
        lut[top] = cp.arange(7, dtype=cp.uint8)
        codes = lut[exp]
        esc = cp.flatnonzero(codes == 7)
        gaps = cp.diff(esc, prepend=0).astype(cp.int32) if esc.size else cp.zeros(0, cp.int32)
        return LosslessParts(name, int(u.size), bytes(top.astype(cp.uint8).get()), _pack3(codes),
                             _pack_fixed(rest, 1 + mbits), G.encode_raw(gaps, GLOBAL, True), exp[esc].astype(cp.uint8))


def ll_sections(p: LosslessParts, wire: bool) -> list:
    """The four sections; ``wire`` keeps the gaps a raw block stream, else an ints stream (the bytes form)."""
    cp = dev.require_cupy()
    if wire:
        return [p.codes, p.rest, p.gaps, p.exps]
    gaps = p.gaps.get().tobytes()
    packed = stream.pack(len(gaps), E.KINDS["none"], DEFAULTS.entropy_chunk, [gaps])
    return [p.codes, p.rest, cp.asarray(np.frombuffer(packed, np.uint8)), p.exps]


def ll_join(p: LosslessParts, head, wire: bool):
    """Header + size table + sections as one device buffer (``head`` packs the fixed header)."""
    cp = dev.require_cupy()
    with torch_stream():
        parts = ll_sections(p, wire)
        table = struct.pack(f"<{len(parts)}Q", *(int(s.size) for s in parts))
        front = cp.asarray(np.frombuffer(head(p) + table, np.uint8))
        return cp.concatenate([front, *parts])


def ll_decode_wire(buf, n: int, name: str, floats: dict, head_struct: struct.Struct):
    """Wire buffer (device) -> the values' bit patterns (uint16 / uint32 cupy array)."""
    cp = dev.require_cupy()
    with torch_stream():
        hs = head_struct.size
        front = buf[: hs + 32].get().tobytes()
        if len(front) < hs + 32:
            raise CorruptStreamError(f"lossless device stream of {buf.size} bytes is too short")
        _magic, _version, code, top, count = head_struct.unpack_from(front, 0)
        if code >= len(floats) or list(floats)[code] != name:
            raise CorruptStreamError(f"lossless device stream dtype code {code} is not {name}")
        sizes = struct.unpack_from("<4Q", front, hs)
        bits, ebits, mbits, _ = floats[name]
        if count != n or sizes[0] != (3 * n + 7) // 8 or sizes[1] != (n * (1 + mbits) + 7) // 8 or hs + 32 + sum(sizes) != buf.size:
            raise CorruptStreamError(f"lossless device stream sizes {sizes} do not fit {n} values of {name}")
        ends = np.cumsum([hs + 32, *sizes]).tolist()
        codes = _unpack3(buf[ends[0] : ends[1]], n)
        rest = _unpack_fixed(buf[ends[1] : ends[2]], 1 + mbits, n)
        # copied: the kernels read the block stream's u32 tile table, which needs 4-byte alignment
        esc = cp.cumsum(G.decode_block_stream(buf[ends[2] : ends[3]].copy()).astype(cp.int64))
        raw_exp = buf[ends[3] : ends[4]]
        want = cp.flatnonzero(codes == 7)
        if raw_exp.size != esc.size or want.size != esc.size or not bool(cp.all(esc == want)):
            raise CorruptStreamError("lossless stream escape list disagrees with its codes")
        table = cp.asarray(np.frombuffer(top, np.uint8).astype(np.uint32))
        exp = table[cp.minimum(codes, 6)]
        exp[want] = raw_exp
        if ebits < 8 and bool(cp.any(exp >> ebits)):
            raise CorruptStreamError(f"lossless stream exponent exceeds {ebits} bits")
        u = ((rest >> mbits) << (ebits + mbits)) | (exp << mbits) | (rest & ((1 << mbits) - 1))
        return u.astype(cp.uint32 if bits == 32 else cp.uint16)


def bits_to_float64(u, name: str):
    cp = dev.require_cupy()
    return to_float64(u if name == "bfloat16" else u.view(name), name)
