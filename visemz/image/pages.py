"""Multi-page images (multi-page TIFF): a stack of pages in one .vsz container of kind "pages".

Beside the codec, so that ``visemz.decompress`` and the folder jobs read the same files.

Each page is compressed by the codec into its own image container (kind "image"); the outer
container holds them back to back, with an index of their lengths (docs/FORMAT.md, section 5):

    kind "pages", meta {"format": 1, "shape": [P, H, W] or [P, H, W, C], "dtype": "uint8"}
    sections "index" (P little-endian u64 lengths), then "pages" (the page containers, in order)

Decoding unpacks the file once (``unpack``: the outer container's checksums, then each page
container's), hands the codec the unpacked image containers, which it checks as for any image,
and checks that every page decodes to ``shape[1:]`` and ``dtype``; so the stack comes back exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from .. import container
from ..config import check_region, whole_number
from ..errors import CorruptStreamError, LimitExceededError
from .pixels import DTYPES, check_pixels

KIND = "pages"
FORMAT = 1
META_KEYS = {"format", "shape", "dtype"}
SECTIONS = ["index", "pages"]
MAX_PAGES = 1 << 16


def dtype_name(x) -> str:
    """'uint8', 'uint16', 'float32', ... of a NumPy array or a torch tensor."""
    return str(x.dtype).replace("torch.", "")


def encode(stack, compress_page: Callable[[object], bytes]) -> bytes:
    """(P, H, W[, C]) stack -> a "pages" container; ``compress_page`` turns one page into image bytes."""
    pages = int(stack.shape[0])
    if pages > MAX_PAGES:
        raise LimitExceededError(f"{pages} pages exceed the limit of {MAX_PAGES}")
    check_pixels(math.prod(stack.shape), f"page stack of shape {tuple(stack.shape)}")  # what a reader allows
    bufs = [compress_page(stack[k]) for k in range(pages)]
    index = np.array([len(b) for b in bufs], dtype="<u8").tobytes()
    meta = {"format": FORMAT, "shape": [int(s) for s in stack.shape], "dtype": dtype_name(stack)}
    return container.pack(KIND, meta, {"index": index, "pages": b"".join(bufs)})


@dataclass(frozen=True)
class Unpacked:
    """A .vsz file unpacked once, each of its checksums checked once: its image containers."""

    images: list[container.Container]  # the file itself (any kind but "pages": the codec judges it), or its pages
    stack: tuple[tuple[int, ...], str] | None = None  # a page stack's (shape, dtype); None for one image


def unpack(buf) -> Unpacked:
    """.vsz bytes (an image file or a pages file) -> its image containers, checked as containers."""
    c = container.unpack(buf)
    if c.kind != KIND:
        return Unpacked([c])
    shape, dtype, page_bufs = _parse(c)
    images = [container.unpack(page) for page in page_bufs]
    for k, page in enumerate(images):  # what each page holds, from its header, before any page is decoded
        if page.kind != "image" or page.meta.get("shape") != list(shape[1:]) or page.meta.get("dtype") != dtype:
            raise CorruptStreamError(f"page {k}'s header (kind {page.kind!r}, shape {page.meta.get('shape')!r}, dtype "
                                     f"{page.meta.get('dtype')!r}) is not the file's: images of {list(shape[1:])} "
                                     f"{dtype}")
    return Unpacked(images, (shape, dtype))


def decode(buf, decode_image: Callable, region=None) -> tuple[object, bool]:
    """An image file or a pages file (bytes, or ``unpack``'s result) -> (pixels, paged), with
    ``decode_image`` (an unpacked image container, region -> array).

    ``decode_image`` may return NumPy arrays or torch tensors; the stack is of the same kind.
    ``region`` (y0, y1, x0, x1), when given, is decoded from every page."""
    f = buf if isinstance(buf, Unpacked) else unpack(buf)
    if f.stack is None:
        return decode_image(f.images[0], region), False  # the codec validates image files (and refuses other kinds)
    shape, dtype = f.stack
    if region is not None:
        y0, y1, x0, x1 = check_region(region, shape[1:])
        shape = (shape[0], y1 - y0, x1 - x0, *shape[3:])
    stack = None
    for k, page in enumerate(f.images):
        img = decode_image(page, region)
        if tuple(img.shape) != shape[1:] or dtype_name(img) != dtype:
            raise CorruptStreamError(f"page {k} decodes to {tuple(img.shape)} {dtype_name(img)}, "
                                     f"the file says {shape[1:]} {dtype}")
        if stack is None:
            stack = _empty_like_stack(img, shape)
        stack[k] = img  # a copy (uint16 CUDA tensors copy, where torch.stack may not be implemented)
    return stack, True


def _empty_like_stack(page, shape: tuple[int, ...]):
    if isinstance(page, np.ndarray):
        return np.empty(shape, dtype=page.dtype)
    return torch.empty(shape, dtype=page.dtype, device=page.device)


def page_buffers(c: container.Container) -> list[memoryview]:
    """The page containers of a (validated) pages container."""
    return _parse(c)[2]


def _parse(c: container.Container) -> tuple[tuple[int, ...], str, list[memoryview]]:
    """Validate a pages container strictly; (shape, dtype, page buffers)."""
    meta = c.meta
    container.check_meta(meta, META_KEYS, KIND, FORMAT, DTYPES)
    shape = meta["shape"]
    if not (isinstance(shape, list) and len(shape) in (3, 4)
            and all(whole_number(s) and s >= 1 for s in shape)):
        raise CorruptStreamError(f"pages shape {shape!r} is not [P, H, W] or [P, H, W, C]")
    if shape[0] > MAX_PAGES:
        raise LimitExceededError(f"pages file claims {shape[0]} pages; the limit is {MAX_PAGES}")
    check_pixels(math.prod(shape), f"pages shape {shape}")  # the whole stack is allocated: all its values count
    if list(c.sections) != SECTIONS:
        raise CorruptStreamError(f"pages file has sections {list(c.sections)}, expected {SECTIONS}")
    index, body = c.sections["index"], c.sections["pages"]
    if len(index) != 8 * shape[0]:
        raise CorruptStreamError(f"pages index holds {len(index)} bytes for {shape[0]} pages")
    lengths = np.frombuffer(index, dtype="<u8")
    # each length at most the body, so the sum of at most MAX_PAGES of them cannot wrap around
    if (lengths == 0).any() or (lengths > len(body)).any() or int(lengths.sum()) != len(body):
        raise CorruptStreamError(f"page lengths {lengths[:4].tolist()}... do not split the {len(body)}-byte pages "
                                 "section")
    ends = np.cumsum(lengths).tolist()
    starts = [0] + ends[:-1]
    return tuple(shape), meta["dtype"], [body[a:b] for a, b in zip(starts, ends)]
