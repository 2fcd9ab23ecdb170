"""``visemz.compress`` and ``visemz.decompress``: an image to .vsz bytes and back, one codec per device.

``decompress`` reads every file visemz writes: an image (kind "image") and a page stack (kind
"pages", what folder jobs write for a multi-page TIFF), so a file the ``visemz`` command wrote
decodes here too.
"""

from __future__ import annotations

import functools

import numpy as np

from .image import pages
from .image.codec import ImageCodec
from .models.registry import DEFAULT_MODEL, DEFAULT_QUALITY


@functools.lru_cache(maxsize=4)
def _codec(device: str | None) -> ImageCodec:
    return ImageCodec(device)


def compress(image, *, model: str = DEFAULT_MODEL, quality: float = DEFAULT_QUALITY, max_error=None,
             device: str | None = None, tile: int | None = None, refine: int | None = None) -> bytes:
    """Compress an HxW or HxWxC image (uint8, uint16, int16 or float32; NumPy, cupy or torch) to .vsz bytes;
    ``quality`` is a float in [1, 8] on CompressAI's lambda ladder (with ``max_error``, also ``"auto"``: the
    smallest file of a few qualities).  An image larger than ``tile``
    pixels (a multiple of 64; default ``VISEMZ_TILE``) is compressed tile by tile.  ``refine``: steps
    of encoder-side latent refinement (default ``VISEMZ_REFINE``, 0: none), slower encoding for
    a lower rate-distortion cost, decoded as ever (``visemz/image/refine.py``)."""
    return _codec(device).compress(image, model=model, quality=quality, max_error=max_error, tile=tile,
                                   refine=refine)


def decompress(buf, *, device: str | None = None, region=None) -> np.ndarray:
    """Decompress .vsz bytes to a NumPy array of the original dtype and shape: HxW[xC] for an
    image, (P, H, W[, C]) for a page stack.  ``region`` (y0, y1, x0, x1) decodes only that window
    (of every page of a stack), from only the tiles it needs."""
    pixels, _paged = pages.decode(buf, _codec(device).decompress, region)
    return pixels
