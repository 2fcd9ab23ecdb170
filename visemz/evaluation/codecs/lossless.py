"""The lossless and near-lossless coders users already have, through imagecodecs on the CPU.

PNG, JPEG-LS (lossless and near-lossless: its NEAR parameter is the maximum error), JPEG 2000
reversible (the 5/3 wavelet), JPEG XL lossless (effort 7, libjxl's default) and WebP lossless.
Each is an error-bounded codec whose settings are maximum errors E in levels of the image's
own dtype (16-bit levels on a 16-bit image); only JPEG-LS has settings above 0.  The coders
run on one thread each, so their seconds are one core's.
"""

from __future__ import annotations

from abc import abstractmethod

import numpy as np

from ...errors import CorruptStreamError, VisemzError
from .base import Codec, Layout

try:  # the 'eval' extra
    import imagecodecs
except ImportError:
    imagecodecs = None

LOSSLESS = (0,)
NEAR_LOSSLESS = (0, 1, 2, 4, 8)  # JPEG-LS and visemz's max_error ladder: lossless, then E in the image's levels
JPEGXL_EFFORT = 7  # libjxl's default effort
PNG_LEVEL = 9  # zlib's strongest level
# cwebp -lossless's defaults: its strongest setting (method 6, quality 100, -z 9) took 15-25x the time for
# 0-2% fewer bits on 512 x 512 X-ray and Kodak crops
WEBP_METHOD, WEBP_LEVEL = 4, 75
THREADS = 1


def installed() -> bool:
    return imagecodecs is not None


def need_imagecodecs(name: str) -> None:
    if imagecodecs is None:
        raise VisemzError(f"codec {name!r} needs imagecodecs: pip install 'visemz[eval]'")


def gray_or_rgb(layout: Layout, name: str, dtypes=("uint8", "uint16")) -> str | None:
    """Why ``name`` cannot code images of ``layout`` (None: it can)."""
    if layout.dtype not in dtypes:
        return f"{name} codes {' and '.join(dtypes)} images only"
    if layout.channels not in (1, 3):
        return f"{name} codes gray or RGB images only"
    return None


def as_layout(decoded, layout: Layout, name: str) -> np.ndarray:
    """A library's decoded array in the original's shape, or CorruptStreamError when it holds something else."""
    out = np.asarray(decoded)
    if out.size != int(np.prod(layout.shape)) or out.dtype.name != layout.dtype:
        raise CorruptStreamError(f"{name} decoded a {out.shape} {out.dtype} array, not {layout.shape} {layout.dtype}")
    return out.reshape(layout.shape)


class LosslessCodec(Codec):
    """An imagecodecs coder with settings E (maximum error in the image's levels); E = 0 is lossless."""

    unit, kind = "e", "bound"
    ladder = LOSSLESS
    dtypes = ("uint8", "uint16")
    modules = ("imagecodecs",)

    def __init__(self):
        need_imagecodecs(self.name)

    def supports(self, layout):
        return gray_or_rgb(layout, self.name, self.dtypes)

    def decode(self, data, setting, layout) -> np.ndarray:
        return as_layout(self._decode(data, layout), layout, self.name)

    @abstractmethod
    def _decode(self, data: bytes, layout: Layout) -> np.ndarray: ...


class PNG(LosslessCodec):
    name = "png"
    description = f"PNG (libpng, zlib level {PNG_LEVEL})"

    def encode(self, image, setting) -> bytes:
        return bytes(imagecodecs.png_encode(image, level=PNG_LEVEL))

    def _decode(self, data, layout):
        return imagecodecs.png_decode(data)


class JPEGLS(LosslessCodec):
    """JPEG-LS (CharLS): NEAR = E, so E = 0 is lossless and E > 0 near-lossless with the same guarantee."""

    name = "jpegls"
    description = "JPEG-LS (CharLS; NEAR = E; RGB components coded without a colour transform)"
    ladder = NEAR_LOSSLESS

    def encode(self, image, setting) -> bytes:
        return bytes(imagecodecs.jpegls_encode(image, level=int(setting)))

    def _decode(self, data, layout):
        return imagecodecs.jpegls_decode(data)


class JPEG2000Reversible(LosslessCodec):
    """JPEG 2000 with the reversible 5/3 wavelet (OpenJPEG; the colour transform RCT on RGB), J2K codestream."""

    name = "jpeg2000-lossless"
    description = "JPEG 2000 reversible 5/3 (OpenJPEG, J2K codestream, RCT on RGB)"

    def encode(self, image, setting) -> bytes:
        return bytes(imagecodecs.jpeg2k_encode(image, level=0, reversible=True, codecformat="j2k", mct=True,
                                               numthreads=THREADS))

    def _decode(self, data, layout):
        return imagecodecs.jpeg2k_decode(data, numthreads=THREADS)


class JPEGXLLossless(LosslessCodec):
    name = "jpegxl-lossless"
    description = f"JPEG XL lossless (libjxl, effort {JPEGXL_EFFORT})"

    def encode(self, image, setting) -> bytes:
        return bytes(imagecodecs.jpegxl_encode(image, lossless=True, effort=JPEGXL_EFFORT, numthreads=THREADS))

    def _decode(self, data, layout):
        return imagecodecs.jpegxl_decode(data, numthreads=THREADS)


class WebPLossless(LosslessCodec):
    """WebP lossless (8-bit RGB only: a gray image is coded as R = G = B and decoded from R)."""

    name = "webp-lossless"
    description = f"WebP lossless (libwebp, method {WEBP_METHOD}, quality {WEBP_LEVEL})"
    dtypes = ("uint8",)

    def encode(self, image, setting) -> bytes:
        rgb = np.repeat(image[..., None], 3, axis=2) if image.ndim == 2 else image
        return bytes(imagecodecs.webp_encode(np.ascontiguousarray(rgb), level=WEBP_LEVEL, lossless=True,
                                             method=WEBP_METHOD, numthreads=THREADS))

    def _decode(self, data, layout):
        rgb = imagecodecs.webp_decode(data)
        if layout.channels == 3:
            return rgb
        if rgb.shape != (*layout.shape, 3):
            raise CorruptStreamError(f"{self.name} decoded a {rgb.shape} array, not {layout.shape} as R = G = B")
        return rgb[..., 0]


CODECS = {c.name: c for c in (PNG, JPEGLS, JPEG2000Reversible, JPEGXLLossless, WebPLossless)}
