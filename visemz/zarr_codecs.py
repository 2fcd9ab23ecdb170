"""numcodecs codecs, so Zarr (and anything else that takes numcodecs) stores chunks with visemz.

    import numcodecs, zarr
    codec = numcodecs.get_codec({"id": "visemz", "quality": 6, "max_error": 0})
    z = zarr.open(store, mode="w", shape=(4096, 4096), chunks=(256, 256), dtype="uint16", compressor=codec)

``visemz``: the learned image codec (``visemz.compress``) on 2-D (H, W) chunks and 3-D chunks,
read as (H, W, C) (``layout="hwc"``, as ``visemz.compress`` reads an image) or as a stack of planes
(Z, H, W) (``layout="zhw"``), which is moved to (H, W, Z) and so coded as Z gray planes (Z = 3 goes
through the RGB model, the image codec's rule for three channels); uint8, uint16, int16 and float32.
The .vsz bytes carry shape, dtype and value range; the layout lives in the codec's config.
A chunk larger than a tile (``tile``, default ``VISEMZ_TILE``) is compressed tile by tile (image
format 5), so a large chunk needs no more GPU memory than a tile batch.

``visemz_eb`` and ``visemz_lossless``: the float codecs (``visemz/floats/``) on float32 and float16
chunks of any shape.  Their streams are flat, so a small header in front records the shape
(docs/FORMAT.md, section 8).  NumPy has no bfloat16 (the codecs take bf16 only as torch tensors),
so bf16 chunks are refused.

The codecs are found by id through the ``numcodecs.codecs`` entry points in pyproject.toml, which
exist once visemz is installed; this module registers nothing itself.
"""

from __future__ import annotations

import math
import struct

import numpy as np
from numcodecs.abc import Codec
from numcodecs.compat import ensure_contiguous_ndarray, ensure_ndarray, ndarray_copy

from . import api
from .config import check_max_error, whole_number
from .errors import CorruptStreamError, InvalidArgumentError, UnsupportedFormatError
from .floats import ErrorBounded, Lossless
from .floats.error_bounded import error_bound_config
from .framing import read_prefix, xxh64
from .image import tiling
from .image.pixels import DTYPES, MAX_CHANNELS, check_pixels
from .models import registry

LAYOUTS = ("hwc", "zhw")
DEVICES = (None, "auto", "cpu", "cuda")


class Visemz(Codec):
    """The learned image codec on 2-D and 3-D chunks (``layout`` says how a 3-D chunk is read).

    ``max_error`` (None: lossy, no bound) is the guaranteed maximum absolute error of every value,
    counted in levels of the chunk's dtype: whole 8-bit levels for uint8, whole 16-bit levels for
    uint16 (``max_error=1`` on uint16 is 1/65535 of the range, not an 8-bit level), an absolute
    value for float32; 0 is lossless."""

    codec_id = "visemz"

    def __init__(self, quality: float = registry.DEFAULT_QUALITY, max_error=None, model: str = registry.DEFAULT_MODEL,
                 device: str | None = None, layout: str = "hwc", tile: int | None = None):
        self.quality = registry.check_quality(quality)
        e = check_max_error(max_error)
        if e is not None:  # NumPy's numbers too: the codec's config is JSON
            max_error = int(max_error) if whole_number(max_error) else e
        registry.spec(model, "gray")  # names a bad model now, not at the first chunk
        if device not in DEVICES:
            raise InvalidArgumentError(f"device={device!r}: expected one of {list(DEVICES)}")
        if layout not in LAYOUTS:
            raise InvalidArgumentError(f"layout={layout!r}: expected one of {list(LAYOUTS)}")
        if tile is not None:
            tile = tiling.check_tile(tile)
        self.max_error, self.model, self.device, self.layout, self.tile = max_error, model, device, layout, tile

    def encode(self, buf) -> bytes:
        a = ensure_ndarray(buf)
        if a.dtype.name not in DTYPES:
            raise UnsupportedFormatError(f"visemz codec: chunk dtype {a.dtype.name} is not one of {list(DTYPES)}")
        if a.ndim not in (2, 3):
            raise UnsupportedFormatError(f"visemz codec: chunk of shape {a.shape} is not 2-D or 3-D")
        if self.layout == "zhw" and a.ndim == 3:
            if a.shape[0] > MAX_CHANNELS:
                raise UnsupportedFormatError(
                    f"visemz codec: chunk of shape {a.shape} has {a.shape[0]} planes, at most {MAX_CHANNELS} per chunk")
            a = np.moveaxis(a, 0, 2)
        return api.compress(a, model=self.model, quality=self.quality, max_error=self.max_error, device=self.device,
                            tile=self.tile)

    def decode(self, buf, out=None) -> np.ndarray:
        a = api.decompress(ensure_contiguous_ndarray(buf), device=self.device)
        if a.ndim not in (2, 3):
            raise CorruptStreamError(f"visemz codec: stream decodes to shape {a.shape}, not a 2-D or 3-D chunk")
        if self.layout == "zhw" and a.ndim == 3:
            a = np.moveaxis(a, 2, 0)
        return ndarray_copy(np.ascontiguousarray(a), out) if out is not None else np.ascontiguousarray(a)

    def get_config(self) -> dict:
        return {"id": self.codec_id, "quality": self.quality, "max_error": self.max_error, "model": self.model,
                "device": self.device, "layout": self.layout, "tile": self.tile}

    def __repr__(self) -> str:
        return (f"Visemz(quality={self.quality!r}, max_error={self.max_error!r}, model={self.model!r}, "
                f"device={self.device!r}, layout={self.layout!r}, tile={self.tile!r})")


# ------------------------------------------------------------------------------ float codecs
# version 1: magic, version, ndim, the sizes, the stream; 2 (written today): a checksum of every byte after the sizes
SHAPE_MAGIC, SHAPE_VERSION = b"VZNA", 2
SHAPE_HEAD = struct.Struct("<4sBB")  # magic, version, ndim; then ndim little-endian uint64 sizes
MAX_NDIM = 32  # NumPy's own limit
FLOAT_DTYPES = ("float32", "float16")


class _ShapedFloatCodec(Codec):
    """A collectives float codec (``self.stream``) behind a header that records the chunk's shape."""

    stream: ErrorBounded | Lossless

    def encode(self, buf) -> bytes:
        a = ensure_ndarray(buf)
        if a.dtype.name not in FLOAT_DTYPES:
            raise UnsupportedFormatError(f"{self.codec_id} codec: chunk dtype {a.dtype.name} is not one of "
                                         f"{list(FLOAT_DTYPES)}")
        check_pixels(a.size, f"{self.codec_id} chunk of shape {a.shape}")  # what a reader allows
        head = SHAPE_HEAD.pack(SHAPE_MAGIC, SHAPE_VERSION, a.ndim) + struct.pack(f"<{a.ndim}Q", *a.shape)
        inner = self.stream.encode(np.ascontiguousarray(a))
        return head + struct.pack("<Q", xxh64(head, inner)) + inner

    def decode(self, buf, out=None) -> np.ndarray:
        what = f"{self.codec_id} chunk"
        mv, (ndim,) = read_prefix(ensure_contiguous_ndarray(buf), what, SHAPE_HEAD, SHAPE_HEAD.size, SHAPE_MAGIC,
                                  (1, SHAPE_VERSION))
        start = SHAPE_HEAD.size + 8 * ndim
        if ndim > MAX_NDIM or len(mv) < start:
            raise CorruptStreamError(f"{what} header of {len(mv)} bytes does not hold {ndim} sizes (at most "
                                     f"{MAX_NDIM})")
        if mv[4] == SHAPE_VERSION:
            if len(mv) < start + 8 or xxh64(mv[:start], mv[start + 8:]) != struct.unpack_from("<Q", mv, start)[0]:
                raise CorruptStreamError(f"{what} checksum mismatch: the chunk is corrupt or truncated")
            start += 8
        shape = struct.unpack_from(f"<{ndim}Q", mv, SHAPE_HEAD.size)
        count = math.prod(shape)
        check_pixels(count, f"{what} shape {shape}")  # before the stream allocates them
        values = self.stream.decode(mv[start:], count=count)  # the stream's own count held to the shape's first
        values = values.reshape(shape)
        return ndarray_copy(values, out) if out is not None else values


class VisemzErrorBounded(_ShapedFloatCodec):
    """Absolute error bound ``eb``: the float64 reconstruction is within ``eb`` of every value, and the
    float32/float16 value decode returns adds that dtype's rounding (half a unit in its last place)."""

    codec_id = "visemz_eb"

    def __init__(self, eb: float, predictor: str = "lorenzo"):
        self.stream = ErrorBounded(eb, predictor)  # checks eb (NumPy scalars taken, kept as a float) and predictor

    @property
    def eb(self) -> float:
        return self.stream.eb

    def get_config(self) -> dict:
        return {"id": self.codec_id, "eb": self.eb, "predictor": self.stream.predictor}

    @classmethod
    def from_config(cls, config: dict) -> "VisemzErrorBounded":
        """A config without a predictor takes the constructor's default (each chunk records its own predictor,
        so chunks written before predictors decode alike); one without ``eb`` is InvalidArgumentError."""
        unknown = set(config) - {"id", "eb", "predictor"} if isinstance(config, dict) else set()
        if unknown:
            raise InvalidArgumentError(f"{cls.codec_id} config has unknown keys {sorted(unknown)}")
        return cls(*error_bound_config(config))

    def __repr__(self) -> str:
        return f"VisemzErrorBounded(eb={self.eb!r}, predictor={self.stream.predictor!r})"


class VisemzLossless(_ShapedFloatCodec):
    """Bit-exact float coding (3-bit exponent codes with escapes, raw sign and mantissa)."""

    codec_id = "visemz_lossless"

    def __init__(self):
        self.stream = Lossless()

    def get_config(self) -> dict:
        return {"id": self.codec_id}

    def __repr__(self) -> str:
        return "VisemzLossless()"
