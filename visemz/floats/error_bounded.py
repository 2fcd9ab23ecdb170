"""The error-bounded float codec, on the shared block encoder.


``ErrorBounded(eb, predictor="lorenzo")``: q = round(x / (2 eb)) as int32, predicted (1-D or 2-D
Lorenzo on the integers, ``prediction.py``; "none" keeps q itself), the residuals coded with the
per-block-width policy (blocks of 32 decode independently, which homomorphic addition needs;
the prediction is linear in q, so residual streams add like the steps do).  The decoded value
2 eb q lies within eb of x (computed in float64: at exact ties up to ~1e-16 relative more);
stored back into a tensor it also carries
that dtype's rounding (half a unit in the last place), which for bf16 and fp16 can exceed
a small eb.  An N-way sum of decoded values is within N eb of the exact sum.

CUDA tensors and cupy arrays are encoded on the GPU (``gpu.py``) into the same bytes;
``encode_device`` / ``decode_device`` keep the compressed form in device memory for NCCL.

It follows numcodecs' Codec shape: ``codec_id``, ``encode``/``decode``, ``get_config``/``from_config``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from .. import cuda
from ..config import real_number
from ..encoders import decode_ints, encode_ints, stream
from ..encoders import layout as L
from ..errors import CorruptStreamError, InvalidArgumentError, LimitExceededError
from ..framing import read_prefix
from . import checksum, gpu
from .dtypes import CODES, FLOATS, as_array, check_float, from_float64, to_float64
from .prediction import PREDICTORS, STEP_LIMIT, Prediction

# version 1: no predictor; 2: the predictor field; 3 (written today): version 2's header then a checksum of every byte
EB_MAGIC, EB_VERSION = b"VZEB", 3
EB_HEAD = struct.Struct("<4sBBHd")  # version 1: magic, version, dtype code, reserved, eb
# versions 2, 3: magic, version, dtype code, predictor code, reserved, row length, eb
EB_HEAD2 = struct.Struct("<4sBBBBQd")
# version 3: the header and its u64 xxh64 of bytes [0, 24) and [32, end), then the ints stream
EB_FRONT = EB_HEAD2.size + 8


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
        if not real_number(self.eb) or not (np.isfinite(self.eb) and self.eb > 0):
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
        a, name = as_array(x)
        check_float(name)
        return self.quantize_values(to_float64(a.reshape(-1), name)), name

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
        head = EB_HEAD2.pack(EB_MAGIC, EB_VERSION, CODES[dtype], pred.code, 0, pred.row, self.eb)
        return head + checksum.compute(head, ints) + ints

    def encode_values(self, v: np.ndarray, dtype: str, pred: Prediction | None = None) -> bytes:
        """Encode float64 values (e.g. a sum of decoded tensors) as a stream of ``dtype``."""
        check_float(dtype)
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
        return v if exact else from_float64(v, name)

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
                checksum.verify(mv, head, what)
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

