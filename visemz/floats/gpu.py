"""The float codecs on the GPU: everything stays in device memory.

Byte for byte the same as the NumPy path in ``error_bounded.py``, ``lossless.py`` and ``homomorphic.py``
(tests/test_collectives_gpu.py):

- error-bounded: one kernel quantises and encodes (``eb_encode_*`` in ``cuda/floats.cu``:
  q = rint(float64(x) / (2 eb)) with IEEE division and round-half-even, exactly NumPy's, fused
  with the shared block encoder's per-block body); one kernel decodes and dequantises
  (``eb_decode_*``, into float64 or the tensor's own dtype);
- homomorphic add: ``block_add``, one fused kernel;
- lossless: an exponent histogram kernel, the top-7 table on the host (256 counts), one kernel
  for the codes, sign+mantissa and escape compaction, the escape gaps through the shared
  encoder's global-width kernel; decoding is two kernels.

Device-resident forms (what the NCCL collectives move) carry no checksum: NCCL delivers bytes
intact, the ranks agree on every setting first, and the kernels still check each stream's
structure.  The ``bytes`` forms (``ErrorBounded.encode`` etc.) add the ints stream's checksum
on the host.  cupy runs on torch's current stream, so torch, cupy and NCCL work stays ordered.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np
import torch

from .. import cuda, defaults
from ..encoders import entropy as E
from ..encoders import gpu as G
from ..encoders import layout as L
from ..encoders import stream
from ..errors import CorruptStreamError, InvalidArgumentError, LimitExceededError, UnsupportedFormatError, VisemzError

FLOATS_SOURCE = ("visemz.floats", "cuda/floats.cu")
BLOCK = L.POLICIES["block"]
GLOBAL = L.POLICIES["global"]
_TORCH_FLOATS = {"float32": "float32", "float16": "float16", "bfloat16": "bfloat16"}


def kernel(name: str):
    """A kernel of floats.cu (block_add and copy_sized are the block encoder's: ``G.kernel``)."""
    return G.kernel(name, FLOATS_SOURCE)


def stride_grid(n: int) -> int:
    """Blocks of a grid-stride kernel over ``n`` items: one item per thread, at most 8 blocks per SM."""
    return min(-(-n // G.THREADS), G.sm_count() * 8)


def float_bits(x) -> tuple[object, str]:
    """A flat cupy view of a CUDA float tensor or cupy array and its dtype name (bf16 as uint16 bits)."""
    cp = cuda.require_cupy()
    if isinstance(x, torch.Tensor):  # a CUDA tensor
        name = str(x.dtype).replace("torch.", "")
        if name not in _TORCH_FLOATS:
            raise UnsupportedFormatError(f"dtype {name} is not one the float codecs take")
        t = x.detach().contiguous().reshape(-1)
        if name == "bfloat16":
            return cp.asarray(t.view(torch.int16)).view(cp.uint16), name
        return cp.asarray(t), name
    a = cp.ascontiguousarray(cuda.as_cupy(x)).reshape(-1)
    if a.dtype.name not in ("float32", "float16"):
        raise UnsupportedFormatError(f"dtype {a.dtype.name} is not one the float codecs take")
    return a, a.dtype.name


def to_float64(a, name: str):
    cp = cuda.require_cupy()
    if name == "bfloat16":
        return (a.astype(cp.uint32) << 16).view(cp.float32).astype(cp.float64)
    return a.astype(cp.float64)


# --------------------------------------------------------------- error-bounded
# kernel-name suffix of each float format (floats.cu's FLOAT_KERNELS)
SUFFIX = {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "float64": "f64"}
# result cells of the fused encoder: [stream size, error bits, largest |x| with too many steps (float32 bits)]
EB_NONFINITE, EB_TOO_MANY_STEPS, EB_RESIDUAL_RANGE = 1, 2, 4
STEP_OVERFLOW = 256  # eb_dequantise: a decoded step (prefix sum of residuals) leaves int32


@dataclass
class DeviceStream:
    """A block stream in device memory: ``data`` (uint8, capacity >= size), its byte count on the device.

    A stream from the fused encoder or the homomorphic add also carries its result ``cells``
    (encoder: size, error bits, worst |x|; add: size, error bits) and ``source`` ("encode" or
    "add"): the kernels report bad input there instead of stopping the GPU for a read, and the
    first size read (which every consumer of a stream makes) raises it.  ``eb``: the encoder's
    bound, for its message.  ``known`` is the size once the host has it (read once, or given by
    whoever already knows it, e.g. a receive buffer).
    """

    data: object  # cupy uint8
    size: object  # cupy uint64, shape (1,)
    n: int
    cells: object = None  # cupy uint64 result cells, the size first (see above)
    eb: float | None = None
    known: int | None = None
    source: str = "encode"

    def nbytes(self) -> int:
        """The stream's length (one small device-to-host read, the first time); raises what the kernel found."""
        if self.known is None:
            self.known = self._read_size()
        return self.known

    def _read_size(self) -> int:
        if self.cells is None:
            return int(self.size.get()[0])
        return self.checked([int(v) for v in self.cells.get()])

    def checked(self, words: list[int]) -> int:
        """The size from the result cells as read (``words``; unsigned or, through a torch int64 view,
        signed: a failure's ~0 is then -1), or what they report raised."""
        if self.source == "add":
            return settle_add(words, self.data.size)
        size = words[0] & 0xFFFFFFFFFFFFFFFF
        err, worst = words[1], words[2]
        if err & EB_NONFINITE:
            raise InvalidArgumentError("tensor holds NaN or Inf: error-bounded compression needs finite values")
        if err & EB_TOO_MANY_STEPS:
            big = float(np.uint32(worst).view(np.float32))
            raise LimitExceededError(f"values up to {big:.3g} need more than int32 steps of 2*eb={2 * self.eb:g}")
        if err & EB_RESIDUAL_RANGE:
            raise LimitExceededError("prediction residuals leave int32: use a larger error bound or predictor='none'")
        if size > self.data.size:  # the kernel's look-back gave up (see look_back in encoders/cuda/block.cuh)
            raise VisemzError(f"GPU block encoder failed (reported size {size:#x})")
        return size

    def bytes_view(self):
        return self.data[: self.nbytes()]


def settle_add(words: list[int], room: int) -> int:
    """A homomorphic sum's size from its words [size, error bits] as read (unsigned or through an int64
    view), or what they report raised; ``room``: its buffer's bytes."""
    size = words[0] & 0xFFFFFFFFFFFFFFFF
    _raise_add_errors(words[1] & 0xFFFFFFFF)
    if size > room:
        raise VisemzError(f"GPU homomorphic add failed (reported size {size:#x})")
    return size


def read_sizes(streams: list[DeviceStream]) -> None:
    """Every stream's size in one device-to-host read instead of one each (``nbytes`` then reads nothing),
    raising what any kernel reported as ``nbytes`` would.  Runs on the current stream, which must
    follow the streams' kernels."""
    pending = [s for s in streams if s.known is None]
    if not pending:
        return
    with cuda.torch_stream() as cp:
        words = cp.concatenate([s.size if s.cells is None else s.cells for s in pending]).get().tolist()
    for s in pending:
        k = 1 if s.cells is None else s.cells.size
        s.known = words[0] if s.cells is None else s.checked(words[:k])
        words = words[k:]


def room(n: int) -> int:
    """The worst-case device stream of ``n`` values: what the encoder and the add allocate, and what an
    in-band step sends."""
    return L.max_stream_size(BLOCK, n)


def encode_symbols(q) -> DeviceStream:
    """int32 symbols on the device -> their per-block, bitshuffled block stream (no host sync)."""
    L.check_count(q.size)
    data, size = G.encode_block_stream(q, BLOCK, True)
    return DeviceStream(data, size, int(q.size))


def _empty_stream(cp, cells):
    """The stream of no values: the bare header (what the NumPy encoder writes for n = 0)."""
    data = cp.empty(L.HEADER_SIZE, cp.uint8)
    data[:] = cp.asarray(np.frombuffer(L.Header(BLOCK, True, 0, 0, 0, 0).pack(), np.uint8))
    cells[0] = L.HEADER_SIZE
    return data


def eb_encode(x, eb: float, pred) -> tuple[DeviceStream, str]:
    """Quantise, predict and encode in one kernel (``eb_encode_<dtype>_<predictor>``): q = rint(float64(x) / (2 eb)) as
    NumPy computes it, the residuals of ``pred`` (a ``prediction.Prediction``), per-block bitshuffled
    block stream.  No host sync: NaN/Inf, values needing more than int32 steps and residuals that
    leave int32 are raised by the stream's first size read (``DeviceStream.nbytes``)."""
    with cuda.torch_stream() as cp:
        a, name = float_bits(x)
        n = int(a.size)
        L.check_count(n)
        pred.check_count(n)
        cells = cp.zeros(3, cp.uint64)
        if n == 0:
            return DeviceStream(_empty_stream(cp, cells), cells[0:1], 0, cells, eb), name
        out = cp.empty(room(n), cp.uint8)
        ntiles = L.n_tiles(n)
        scratch = G.workspace(ntiles)
        kernel(f"eb_encode_{SUFFIX[name]}_{pred.predictor}")((ntiles,), (G.THREADS,), (
            a, np.int64(n), np.float64(2 * eb), np.int64(pred.row), out, scratch.status, scratch.tile_counter, cells))
        return DeviceStream(out, cells[0:1], n, cells, eb), name


SUM_LEAVES_INT32 = 64  # block_add's report bit for a sum beyond int32 (the host engine's sums report it alike)
ADD_ERRORS = {1: "tile table", 2: "block width over 32", 4: "tile size", SUM_LEAVES_INT32: "sum leaves int32",
              128: "header"}


def eb_decode(s: DeviceStream, eb: float, dtype: str = "float64", pred=None):
    """Decode and dequantise: 2 eb q as ``dtype`` on the device.

    float64 is the exact reconstruction (NumPy's ``q * (2 eb)``); float32/float16/bfloat16 round it
    as ``dtypes.from_float64`` does (bf16 as uint16 bit patterns), i.e. ``ErrorBounded.decode``'s
    bytes.  Without prediction one kernel (``eb_decode_*``); with 1-D Lorenzo one kernel too
    (``eb_decode_lorenzo_*``: the prefix sum by a warp scan per block and decoupled look-back across
    tiles); with 2-D Lorenzo the residuals widened to int64 (``eb_residuals``), cupy's prefix sums
    along rows, then columns, and ``eb_dequantise_*``.  The header is checked on the device; one
    host read of the error word.
    """
    return eb_decode_many([s], eb, dtype, pred)[0]


def eb_decode_many(streams: list[DeviceStream], eb: float, dtype: str = "float64", pred=None) -> list:
    """``eb_decode`` of several streams (their sizes known on the host): every decoder launched, then
    one host read of all their error words."""
    if dtype not in SUFFIX:
        raise UnsupportedFormatError(f"dtype {dtype} is not one the error-bounded decoder writes: {list(SUFFIX)}")
    with cuda.torch_stream() as cp:
        launched = [_eb_decode_launch(cp, s, eb, dtype, pred) for s in streams]
        words = [w for _, w in launched if w is not None]
        if words:
            read = cp.concatenate(words).get().tolist()
            for w in words:
                _raise_decode_errors(read[: w.size])
                read = read[w.size :]
    return [out for out, _ in launched]


def _eb_decode_launch(cp, s: DeviceStream, eb: float, dtype: str, pred):
    """Queue one stream's decode: (output, its error words as int64 to read, or None for no values).

    The words are [look-back gave up (~0), error bits] for 1-D Lorenzo, [error bits] otherwise."""
    predicted = pred is not None and pred.code != 0
    raw = s.bytes_view()
    out = cp.empty(s.n, cp.uint16 if dtype == "bfloat16" else dtype)
    if s.n == 0:
        return out, None
    if predicted:
        pred.check_count(s.n)
    ntiles = L.n_tiles(s.n)
    grid, args = (ntiles,), (raw, np.int64(raw.size), np.int64(s.n))
    if predicted and pred.row == 0:  # 1-D Lorenzo: one kernel, prefix sums by decoupled look-back
        cells = cp.zeros(2, cp.uint64)  # [look-back gave up (~0)], [error bits (int32 in the low word)]
        scratch = G.workspace(ntiles)
        kernel(f"eb_decode_lorenzo_{SUFFIX[dtype]}")(grid, (G.THREADS,), (
            *args, np.float64(2 * eb), out, scratch.status, scratch.tile_counter, cells))
        return out, cells.view(cp.int64)
    err = cp.zeros(1, cp.int64)  # the kernels write an int32: the low half
    err32 = err.view(cp.int32)[:1]
    if not predicted:
        kernel(f"eb_decode_{SUFFIX[dtype]}")(grid, (G.THREADS,), (*args, np.float64(2 * eb), out, err32))
    else:  # 2-D Lorenzo: the residuals widened, cupy's prefix sums along rows and down columns
        r = cp.empty(s.n, cp.int64)
        kernel("eb_residuals")(grid, (G.THREADS,), (*args, r, err32))
        q = cp.cumsum(cp.cumsum(r.reshape(-1, pred.row), axis=1), axis=0).reshape(-1)
        kernel(f"eb_dequantise_{SUFFIX[dtype]}")((stride_grid(s.n),), (G.THREADS,), (
            q, np.int64(s.n), np.float64(2 * eb), out, err32))
    return out, err


def _raise_decode_errors(words: list[int]) -> None:
    """What a decoder's error words (``_eb_decode_launch``) report, raised."""
    if len(words) == 2 and words[0]:
        raise VisemzError(f"GPU error-bounded decoder failed (look-back word {words[0] & 0xFFFFFFFFFFFFFFFF:#x})")
    code = words[-1] & 0xFFFFFFFF
    if code & ~STEP_OVERFLOW:
        raise CorruptStreamError("error-bounded device stream is inconsistent: " + ", ".join(
            w for bit, w in ADD_ERRORS.items() if code & bit) + f" (GPU decoder error bits 0x{code:x})")
    if code:
        raise LimitExceededError("decoded steps leave int32: a sum of streams that int32 cannot hold, or a damaged "
                                 "stream")


def stream_bytes(s: DeviceStream) -> bytes:
    """The ints stream (entropy none) of a device block stream: what ``encode_ints`` writes on the CPU."""
    with cuda.torch_stream():
        raw = s.bytes_view().get().tobytes()
    return stream.pack(len(raw), E.KINDS["none"], defaults.get("entropy_chunk"), [raw])


def _raise_add_errors(err: int) -> None:
    """What block_add's error word reports, raised as the NumPy ``homomorphic.add`` raises it."""
    if err & SUM_LEAVES_INT32:
        raise LimitExceededError("the sum leaves int32: use a larger error bound for this many additions")
    if err:
        raise CorruptStreamError("homomorphic add input is inconsistent: " + ", ".join(
            w for bit, w in ADD_ERRORS.items() if err & bit))


def add(a: DeviceStream, b: DeviceStream, inplace: bool = False, lazy: bool = False) -> DeviceStream:
    """Homomorphic sum of two device streams with the fused ``block_add`` kernel.

    ``inplace=True`` leaves the sum in ``a.data``: the kernel writes a scratch stream (its tiles
    move, so writing over an input other thread blocks still read would corrupt it) and a
    sized copy on the same stream moves it back; ``a.data`` must hold the worst case, which
    ``encode_symbols`` and the transport's receive buffers allocate.
    Raises like the NumPy ``homomorphic.add``: a sum that leaves int32 is LimitExceededError.
    ``lazy=True`` leaves the sum's size and error word on the device (the stream's ``cells``; no
    host read; not with ``inplace``): its first size read (``nbytes``, ``read_sizes``, or the transport reading the
    cells with the words it receives) raises what the kernel found.  The kernel checks each input's
    structure against its exact length: the host's where it knows it, else (an unread sum, ``source``
    "add", or one received with its words: ``add_input``) the length in the input's device cells,
    whose report bits the sum's error word then carries on.
    """
    if a.n != b.n:
        raise InvalidArgumentError(f"cannot add a {a.n}-value stream to a {b.n}-value stream")
    if inplace and lazy:
        raise InvalidArgumentError("an in-place add is checked before it overwrites its input: lazy=True does not "
                                   "apply")
    cap = room(a.n)
    if inplace and a.data.size < cap:
        raise LimitExceededError(f"in-place add needs a {cap}-byte buffer, the stream has {a.data.size}")
    with cuda.torch_stream() as cp:
        (sa, wa), (sb, wb) = _add_input(a), _add_input(b)
        n, ntiles = a.n, L.n_tiles(a.n)
        # [stream size], [error word (int32 in the low half)]; fresh: a lazy sum keeps its own
        cells = cp.zeros(2, cp.uint64)
        if n == 0:  # the bare header, which is also the capacity of no values
            out = _empty_stream(cp, cells)
        else:
            out = cp.empty(cap, cp.uint8)
            scratch = G.workspace(ntiles)
            G.kernel("block_add")((ntiles,), (G.THREADS,), (
                sa, np.int64(sa.size), wa, sb, np.int64(sb.size), wb, np.int64(n), np.int32(1), out, scratch.status,
                scratch.tile_counter, cells[0:1], cells[1:2].view(cp.int32)))
        s = DeviceStream(out, cells[0:1], n, cells, source="add", known=L.HEADER_SIZE if n == 0 else None)
        if not lazy:
            s.nbytes()  # raised here, before an in-place copy would overwrite ``a``
        if inplace:
            G.kernel("copy_sized")((min(-(-cap // G.THREADS), 4096),), (G.THREADS,),
                                   (out, a.data, cells[0:1], np.int64(cap)))
            s.data = a.data
    return s


_NULL = np.uint64(0)  # a null pointer argument: block_add then takes the buffer's length as exact


def _add_input(s: DeviceStream):
    """(bytes, words) block_add reads of an input: an unread sum's whole buffer and its device cells
    [length, report bits] (no host read), else the exact bytes (its size read if not yet) and no words."""
    if s.known is None and s.source == "add" and s.cells is not None:
        return s.data, s.cells
    return s.bytes_view(), _NULL


def add_input(data, words, n: int) -> DeviceStream:
    """A sum as received with its words (cupy uint8 room and uint64 [length, report bits]), unread: ``add``
    takes it as it is, and its first size read raises the report (``DeviceStream.checked``)."""
    return DeviceStream(data, words[0:1], n, words, source="add")


# ------------------------------------------------------------------- lossless
LL_TILE = 2048  # values per thread block of the ll_* kernels (256 threads x 8: floats.cu's LL_TILE)
TABLE_BYTES = 32  # the four u64 section sizes after the fixed header


def _table_word(top: bytes) -> np.uint64:
    """The 7 table exponents as the bytes of one u64 (the kernels' ``top`` argument)."""
    return np.uint64(int.from_bytes(bytes(top) + b"\0", "little"))


def ll_encode(x, floats: dict, head) -> tuple[object, str]:
    """ZipCCL exponent coding on the device -> (wire buffer, dtype name).

    Kernels: an exponent histogram (``ll_histogram_*``); the top-7 table chosen on the host from
    the 256 counts by the CPU path's own rule (a 1 KB read); one pass (``ll_encode_*``) writing the
    3-bit codes and the raw sign+mantissa straight into the output and compacting the escapes in
    index order (decoupled look-back); the escape gaps through the shared global-width encoder.
    ``head(name, top, n)`` packs the fixed header.  Two host reads in all.
    """
    with cuda.torch_stream() as cp:
        u, name = float_bits(x)
        mbits = floats[name][2]
        n, sfx = int(u.size), SUFFIX[name]
        if n > 2**31 - 1:  # escape positions are int32, as on the CPU
            raise LimitExceededError(f"{n} values: the lossless codec takes at most 2**31 - 1 per tensor")
        counts = cp.zeros(256, cp.uint64)
        if n:
            kernel(f"ll_histogram_{sfx}")((stride_grid(n),), (G.THREADS,), (u, np.int64(n), counts))
        hist = counts.get().astype(np.int64)
        top = bytes(np.argsort(-hist, kind="stable")[:7].astype(np.uint8))  # lossless.Lossless.encode's rule
        n_esc = n - int(hist[list(top)].sum())
        sizes = [(3 * n + 7) // 8, ((1 + mbits) * n + 7) // 8]
        front = len(head(name, top, n)) + TABLE_BYTES
        at = front + sizes[0] + sizes[1]  # where the escape gaps start
        buf = cp.empty(at + L.max_stream_size(GLOBAL, n_esc) + n_esc, cp.uint8)
        pos, exps = cp.empty(n_esc, cp.int32), cp.empty(n_esc, cp.uint8)
        counted = cp.zeros(1, cp.uint64)
        if n:
            ntiles = -(-n // LL_TILE)
            scratch = G.workspace(ntiles)
            kernel(f"ll_encode_{sfx}")((ntiles,), (G.THREADS,), (
                u, np.int64(n), _table_word(top), buf[front:], buf[front + sizes[0]:], pos, exps, scratch.status,
                scratch.tile_counter, counted))
        gaps = cp.diff(pos, prepend=0).astype(cp.int32) if n_esc else cp.zeros(0, cp.int32)
        gap_stream, gap_size = G.encode_block_stream(gaps, GLOBAL, True)
        gs, got = (int(v) for v in cp.concatenate([gap_size, counted]).get())  # one read: both sizes
        if got != n_esc or gs > gap_stream.size:
            raise VisemzError(f"GPU lossless encoder failed ({got:#x} escapes for {n_esc}, gap stream {gs:#x} bytes)")
        buf[at : at + gs] = gap_stream[:gs]
        buf[at + gs : at + gs + n_esc] = exps
        table = struct.pack("<4Q", sizes[0], sizes[1], gs, n_esc)
        buf[:front] = cp.asarray(np.frombuffer(head(name, top, n) + table, np.uint8))
        return buf[: at + gs + n_esc], name


def ll_bytes(wire: bytes, front: int) -> bytes:
    """Wire form (host bytes) -> the ``bytes`` form: the escape gaps as a checksummed ints stream
    (``encode_ints``' framing) instead of a raw block stream.  ``front``: header + size table."""
    sizes = struct.unpack_from("<4Q", wire, front - TABLE_BYTES)
    at = front + sizes[0] + sizes[1]
    gaps = wire[at : at + sizes[2]]
    packed = stream.pack(len(gaps), E.KINDS["none"], defaults.get("entropy_chunk"), [gaps])
    table = struct.pack("<4Q", sizes[0], sizes[1], len(packed), sizes[3])
    return wire[: front - TABLE_BYTES] + table + wire[front:at] + packed + wire[at + sizes[2] :]


def ll_decode_wire(buf, n: int, name: str, floats: dict, head_struct: struct.Struct):
    """Wire buffer (device) -> the values' bit patterns (uint16 / uint32 cupy array).

    ``ll_decode_*`` rebuilds every value from its code and sign+mantissa (escapes with a zero
    exponent), ``ll_escapes_*`` checks the escape list against the codes and fills in the escaped
    exponents.  Host reads: the fixed header, the gap stream's header and error word, one result word.
    """
    cp = cuda.require_cupy()
    with cuda.torch_stream():
        hs = head_struct.size
        front = buf[: hs + TABLE_BYTES].get().tobytes()
        if len(front) < hs + TABLE_BYTES:
            raise CorruptStreamError(f"lossless device stream of {buf.size} bytes is too short")
        _magic, _version, code, top, count = head_struct.unpack_from(front, 0)
        if code >= len(floats) or list(floats)[code] != name:
            raise CorruptStreamError(f"lossless device stream dtype code {code} is not {name}")
        sizes = struct.unpack_from("<4Q", front, hs)
        bits, ebits, mbits, _ = floats[name]
        if count != n or sizes[0] != (3 * n + 7) // 8 or sizes[1] != (n * (1 + mbits) + 7) // 8 or \
                hs + TABLE_BYTES + sum(sizes) != buf.size:
            raise CorruptStreamError(f"lossless device stream sizes {sizes} do not fit {n} values of {name}")
        ends = np.cumsum([hs + TABLE_BYTES, *sizes]).tolist()
        codes, rest, exps = buf[ends[0] : ends[1]], buf[ends[1] : ends[2]], buf[ends[3] : ends[4]]
        # copied: the kernels read the block stream's u32 tile table, which needs 4-byte alignment
        pos = cp.cumsum(G.decode_block_stream(buf[ends[2] : ends[3]].copy()).astype(cp.int64))
        if exps.size != pos.size:
            raise CorruptStreamError("lossless stream escape list disagrees with its codes")
        out = cp.empty(n, cp.uint32 if bits == 32 else cp.uint16)
        cells = cp.zeros(2, cp.uint64)  # code-7 values counted, error bits
        sfx = SUFFIX[name]
        if n:
            kernel(f"ll_decode_{sfx}")((-(-n // LL_TILE),), (G.THREADS,), (
                codes, rest, np.int64(n), _table_word(top), out, cells))
        if pos.size:
            kernel(f"ll_escapes_{sfx}")((stride_grid(pos.size),), (G.THREADS,), (
                pos, exps, np.int64(pos.size), codes, np.int64(n), out, cells))
        counted, err = (int(v) for v in cells.get())
    if counted != pos.size or err & 1:
        raise CorruptStreamError("lossless stream escape list disagrees with its codes")
    if err & 2:
        raise CorruptStreamError(f"lossless stream exponent exceeds {ebits} bits")
    return out


def bits_to_float64(u, name: str):
    return to_float64(u if name == "bfloat16" else u.view(name), name)
