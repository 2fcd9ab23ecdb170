"""The error-bound residual: |x - decoded| <= E for every pixel, whatever the network did.

The network's output is turned into an integer *base* that encoder and decoder
compute identically, even on different devices: the synthesis runs in float64 and is
rounded to 8-bit levels k = round(255 x_hat).  Pixels whose 255 x_hat lies within EPS
of a rounding boundary (where a GPU and a CPU could round differently) are listed in
a sparse mask and take floor() on both sides.  Then:

- integer images: r = x - base, q = floor((r + E) / (2E + 1)), decoded x = base + q (2E + 1);
- float32, E = 0: q = bits(x) - bits(float32(base)) as int32, exact;
- float32, E > 0: q = round((x - base) / 2E); pixels that float rounding would push past E
  are stored exactly in an exception list.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from ..device import ints_to_torch, torch_to_ints
from ..encoders import EncoderConfig, encode_ints_many
from ..errors import CorruptStreamError
from .pixels import ImageMeta

EPS = 1e-6  # in 8-bit levels; float64 synthesis differs across devices by ~1e-11 here
_I32 = 1 << 31


def _levels(x01: torch.Tensor, mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """8-bit levels of the float64 synthesis, and the ambiguous pixels (within EPS of .5)."""
    v = x01.to(torch.float64).clamp(0, 1) * 255
    f = torch.floor(v)
    amb = (v - f - 0.5).abs() < EPS
    k = torch.where(amb if mask is None else mask, f, torch.floor(v + 0.5))
    return k.to(torch.int64), amb


def _base(k: torch.Tensor, meta: ImageMeta) -> torch.Tensor:
    if meta.dtype == "float32":
        return meta.lo + k.to(torch.float64) * ((meta.hi - meta.lo) / 255.0)
    lo, span = int(meta.lo), int(meta.hi) - int(meta.lo)
    return lo + (k * span + 127) // 255


def _wrap32(t: torch.Tensor) -> torch.Tensor:
    return (torch.remainder(t + _I32, 1 << 32) - _I32).to(torch.int32)


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float32).contiguous().view(torch.int32).to(torch.int64)


def _indices_to_ints(idx: torch.Tensor) -> object:
    """Sorted flat indices -> first index then gaps (small numbers compress well)."""
    return torch_to_ints(torch.diff(idx, prepend=idx.new_zeros(1)) if idx.numel() else idx)


def _ints_to_indices(buf, n_pixels: int, device: str) -> torch.Tensor:
    gaps = ints_to_torch(buf, device, max_count=n_pixels).to(torch.int64)
    idx = torch.cumsum(gaps, 0)
    if idx.numel() and (bool((gaps[1:] <= 0).any()) or int(idx[0]) < 0 or int(idx[-1]) >= n_pixels):
        raise CorruptStreamError("error-bound index list is not increasing within the image")
    return idx


def mode_for(meta: ImageMeta, e: float) -> str:
    if meta.dtype != "float32":
        return "int"
    if e == 0 or (meta.hi - meta.lo) / (2 * e) > 2**30:  # steps too fine for int32: exact bits
        return "bits"
    return "float"


def encode(x: torch.Tensor, x01_hat: torch.Tensor, meta: ImageMeta, e: float, **enc) -> tuple[dict, str]:
    """Original image and float64 synthesis (both in image layout) -> residual sections, mode."""
    k, amb = _levels(x01_hat, None)
    base = _base(k, meta).reshape(-1)
    xf = (x.to(torch.int32) if meta.dtype == "uint16" else x).reshape(-1)
    mode = mode_for(meta, e)
    cfg = EncoderConfig(**enc)
    arrays = {"mask": _indices_to_ints(torch.nonzero(amb.reshape(-1)).reshape(-1))}
    if mode == "int":
        q = torch.div(xf.to(torch.int64) - base + int(e), 2 * int(e) + 1, rounding_mode="floor")
    elif mode == "bits":
        q = _wrap32(_bits(xf) - _bits(base))
    else:
        q = torch.round((xf.to(torch.float64) - base) / (2 * e))
        approx = (base + q * (2 * e)).to(torch.float32).to(torch.float64)
        bad = torch.nonzero((approx - xf.to(torch.float64)).abs() > e).reshape(-1)
        arrays["exceptions"] = _indices_to_ints(bad)
        arrays["exception_bits"] = torch_to_ints(_bits(xf[bad]))
    arrays["residual"] = torch_to_ints(q)
    # the sections go to the entropy stage together (on a GPU they share launches); the residual is dense: widths
    # per block
    cfgs = {k: replace(cfg, policy="block") if k == "residual" else cfg for k in arrays}
    sections = dict(zip(arrays, encode_ints_many([(a, cfgs[k]) for k, a in arrays.items()])))
    return sections, mode


def decode(sections: dict, x01_hat: torch.Tensor, meta: ImageMeta, e: float, mode: str) -> torch.Tensor:
    """Residual sections + float64 synthesis (image layout) -> the image, |x - result| <= E."""
    dev = str(x01_hat.device)
    n = x01_hat.numel()
    mask = torch.zeros(n, dtype=torch.bool, device=dev)
    mask[_ints_to_indices(sections["mask"], n, dev)] = True
    k, _ = _levels(x01_hat, mask.reshape(x01_hat.shape))
    base = _base(k, meta).reshape(-1)
    q = ints_to_torch(sections["residual"], dev, count=n).to(torch.int64)
    if mode == "int":
        out = (base + q * (2 * int(e) + 1)).clamp(0, 255 if meta.dtype == "uint8" else 65535)
        out = out.to(torch.uint8) if meta.dtype == "uint8" else out.to(torch.int32).to(torch.uint16)
    elif mode == "bits":
        out = _wrap32(_bits(base) + q).view(torch.float32)
    else:
        out = (base + q.to(torch.float64) * (2 * e)).to(torch.float32)
        idx = _ints_to_indices(sections["exceptions"], n, dev)
        bits = ints_to_torch(sections["exception_bits"], dev, count=idx.numel())
        out[idx] = bits.to(torch.int32).view(torch.float32)
    if meta.dtype == "float32" and not bool(torch.isfinite(out).all()):  # the inputs were finite: damage
        raise CorruptStreamError("error-bound residual decodes to values that are not finite")
    return out.reshape(meta.shape)
