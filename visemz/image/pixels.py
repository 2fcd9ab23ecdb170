"""Images <-> model tensors: dtypes, value ranges, channel layouts, padding.

Inputs are HxW or HxWxC arrays (NumPy, cupy or torch) of uint8, uint16, int16 or float32.
uint8 maps 0..255 to [0, 1]; uint16 and float32 map their own [min, max] to [0, 1]
and keep that range in the file header.  int16 (CT slices in Hounsfield units, signed detector
data) is coded as the uint16 image of x + 32768, which is exact both ways; its header names
int16 and gives its range in its own levels.  Three channels use the RGB models; any other
channel count is coded as a batch of grayscale planes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from .. import config, defaults
from ..errors import InvalidArgumentError, LimitExceededError, UnsupportedFormatError

DTYPES = ("uint8", "uint16", "float32", "int16")  # what an image may be, in a file's header too
CODED = ("uint8", "uint16", "float32")  # what the codec codes: a signed image as its unsigned twin
SIGNED_OFFSET = {"int16": 32768}  # a signed image is coded as the uint16 image of x + its offset
PAD = 64  # the models downsample by 64 (hyperprior); pad to a multiple of it
MAX_PIXELS = 1 << 30  # the format's ceiling on an image's values; VISEMZ_MAX_PIXELS sets the limit in force
MAX_CHANNELS = 64
NUMERIC_KINDS = "biufc"  # the NumPy dtype kinds torch holds (the others are refused by name before any copy)
# The largest error bound per dtype: an integer image's whole range (a larger bound allows nothing more),
# a float32 image's largest float32 (the bound must be one, so a decoder can hold the file to it).
MAX_ERROR = {"uint8": 255, "uint16": 65535, "int16": 65535, "float32": float(np.finfo(np.float32).max)}


def check_pixels(values: int, what: str) -> None:
    """An image's (or a page stack's) number of values against the limit in force (``VISEMZ_MAX_PIXELS``)."""
    limit = defaults.get("max_pixels")
    if values > limit:
        raise LimitExceededError(f"{what}: {values} values exceed the limit of {limit} (VISEMZ_MAX_PIXELS)")


def max_error_limit(dtype: str):
    return MAX_ERROR[dtype]


@dataclass(frozen=True)
class ImageMeta:
    dtype: str
    shape: tuple[int, ...]
    lo: float
    hi: float

    @property
    def height(self) -> int:
        return self.shape[0]

    @property
    def width(self) -> int:
        return self.shape[1]

    @property
    def channels(self) -> int:
        return self.shape[2] if len(self.shape) == 3 else 1

    @property
    def variant(self) -> str:
        return "rgb" if self.channels == 3 else "gray"

    @property
    def padded(self) -> tuple[int, int]:
        return (-(-self.height // PAD) * PAD, -(-self.width // PAD) * PAD)


def as_tensor(image, device: str) -> torch.Tensor:
    """NumPy, cupy or torch -> torch tensor on ``device`` (no copy when already there)."""
    if isinstance(image, torch.Tensor):
        if image.device.type == "meta":
            raise UnsupportedFormatError("a tensor on the meta device has no values to compress")
        return image.to(device)
    if hasattr(image, "__cuda_array_interface__"):
        return torch.as_tensor(image, device="cuda").to(device)
    if isinstance(image, np.ndarray):
        if image.dtype.kind not in NUMERIC_KINDS:  # objects, records, strings, dates: no pixels torch holds
            raise UnsupportedFormatError(f"image dtype {image.dtype}: not numbers; use one of {list(DTYPES)}")
        if not image.dtype.isnative:  # big-endian data (e.g. '>u2' from a FITS file): torch takes native order only
            image = image.astype(image.dtype.newbyteorder("="))
        return torch.from_numpy(np.ascontiguousarray(image)).to(device)
    raise UnsupportedFormatError(f"expected a NumPy, cupy or torch array, got {type(image).__name__}")


def check_max_error(max_error, dtype: str):
    e = config.check_max_error(max_error)
    if e is None:
        return None
    if dtype in MAX_ERROR and e > MAX_ERROR[dtype]:
        raise InvalidArgumentError(f"max_error={max_error!r} exceeds the largest bound of a {dtype} image, "
                                   f"{MAX_ERROR[dtype]:g}")
    if dtype != "float32":
        if e != int(e):
            raise InvalidArgumentError(f"max_error={max_error!r} must be a whole number of {dtype} levels")
        return int(e)
    return e


def coded_view(t: torch.Tensor) -> tuple[torch.Tensor, str | None]:
    """(the image the codec codes, the signed dtype it stands for or None): an int16 image as the uint16 image of
    x + 32768, on its own device; any other as it is.  x + 32768 modulo 2^16 is x with its sign bit flipped, so
    one int16 copy and a view make it (no int32 copy of a large image)."""
    name = str(t.dtype).replace("torch.", "")
    if name not in SIGNED_OFFSET:
        return t, None
    return (t ^ -SIGNED_OFFSET[name]).view(torch.uint16), name


def signed_view(px, dtype: str):
    """Decoded pixels (NumPy or torch) of a coded image back in the file's ``dtype``: an int16 image's uint16
    twin minus 32768 (the sign bit flipped back, as ``coded_view``); any other dtype as they are."""
    if dtype not in SIGNED_OFFSET:
        return px
    if isinstance(px, np.ndarray):
        return px.view(np.int16) ^ np.int16(-SIGNED_OFFSET[dtype])
    return px.view(torch.int16) ^ -SIGNED_OFFSET[dtype]


def coded_meta(dtype: str, shape: tuple[int, ...], lo: float, hi: float) -> ImageMeta:
    """The coded image's meta of a header's ``dtype`` and ``range`` (a signed image's range shifted as its pixels)."""
    if dtype not in SIGNED_OFFSET:
        return ImageMeta(dtype, shape, lo, hi)
    return ImageMeta("uint16", shape, lo + SIGNED_OFFSET[dtype], hi + SIGNED_OFFSET[dtype])


def describe(t: torch.Tensor) -> ImageMeta:
    """The meta of a coded image (``coded_view``'s), or an error naming a dtype or shape the codec does not take."""
    name = str(t.dtype).replace("torch.", "")
    if name not in CODED:
        raise UnsupportedFormatError(f"image dtype {name} is not supported: use one of {list(DTYPES)}")
    if t.dim() not in (2, 3):
        raise UnsupportedFormatError(f"image of shape {tuple(t.shape)}: expected HxW or HxWxC")
    if t.numel() == 0:
        raise InvalidArgumentError(f"image of shape {tuple(t.shape)} is empty")
    if t.dim() == 3 and t.shape[2] > MAX_CHANNELS:
        raise UnsupportedFormatError(f"image with {t.shape[2]} channels: at most {MAX_CHANNELS} (is it CxHxW?)")
    check_pixels(t.numel(), f"image of shape {tuple(t.shape)}")
    if name == "uint8":
        lo, hi = 0.0, 255.0
    else:
        if name == "float32" and not bool(torch.isfinite(t).all()):
            raise InvalidArgumentError("float32 image holds NaN or Inf values")
        w = t.to(torch.int32) if name == "uint16" else t  # torch's uint16 lacks min/max
        lo, hi = float(w.min()), float(w.max())
    return ImageMeta(name, tuple(int(s) for s in t.shape), lo, hi)


def to_batch(t: torch.Tensor, meta: ImageMeta, window: tuple[int, int, int, int] | None = None,
             device: str | None = None) -> torch.Tensor:
    """Image -> (B, C, Hp, Wp) float32 in [0, 1], edge-padded to multiples of 64.

    ``window`` (y0, y1, x0, x1) of the padded image (default: all of it) gives that part alone,
    edge-padded as the whole would be; only its pixels move to ``device`` (default: t's)."""
    y0, y1, x0, x1 = window or (0, meta.padded[0], 0, meta.padded[1])
    t = t[y0:min(y1, meta.height), x0:min(x1, meta.width)]
    if device is not None:
        t = t.to(device)
    x = t.to(torch.int32) if meta.dtype == "uint16" else t
    x = x.to(torch.float64 if meta.dtype == "float32" else torch.float32)
    x = (x - meta.lo) / (meta.hi - meta.lo) if meta.hi > meta.lo else torch.zeros_like(x)
    x = planes(x.to(torch.float32), meta)
    return F.pad(x, (0, x1 - x0 - x.shape[-1], 0, y1 - y0 - x.shape[-2]), mode="replicate")


def planes(t: torch.Tensor, meta: ImageMeta) -> torch.Tensor:
    """The image layout (HxW or HxWxC) -> (B, C, H, W): one batch item of 3 channels (RGB) or one item
    per plane of 1 channel (gray, and other channel counts)."""
    if t.dim() == 2:
        return t[None, None]
    return t.permute(2, 0, 1)[None] if meta.channels == 3 else t.permute(2, 0, 1)[:, None]


def from_batch(x: torch.Tensor, meta: ImageMeta) -> torch.Tensor:
    """(B, C, Hp, Wp) -> the image layout (HxW or HxWxC), cropped; values as they are."""
    x = x[:, :, : meta.height, : meta.width]
    if len(meta.shape) == 2:
        return x[0, 0]
    return x[0].permute(1, 2, 0) if meta.channels == 3 else x[:, 0].permute(1, 2, 0)


def denormalise(x01: torch.Tensor, meta: ImageMeta) -> torch.Tensor:
    """Values in [0, 1] (any float dtype) -> the original dtype and range."""
    x = x01.clamp(0, 1).to(torch.float64)
    if meta.dtype == "uint8":
        return torch.round(x * 255).to(torch.uint8)
    v = meta.lo + x * (meta.hi - meta.lo)
    if meta.dtype == "uint16":
        return torch.round(v).clamp(0, 65535).to(torch.int32).to(torch.uint16)
    return v.to(torch.float32)
