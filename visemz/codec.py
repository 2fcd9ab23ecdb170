"""ImageCodec: images <-> .vsz bytes, gluing model, block encoder and container.

    codec = ImageCodec("cuda")
    buf = codec.compress(image, model="balle2016", quality=4.5, max_error=None)
    image = codec.decompress(buf)

(``visemz.compress`` / ``visemz.decompress`` in ``api.py`` use one per device.)

``quality`` is a float in [1, 8] on CompressAI's lambda ladder (the models are variable-rate).

The model's latent symbols are the only float -> int step; everything after them is
integer coding (``latents.py``: conditional rANS with the tables shipped in the weights), so a
file written on a GPU decodes to the same symbols on a CPU.
"""

from __future__ import annotations

import copy
import functools
import math
import threading
from contextlib import contextmanager

import numpy as np
import torch

from . import container, latents, residual
from . import device as dev
from .encoders import encode_ints
from .errors import CorruptStreamError, InvalidArgumentError, LimitExceededError, UnsupportedFormatError
from .models import architectures, registry
from .models import weights as W
from .pixels import (
    DTYPES,
    MAX_PIXELS,
    ImageMeta,
    as_tensor,
    check_max_error,
    denormalise,
    describe,
    from_batch,
    to_batch,
)

KIND = "image"
# 1: fixed-rate N=64/M=96 models, one per integer quality 1-4 (sessions 1-4), no longer decoded;
# 2: variable-rate N=128/M=192 models with gain units, a float quality in the header, symbols
#    block-coded (ints streams); still read, and written on request (``image_format=2``);
# 3: the same models, symbols coded by conditional rANS with the weights' tables (``latents.py``).
FORMAT = latents.RANS
FORMATS_READ = (latents.BLOCK, latents.RANS)
FORMATS_NOT_READ = {1: "fixed-rate models of visemz 0.1 (quality 1-4), whose weights are no longer shipped"}
META_KEYS = {"format", "model", "model_id", "quality", "dtype", "shape", "range", "symbols", "max_error", "residual", "entropy"}
META_KEYS_OF = {latents.BLOCK: META_KEYS, latents.RANS: META_KEYS | {"coding"}}  # format 3: each symbol section's coding


_MATH_LOCK = threading.Lock()
_math_users = 0
_saved_tf32: tuple[bool, bool] | None = None


@contextmanager
def exact_math():
    """Full float32 (no TF32) and no autograd: GPU results stay within rounding of the CPU's.

    The TF32 switches are process-wide, so concurrent users (the pipeline's streams) share
    one setting: the first to enter turns TF32 off and the last to leave restores it.
    """
    global _math_users, _saved_tf32
    with _MATH_LOCK:
        if _math_users == 0:
            _saved_tf32 = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)
            torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
        _math_users += 1
    try:
        with torch.inference_mode():
            yield
    finally:
        with _MATH_LOCK:
            _math_users -= 1
            if _math_users == 0:
                torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = _saved_tf32


_MODEL_LOCK = threading.Lock()


def _model64(spec: registry.ModelSpec, device: str) -> torch.nn.Module:
    """A float64 copy of the model: the error-bound path's synthesis and the hyperprior's scales for rANS,
    both device-independent up to their last bits."""
    with _MODEL_LOCK:  # one copy per (spec, device), even when several streams ask at once
        return _model64_cached(spec, device)


@functools.lru_cache(maxsize=16)
def _model64_cached(spec: registry.ModelSpec, device: str) -> torch.nn.Module:
    net, _ = W.load(spec, device)
    net64 = copy.deepcopy(net).double()
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)  # the copy ran on this thread's stream; others must see it done
    return net64


class ImageCodec:
    """Compress and decompress images with one device and entropy setting."""

    def __init__(self, device: str | None = None, entropy: str = "zstd", bitshuffle: bool = True):
        self.device = dev.resolve(device)
        self.enc = {"entropy": entropy, "bitshuffle": bitshuffle}
        encode_ints(np.zeros(0, np.int32), **self.enc)  # validates the options now, naming a bad one

    # ------------------------------------------------------------------ compress
    def compress(self, image, *, model: str = registry.DEFAULT_MODEL, quality: float = registry.DEFAULT_QUALITY,
                 max_error=None, image_format: int = FORMAT) -> bytes:
        """``image_format=2`` writes the previous format (block-coded symbols), for comparisons and
        compatibility tests; the default is today's."""
        if image_format not in FORMATS_READ:
            raise InvalidArgumentError(f"image_format={image_format!r}: this build writes {list(FORMATS_READ)}")
        q = registry.check_quality(quality)
        t = as_tensor(image, self.device)
        meta = describe(t)
        e = check_max_error(max_error, meta.dtype)
        spec = registry.spec(model, meta.variant)
        net, model_id = W.load(spec, self.device)
        with exact_math():
            symbols = architectures.analyse(net, to_batch(t, meta), q)
            net64 = _model64(spec, self.device) if e is not None or image_format == latents.RANS else None
            sections, coding = latents.encode(image_format, net, net64, symbols, q, self.enc)
            mode = None
            if e is not None:
                x01 = from_batch(architectures.synthesise(net64, symbols, q, torch.float64), meta)
                extra, mode = residual.encode(t, x01, meta, e, **self.enc)
                sections.update(extra)
        header = {
            "format": image_format, "model": spec.name, "model_id": model_id, "quality": q, "dtype": meta.dtype,
            "shape": list(meta.shape), "range": [meta.lo, meta.hi],
            "symbols": {k: list(v.shape) for k, v in symbols.items()},
            "max_error": e, "residual": mode, "entropy": self.enc["entropy"],
        }
        if coding is not None:
            header["coding"] = coding
        return container.pack(KIND, header, sections)

    # ---------------------------------------------------------------- decompress
    def decode_symbols(self, buf) -> dict[str, torch.Tensor]:
        """.vsz bytes -> the latent symbols it holds ({"y": ..., ["z": ...]}, int32 on this codec's device)."""
        return self._read(buf)[3]

    def decompress_tensor(self, buf) -> torch.Tensor:
        """.vsz bytes -> the image as a torch tensor on this codec's device."""
        c, h, meta, symbols = self._read(buf)
        spec, q = registry.parse(h["model"]), h["quality"]
        with exact_math():
            if h["residual"] is None:
                net, _ = W.load(spec, self.device)
                return denormalise(from_batch(architectures.synthesise(net, symbols, q), meta), meta)
            x01 = from_batch(architectures.synthesise(_model64(spec, self.device), symbols, q, torch.float64), meta)
            return residual.decode(c.sections, x01, meta, h["max_error"], h["residual"])

    def _read(self, buf):
        """Parse and check a file and decode its symbols: (container, header, image meta, symbols)."""
        c = container.unpack(buf)
        if c.kind != KIND:
            raise UnsupportedFormatError(f"container holds {c.kind!r}, not an image")
        h = _check_header(c.meta, c.sections)
        spec = registry.parse(h["model"])
        meta = ImageMeta(h["dtype"], tuple(h["shape"]), float(h["range"][0]), float(h["range"][1]))
        net, model_id = W.load(spec, self.device)
        if model_id != h["model_id"]:
            raise UnsupportedFormatError(
                f"file was written with weights {h['model_id']} of {spec.name}; this install has {model_id}"
            )
        want = architectures.latent_shapes(net, *_batch_and_padded(meta))
        if {k: list(v) for k, v in want.items()} != h["symbols"]:
            raise CorruptStreamError(f"symbol shapes {h['symbols']} do not fit a {meta.shape} image and {spec.name}")
        with exact_math():
            net64 = _model64(spec, self.device) if latents.rans_sections(h) else None
            symbols = latents.decode(net, net64, c.sections, want, h["quality"], self.device, h.get("coding"))
            return c, h, meta, symbols

    def decompress(self, buf) -> np.ndarray:
        """.vsz bytes -> the image as a NumPy array of the original dtype and shape."""
        out = self.decompress_tensor(buf)
        if out.dtype == torch.uint16:  # torch cannot hand uint16 to NumPy directly
            return out.to(torch.int32).cpu().numpy().astype(np.uint16)
        return out.cpu().numpy()


def _batch_and_padded(meta: ImageMeta) -> tuple[int, int, int]:
    batch = 1 if meta.channels == 3 or len(meta.shape) == 2 else meta.channels
    return (batch, *meta.padded)


def _check_header(h: dict, sections: dict) -> dict:
    """Validate an image header strictly: known keys, types, sizes, before anything is decoded."""
    if h.get("format") in FORMATS_NOT_READ:
        raise UnsupportedFormatError(f"image format {h['format']} ({FORMATS_NOT_READ[h['format']]}) is not read "
                                     f"by this build, which reads formats {list(FORMATS_READ)}")
    fmt = h.get("format")
    fmt = fmt if type(fmt) is int and fmt in FORMATS_READ else FORMAT
    container.check_meta(h, META_KEYS_OF[fmt], KIND, fmt, DTYPES)
    try:
        registry.check_quality(h["quality"])
    except InvalidArgumentError:
        raise CorruptStreamError(f"image header quality {h['quality']!r} is not a number in [1, 8]") from None
    shape = h["shape"]
    if not (isinstance(shape, list) and len(shape) in (2, 3) and all(isinstance(s, int) and s >= 1 for s in shape)):
        raise CorruptStreamError(f"image shape {shape!r} is invalid")
    if math.prod(shape) > MAX_PIXELS:
        raise LimitExceededError(f"image shape {shape} exceeds {MAX_PIXELS} values")
    rng = h["range"]
    if not (isinstance(rng, list) and len(rng) == 2 and all(isinstance(v, (int, float)) for v in rng) and rng[0] <= rng[1]):
        raise CorruptStreamError(f"image range {rng!r} is invalid")
    if not isinstance(h["model"], str) or not isinstance(h["model_id"], str) or not isinstance(h["symbols"], dict):
        raise CorruptStreamError("image header model, model_id or symbols field has the wrong type")
    e, mode = h["max_error"], h["residual"]
    if (e is None) != (mode is None) or (e is not None and (not isinstance(e, (int, float)) or e < 0)):
        raise CorruptStreamError(f"image header max_error {e!r} / residual {mode!r} are inconsistent")
    if mode is not None:
        meta = ImageMeta(h["dtype"], tuple(shape), float(rng[0]), float(rng[1]))
        if mode != residual.mode_for(meta, e):
            raise CorruptStreamError(f"residual mode {mode!r} does not match dtype {h['dtype']} and max_error {e}")
        need = {"mask", "residual"} | ({"exceptions", "exception_bits"} if mode == "float" else set())
        if not need <= set(sections):
            raise CorruptStreamError(f"image lacks sections {sorted(need - set(sections))}")
    coding = h.get("coding")
    if fmt == latents.RANS and not (isinstance(coding, dict) and set(coding) == set(h["symbols"])
                                    and all(v in latents.CODINGS for v in coding.values())):
        raise CorruptStreamError(f"image header coding {coding!r} does not name {latents.CODINGS} for each symbol section")
    for name in sorted(latents.section_names(h["format"], h["symbols"])):
        if name not in sections:
            raise CorruptStreamError(f"image lacks the symbol section {name!r}")
    return h
