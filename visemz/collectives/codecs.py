"""Float codecs for collectives, on the shared block encoder.

``ErrorBounded(eb, predictor="lorenzo")``: q = round(x / (2 eb)) as int32, predicted (1-D or 2-D
Lorenzo on the integers, ``Prediction``; "none" keeps q itself), the residuals coded with the
per-block-width policy (blocks of 32 decode independently, which homomorphic addition needs;
the prediction is linear in q, so residual streams add like the steps do).  The decoded value
2 eb q lies within eb of x (computed in float64: at exact ties up to ~1e-16 relative more);
stored back into a tensor it also carries
that dtype's rounding (half a unit in the last place), which for bf16 and fp16 can exceed
a small eb.  An N-way sum of decoded values is within N eb of the exact sum.

``Lossless()``: ZipCCL-style exponent coding.  The exponent field of each value becomes a
3-bit code when it is one of the 7 most frequent exponents, else code 7 plus an entry in
an escape list; sign and mantissa bits are kept raw at a fixed stride.

CUDA tensors and cupy arrays are encoded on the GPU (``gpu.py``) into the same bytes;
``encode_device`` / ``decode_device`` keep the compressed form in device memory for NCCL.

Both follow numcodecs' Codec shape: ``codec_id``, ``encode``/``decode``, ``get_config``/``from_config``.
"""

from __future__ import annotations

import numbers
import struct
from dataclasses import dataclass

import numpy as np
import torch

from .. import cuda
from ..encoders import decode_ints, encode_ints, stream
from ..encoders import layout as L
from ..errors import CorruptStreamError, InvalidArgumentError, LimitExceededError, UnsupportedFormatError
from ..framing import read_prefix, xxh64
from . import gpu

# dtype -> (bits, exponent bits, mantissa bits, unsigned view)
FLOATS = {"float32": (32, 8, 23, np.uint32), "float16": (16, 5, 10, np.uint16), "bfloat16": (16, 8, 7, np.uint16)}
_CODES = {name: i for i, name in enumerate(FLOATS)}


def _as_array(x) -> tuple[np.ndarray, str]:
    """NumPy view of a float tensor (torch CPU tensors and bf16 included) and its dtype name."""
    if isinstance(x, torch.Tensor):
        name = str(x.dtype).replace("torch.", "")
        if name == "bfloat16":
            return x.detach().contiguous().view(torch.int16).cpu().numpy().view(np.uint16), name
        return x.detach().contiguous().cpu().numpy(), name
    a = np.asarray(x)
    if not a.dtype.isnative:  # big-endian data: the bit views below read native order
        a = a.astype(a.dtype.newbyteorder("="))
    return a, a.dtype.name


def _check_float(name: str) -> None:
    if name not in FLOATS:
        raise UnsupportedFormatError(f"dtype {name} is not a float the collectives codecs take: {list(FLOATS)}")


def _to_float64(a: np.ndarray, name: str) -> np.ndarray:
    if name == "bfloat16":
        return (a.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return a.astype(np.float64)


def _from_float64(v: np.ndarray, name: str) -> np.ndarray:
    if name != "bfloat16":
        return v.astype(name)
    bits = v.astype(np.float32).view(np.uint32)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)  # round to nearest even


def _checksum(head, body) -> bytes:
    """The u64 xxh64 of a stream's fixed header and of everything after the checksum field: every other byte."""
    return struct.pack("<Q", xxh64(head, body))


def _check_sum(mv: memoryview, head: int, what: str) -> None:
    """A stream whose u64 checksum follows its ``head`` fixed bytes: every other byte checked against it."""
    if len(mv) < head + 8:
        raise CorruptStreamError(f"{what} of {len(mv)} bytes is shorter than its {head + 8}-byte header")
    (stored,) = struct.unpack_from("<Q", mv, head)
    if xxh64(mv[:head], mv[head + 8:]) != stored:
        raise CorruptStreamError(f"{what} checksum mismatch: the stream is corrupt or truncated")


# ------------------------------------------------------------------------- error-bounded
# version 1: no predictor; 2: the predictor field; 3 (written today): version 2's header then a checksum of every byte
EB_MAGIC, EB_VERSION = b"VZEB", 3
EB_HEAD = struct.Struct("<4sBBHd")  # version 1: magic, version, dtype code, reserved, eb
# versions 2, 3: magic, version, dtype code, predictor code, reserved, row length, eb
EB_HEAD2 = struct.Struct("<4sBBBBQd")
# version 3: the header and its u64 xxh64 of bytes [0, 24) and [32, end), then the ints stream
EB_FRONT = EB_HEAD2.size + 8
PREDICTORS = ("none", "lorenzo", "lorenzo2d")  # index = the header's predictor code
STEP_LIMIT = 2**31 - 1  # every integer a stream holds (steps, residuals, sums) has |v| < this


@dataclass(frozen=True)
class Prediction:
    """How a stream's integers relate to the steps q = round(x / 2 eb): ``predictor`` and, for
    ``lorenzo2d``, the row length (the array is (n / row, row) in C order).

    Every predictor is linear in q, so residual streams add homomorphically: the residuals of
    qa + qb are the sum of the residuals of qa and of qb, and decoding (a prefix sum) gives qa + qb."""

    predictor: str = "none"
    row: int = 0

    def __post_init__(self):
        if self.predictor not in PREDICTORS:
            raise InvalidArgumentError(f"predictor={self.predictor!r}: expected one of {list(PREDICTORS)}")
        if (self.predictor == "lorenzo2d") != (self.row > 0) or self.row < 0:
            raise InvalidArgumentError(f"row length {self.row} does not fit predictor {self.predictor!r} (lorenzo2d "
                                       "needs one >= 1)")

    @property
    def code(self) -> int:
        """The header's (and the GPU kernels') predictor code."""
        return PREDICTORS.index(self.predictor)

    def check_count(self, n: int) -> None:
        if self.row and n % self.row:
            raise InvalidArgumentError(f"{n} values are not whole rows of {self.row} (2-D Lorenzo prediction)")

    def residuals(self, q: np.ndarray) -> np.ndarray:
        """int32 steps -> int32 residuals (int64 arithmetic; LimitExceededError where one leaves int32)."""
        self.check_count(q.size)
        if self.predictor == "none":
            return q
        q = q.astype(np.int64)
        if self.predictor == "lorenzo":
            r = np.diff(q, prepend=0)
        else:
            g = q.reshape(-1, self.row)
            r = g.copy()
            r[1:] -= g[:-1]
            r[:, 1:] -= g[:, :-1]
            r[1:, 1:] += g[:-1, :-1]
            r = r.reshape(-1)
        if r.size and np.abs(r).max() >= STEP_LIMIT:
            raise LimitExceededError(f"{self.predictor} prediction residuals up to {np.abs(r).max()} leave int32: "
                                     "use a larger error bound or predictor='none'")
        return r.astype(np.int32)

    def steps(self, r: np.ndarray) -> np.ndarray:
        """Residuals -> int64 steps (prefix sums); LimitExceededError where a step leaves int32
        (a sum of streams beyond int32, or a damaged stream)."""
        self.check_count(r.size)
        if self.predictor == "none":
            return r.astype(np.int64)
        if self.predictor == "lorenzo":
            q = np.cumsum(r, dtype=np.int64)
        else:
            q = np.cumsum(np.cumsum(r.reshape(-1, self.row), axis=1, dtype=np.int64), axis=0).reshape(-1)
        if q.size and np.abs(q).max() >= STEP_LIMIT:
            raise LimitExceededError(f"decoded steps up to {np.abs(q).max()} leave int32: a sum of streams that int32 "
                                     "cannot hold, or a damaged stream")
        return q


@dataclass(frozen=True)
class ErrorBounded:
    """Absolute error bound ``eb`` > 0 per decoded value (see the module notes on dtypes).

    ``predictor``: "lorenzo" (default: 1-D Lorenzo along the flat values, residual q_i - q_{i-1}),
    "lorenzo2d" (2-D Lorenzo over rows of the input's last dimension, or of ``row`` values where a
    caller passes it) or "none" (the steps themselves, version-1 streams)."""

    eb: float
    predictor: str = "lorenzo"
    codec_id: str = "visemz-error-bounded"

    def __post_init__(self):
        if isinstance(self.eb, bool) or not isinstance(self.eb, numbers.Real) or \
                not (np.isfinite(self.eb) and self.eb > 0):
            raise InvalidArgumentError(f"eb={self.eb!r}: the error bound must be a finite number > 0")
        object.__setattr__(self, "eb", float(self.eb))  # NumPy scalars too: the stream and a config hold a float64
        if self.predictor not in PREDICTORS:
            raise InvalidArgumentError(f"predictor={self.predictor!r}: expected one of {list(PREDICTORS)}")

    def prediction(self, shape=None, row: int | None = None) -> Prediction:
        """This codec's predictor for an input of ``shape`` (or rows of ``row`` values)."""
        if self.predictor != "lorenzo2d":
            return Prediction(self.predictor)
        if row is None:
            if shape is None or len(shape) < 2:
                raise InvalidArgumentError(f"predictor 'lorenzo2d' needs a 2-D input (shape {shape}) or a row length")
            row = max(int(shape[-1]), 1)  # an empty input (last dimension 0) has no values for rows to split
        return Prediction("lorenzo2d", int(row))  # a given row length < 1 is refused there, never bent to 1

    def quantize(self, x) -> tuple[np.ndarray, str]:
        a, name = _as_array(x)
        _check_float(name)
        return self.quantize_values(_to_float64(a.reshape(-1), name)), name

    def quantize_values(self, v: np.ndarray) -> np.ndarray:
        """float64 values -> int32 steps of 2 eb."""
        if not np.isfinite(v).all():
            raise InvalidArgumentError("tensor holds NaN or Inf: error-bounded compression needs finite values")
        q = np.rint(v / (2 * self.eb))
        if q.size and np.abs(q).max() >= STEP_LIMIT:
            raise LimitExceededError(f"values up to {np.abs(v).max():.3g} need more than int32 steps of "
                                     f"2*eb={2 * self.eb:g}")
        return q.astype(np.int32)

    def encode(self, x, row: int | None = None) -> bytes:
        """Float array or tensor -> bytes; ``row`` sets lorenzo2d's row length for flat inputs."""
        pred = self.prediction(getattr(x, "shape", None), row)
        if cuda.is_gpu_array(x):  # quantised, predicted and encoded on the GPU; the host sees only the stream
            s, name = gpu.eb_encode(x, self.eb, pred)
            return self.frame(gpu.stream_bytes(s), name, pred)
        q, name = self.quantize(x)
        return self.encode_symbols(q, name, pred)

    def encode_device(self, x, row: int | None = None):
        """CUDA tensor / cupy array -> ``gpu.DeviceStream`` (the block stream of the residuals, in
        device memory) and dtype name."""
        return gpu.eb_encode(x, self.eb, self.prediction(getattr(x, "shape", None), row))

    def decode_device(self, s, dtype: str = "float64", row: int | None = None):
        """``gpu.DeviceStream`` -> cupy array of 2 eb q: float64 (the exact reconstruction), or
        ``dtype`` rounded as ``decode`` rounds (bf16 as uint16 bit patterns)."""
        return self.decode_device_many([s], dtype, row)[0]

    def decode_device_many(self, streams: list, dtype: str = "float64", row: int | None = None) -> list:
        """``decode_device`` of several streams, with one host read for all their error words."""
        return gpu.eb_decode_many(streams, self.eb, dtype, self.prediction(None, row))

    def frame(self, ints: bytes, dtype: str, pred: Prediction | None = None) -> bytes:
        """The stream (version 3) around the ints stream of its residuals: the header, then the checksum of
        every other byte, then the ints stream.  The CPU and the GPU encoders both end here, so their streams
        are the same bytes wherever the ints streams are."""
        pred = pred or self.prediction()
        head = EB_HEAD2.pack(EB_MAGIC, EB_VERSION, _CODES[dtype], pred.code, 0, pred.row, self.eb)
        return head + _checksum(head, ints) + ints

    def encode_values(self, v: np.ndarray, dtype: str, pred: Prediction | None = None) -> bytes:
        """Encode float64 values (e.g. a sum of decoded tensors) as a stream of ``dtype``."""
        _check_float(dtype)
        pred = pred or self.prediction()
        return self.encode_symbols(self.quantize_values(np.asarray(v, np.float64).reshape(-1)), dtype, pred)

    def encode_symbols(self, q: np.ndarray, dtype: str, pred: Prediction | None = None) -> bytes:
        """int32 steps -> the stream (predicted as ``pred``, by default this codec's 1-D form)."""
        pred = pred or self.prediction()
        return self.encode_residuals(pred.residuals(q), dtype, pred)

    def encode_residuals(self, r: np.ndarray, dtype: str, pred: Prediction) -> bytes:
        return self.frame(encode_ints(r, policy="block", bitshuffle=True, entropy="none"), dtype, pred)

    def decode(self, buf, exact: bool = False, count: int | None = None) -> np.ndarray:
        """Bytes -> flat NumPy array in the original dtype (bf16 as its uint16 bit patterns).

        ``exact=True`` returns the float64 reconstruction 2 eb q, which is within eb of the
        input; the original dtype adds its own rounding on top.  ``count``: the number of values the
        caller expects, held to the stream's own before anything is allocated.
        """
        q, name = self.symbols(buf, count)
        v = q.astype(np.float64) * (2 * self.eb)
        return v if exact else _from_float64(v, name)

    def symbols(self, buf, count: int | None = None) -> tuple[np.ndarray, str]:
        """Bytes -> the int64 steps q (predictions undone) and the dtype name."""
        r, name, pred = self.residual_symbols(buf, count)
        return pred.steps(r), name

    def residual_symbols(self, buf, count: int | None = None) -> tuple[np.ndarray, str, Prediction]:
        """Bytes -> the int32 integers the stream holds, the dtype name and the stream's prediction.

        Reads every version: 1 (no predictor), 2 and 3 (3: its checksum first)."""
        try:
            peek = memoryview(buf).cast("B")
        except TypeError:
            peek = b""  # read_prefix names the bad type
        what = "error-bounded stream"
        if len(peek) > 4 and bytes(peek[:4]) == EB_MAGIC and peek[4] == 1:
            mv, (code, _reserved, eb) = read_prefix(buf, what, EB_HEAD, EB_HEAD.size, EB_MAGIC, 1)
            pred, head = Prediction("none"), EB_HEAD.size
        else:
            mv, (code, pcode, reserved, row, eb) = read_prefix(buf, what, EB_HEAD2, EB_HEAD2.size, EB_MAGIC,
                                                               (2, EB_VERSION))
            head = EB_HEAD2.size
            if mv[4] == EB_VERSION:
                _check_sum(mv, head, what)
                head = EB_FRONT
            if pcode >= len(PREDICTORS) or reserved or (PREDICTORS[pcode] == "lorenzo2d") != (row > 0) or row > 2**29:
                raise CorruptStreamError(f"error-bounded stream predictor code {pcode} / row length {row} / reserved "
                                         f"{reserved} are not a valid prediction")
            pred = Prediction(PREDICTORS[pcode], row)
        if code >= len(FLOATS):
            raise CorruptStreamError(f"error-bounded stream dtype code {code} is unknown")
        if eb != self.eb:
            raise InvalidArgumentError(f"stream was written with eb={eb}, this codec has eb={self.eb}")
        _check_block_stream(mv[head:])
        r = decode_ints(mv[head:], count=count, entropy="none")  # every writer's ints stream has no entropy stage
        if pred.row and r.size % pred.row:
            raise CorruptStreamError(f"error-bounded stream of {r.size} values is not whole rows of {pred.row}")
        return r, list(FLOATS)[code], pred

    def get_config(self) -> dict:
        return {"id": self.codec_id, "eb": self.eb, "predictor": self.predictor}

    @classmethod
    def from_config(cls, config: dict) -> "ErrorBounded":
        """A config without a predictor takes the default, as the constructor does (a stream records its own
        predictor, so chunks written without one decode alike)."""
        return cls(*error_bound_config(config))


def _check_block_stream(ints: memoryview) -> None:
    """An error-bounded stream's block stream is of the per-block policy, bitshuffled, as every writer makes it
    (homomorphic addition needs the per-block policy; the plain packing's decoder takes about 5x the memory)."""
    at = stream.HEAD + 5  # entropy none: the block header's policy and flags bytes, after the ints stream's header
    plain = len(ints) > 5 and ints[5] == 0  # another entropy code is refused by decode_ints, naming it
    if plain and len(ints) >= at + 2 and (ints[at], ints[at + 1]) != (L.POLICIES["block"], L.FLAG_BITSHUFFLE):
        raise CorruptStreamError(f"error-bounded stream's block stream has policy {ints[at]} and flags {ints[at + 1]}: "
                                 "expected the per-block policy, bitshuffled")


def error_bound_config(config: dict) -> tuple[float, str]:
    """(eb, predictor) of an error-bounded codec's config, naming what is missing."""
    if not isinstance(config, dict) or "eb" not in config:
        raise InvalidArgumentError(f"error-bounded codec config {config!r} lacks the error bound 'eb'")
    return config["eb"], config.get("predictor", ErrorBounded.__dataclass_fields__["predictor"].default)


def predicts_rows(codec) -> bool:
    """Whether ``codec`` predicts along rows (2-D Lorenzo): flat chunks of it need a row length."""
    return isinstance(codec, ErrorBounded) and codec.predictor == "lorenzo2d"


# -------------------------------------------------------------------------------- lossless
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
        a, name = _as_array(x)
        _check_float(name)
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
        return LL_HEAD.pack(LL_MAGIC, 1, _CODES[name], top, n)

    @staticmethod
    def _seal(v1: bytes) -> bytes:
        """Version-1 bytes (CPU- or GPU-made alike) -> the version-2 stream: version 2 in the header, then the
        checksum of every other byte, then the rest as it was."""
        head = v1[:4] + bytes([LL_VERSION]) + v1[5:LL_HEAD.size]
        rest = v1[LL_HEAD.size:]
        return head + _checksum(head, rest) + rest

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
            _check_sum(mv, pos, what)
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
