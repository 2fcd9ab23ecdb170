"""``visemz.compress`` and ``visemz.decompress``: an image to .vsz bytes and back, one codec per device.

``decompress`` reads every file visemz writes: an image (kind "image") and a page stack (kind
"pages", what folder jobs write for a multi-page TIFF), so a file the ``visemz`` command wrote
decodes here too.
"""

from __future__ import annotations

import functools

import numpy as np

from . import pages
from .codec import ImageCodec
from .models.registry import DEFAULT_MODEL, DEFAULT_QUALITY


@functools.lru_cache(maxsize=4)
def _codec(device: str | None) -> ImageCodec:
    return ImageCodec(device)


def compress(image, *, model: str = DEFAULT_MODEL, quality: float = DEFAULT_QUALITY, max_error=None,
             device: str | None = None) -> bytes:
    """Compress an HxW or HxWxC image (uint8, uint16 or float32; NumPy, cupy or torch) to .vsz bytes;
    ``quality`` is a float in [1, 8] on CompressAI's lambda ladder."""
    return _codec(device).compress(image, model=model, quality=quality, max_error=max_error)


def decompress(buf, *, device: str | None = None) -> np.ndarray:
    """Decompress .vsz bytes to a NumPy array of the original dtype and shape: HxW[xC] for an
    image, (P, H, W[, C]) for a page stack."""
    pixels, _paged = pages.decode(buf, _codec(device).decompress)
    return pixels
