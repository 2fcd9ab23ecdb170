"""Reading images on the CPU: OpenCV for common formats, tifffile for TIFF, NumPy for .npy.

Every failure (unreadable, empty, not a regular file, not an image, unsupported layout, too large
for memory) is an ``InputError`` naming the file, so a folder job can report it and go on.  Inputs
are opened read-only and read whole into memory first: every decoder works on those bytes (OpenCV's
``imdecode``, never ``imread``, which crashed on file names that are not UTF-8), and the bytes give
the file's identity (``files.Identity``) that a job records.

A multi-page TIFF is read as one stack of pages, (P, H, W) or (P, H, W, C); its pages must
share one shape and dtype; so is a .npy volume, (Z, H, W) unless its last axis is short enough for
an image's channels (at most ``pixels.MAX_CHANNELS`` and shorter than both others), or any 4-D .npy.
Folder jobs compress such a stack into one "pages" file (``visemz/image/pages.py``) and restore it whole.
"""

from __future__ import annotations

import io
import math
import os
import stat
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import PIL.Image
import tifffile

try:
    import pydicom
except ImportError:  # optional: DICOM files are read when it is installed
    pydicom = None

from ..errors import VisemzError
from ..image.pixels import MAX_CHANNELS, check_pixels
from .files import Identity, shown


class InputError(VisemzError, ValueError):
    """An input file cannot be read as an image."""


@dataclass(frozen=True)
class Picture:
    """What a loader read: one image (HxW[xC]) or, when ``paged``, a stack of pages (PxHxW[xC]).

    ``pixels`` is a NumPy array (CPU loader) or a CUDA tensor (DALI, kvikio)."""

    pixels: Any
    paged: bool = False
    loader: str = "cpu"
    note: str = ""  # why a GPU loader left this file to the CPU loader
    source: Identity | None = None  # the file as it was read (the CPU loader knows it)

    @property
    def page_shape(self) -> tuple[int, ...]:
        return tuple(self.pixels.shape[1:] if self.paged else self.pixels.shape)

    @property
    def nbytes(self) -> int:
        return int(self.pixels.nbytes)  # NumPy arrays and torch tensors alike


def read_file(path: Path) -> tuple[bytes, Identity]:
    """The bytes of a regular file and its identity; ``InputError`` for anything else."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a pipe must not block the job
    except OSError as e:
        raise InputError(f"cannot read '{shown(path)}': {e.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InputError(f"'{shown(path)}' is not a regular file (a device, a pipe, a socket or a folder)")
        if st.st_size == 0:
            raise InputError(f"'{shown(path)}' is empty")
        try:
            data = f.read()
        except OSError as e:
            raise InputError(f"cannot read '{shown(path)}': {e.strerror}") from None
        except MemoryError:
            raise InputError(f"'{shown(path)}': its {st.st_size} bytes do not fit in memory") from None
    return data, Identity.of_bytes(data, st)


def load(path: Path) -> Picture:
    """Read an image, or the page stack of a multi-page TIFF, in the file's own dtype (RGB order)."""
    data, source = read_file(path)
    declared = declared_values(data, path.suffix.lower())
    if declared is not None:  # before decoding: a small file can hold a huge image (a PNG of zeros)
        check_pixels(declared, f"'{shown(path)}'")
    try:
        img, paged = decode(data, path.suffix.lower())
    except InputError as e:
        raise InputError(f"'{shown(path)}': {e}") from None
    except MemoryError:
        raise InputError(f"'{shown(path)}': the image does not fit in memory") from None
    except Exception as e:  # decoders raise many types on damaged files; all mean "not readable"
        raise InputError(f"cannot decode '{shown(path)}': {type(e).__name__}: {e}") from None
    del data
    if img.ndim - paged not in (2, 3):
        raise InputError(f"'{shown(path)}' holds an array of shape {img.shape}, not HxW or HxWxC"
                         + (" pages" if paged else ""))
    if img.dtype.byteorder not in ("=", "|"):  # big-endian .npy or TIFF: native order for torch and the GPU
        img = img.astype(img.dtype.newbyteorder("="))
    return Picture(img, paged, source=source)


def decode(data: bytes, ext: str) -> tuple[np.ndarray, bool]:
    """(pixels, paged) of a file's bytes, by its extension (lower case, with the dot)."""
    if ext == ".npy":
        img = np.load(io.BytesIO(data), allow_pickle=False)
        return img, img.ndim == 4 or (img.ndim == 3 and not _channels_last(img.shape))
    if ext in (".tif", ".tiff"):
        return _tiff(data)
    if ext == ".dcm":
        return _dicom(data), False
    return _opencv(data), False


def declared_values(data: bytes, ext: str) -> int | None:
    """The number of values a file's header declares (a PNG's IHDR, a TIFF's pages, a .npy's shape), read without
    decoding; None for other formats or a header that cannot be read (decoding then reports it)."""
    png = png_header(io.BytesIO(data))
    if png is not None:
        return png.width * png.height * png.channels
    try:
        if ext == ".npy":
            f = io.BytesIO(data)
            major, _ = np.lib.format.read_magic(f)
            read_header = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
            return math.prod(read_header(f)[0])
        if ext in (".tif", ".tiff"):
            with tifffile.TiffFile(io.BytesIO(data)) as tif:
                return sum(math.prod(page.shape) for page in tif.pages)
    except Exception:  # noqa: BLE001 - a damaged header: the decoder names what is wrong
        return None
    return None


def _channels_last(shape: tuple[int, int, int]) -> bool:
    """Whether a 3-D array is an image's H x W x C, not a volume's Z x H x W: its last axis few enough for channels
    and shorter than both others (a (3, 64, 64) volume is not a 3 x 64 image of 64 channels)."""
    return shape[2] <= MAX_CHANNELS and shape[2] < min(shape[0], shape[1])


def load_image(path: Path) -> np.ndarray:
    """HxW or HxWxC array (RGB channel order) of the file's own dtype; a single image only."""
    pic = load(path)
    if pic.paged:
        raise InputError(f"'{shown(path)}' is a multi-page TIFF ({pic.pixels.shape[0]} pages); "
                         "a single image is needed here")
    return pic.pixels


PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
PNG_GRAY_ALPHA = 4  # the IHDR chunk's colour type of a gray and alpha PNG
MAX_PNG_CHUNKS = 4096  # chunks before the image data that png_header reads before giving up


def _opencv(data: bytes) -> np.ndarray:
    img = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
    if img is None:
        raise InputError("not an image OpenCV can decode")
    if img.ndim == 3 and img.shape[2] == 4 and _gray_alpha_png(data):
        return np.ascontiguousarray(img[..., [0, 3]])  # OpenCV spreads the gray over B, G and R: back to 2 channels
    if img.ndim == 3 and img.shape[2] == 3:
        img = cv2.cvtColor(img, cv2.COLOR_BGR2RGB)
    elif img.ndim == 3 and img.shape[2] == 4:
        img = cv2.cvtColor(img, cv2.COLOR_BGRA2RGBA)
    return img


def _gray_alpha_png(data: bytes) -> bool:
    """Whether the bytes are a PNG whose header says gray and alpha."""
    png = png_header(io.BytesIO(data))
    return png is not None and png.colour == PNG_GRAY_ALPHA


@dataclass(frozen=True)
class PngHeader:
    width: int
    height: int
    depth: int  # bits per sample
    colour: int  # the IHDR colour type
    transparency: bool | None  # a tRNS chunk before the image data (None: the chunks before it could not be read)

    @property
    def channels(self) -> int:
        """Channels of the decoded image: OpenCV expands a palette to RGB, and a palette or RGB image with a tRNS
        chunk to RGBA (a gray one stays gray); this loader turns OpenCV's gray and alpha back into two channels.
        Where the chunks could not be read, the most the image may decode to."""
        if self.colour in (2, 3):
            return 3 if self.transparency is False else 4
        return {0: 1, 4: 2, 6: 4}.get(self.colour, 4)


def png_header(f) -> PngHeader | None:
    """A PNG's header from a binary stream at the file's start: IHDR (the first chunk after the signature) and
    whether a tRNS chunk comes before the image data, read chunk by chunk up to the first IDAT (at most
    ``MAX_PNG_CHUNKS``); None for other bytes or an IHDR cut short."""
    head = f.read(33)
    if len(head) < 33 or head[:8] != PNG_SIGNATURE or head[12:16] != b"IHDR":
        return None
    width, height, depth, colour = struct.unpack(">IIBB", head[16:26])
    transparency = None
    for _ in range(MAX_PNG_CHUNKS):
        chunk = f.read(8)
        if len(chunk) < 8:
            break
        length, kind = struct.unpack(">I4s", chunk)
        if kind in (b"IDAT", b"IEND", b"tRNS"):
            transparency = kind == b"tRNS"
            break
        f.seek(length + 4, 1)  # data and CRC
    return PngHeader(width, height, depth, colour, transparency)


def _tiff(data: bytes) -> tuple[np.ndarray, bool]:
    """(image, False) for a single page, (stack of pages, True) for several."""
    with tifffile.TiffFile(io.BytesIO(data)) as tif:
        pages = list(tif.pages)
        if len(pages) == 1:
            return _page_pixels(pages[0]), False
        first = (pages[0].shape, pages[0].dtype)
        for k, p in enumerate(pages):
            if (p.shape, p.dtype) != first:
                raise InputError(f"page {k} is {p.shape} {p.dtype}, page 0 is {first[0]} {first[1]}; "
                                 "the pages of a multi-page TIFF must share one shape and dtype")
        return np.stack([_page_pixels(p) for p in pages]), True


def _page_pixels(page) -> np.ndarray:
    """A TIFF page as HxW[xC].  A planar page (PlanarConfiguration 2: each sample stored as a plane
    of its own, tifffile's axes 'SYX') is read samples-first; its samples move to the last axis,
    where every other loader puts channels."""
    img = page.asarray()
    if page.axes.startswith("S") and img.ndim == 3:
        img = np.ascontiguousarray(np.moveaxis(img, 0, -1))
    return img


def _dicom(data: bytes) -> np.ndarray:
    if pydicom is None:
        raise InputError("a DICOM file, and pydicom is not installed")
    return pydicom.dcmread(io.BytesIO(data)).pixel_array


def save_image(path: Path, img: np.ndarray, fmt: str, paged: bool = False) -> bytes:
    """Encode an image (or a page stack, as a multi-page TIFF) as PNG, TIFF or .npy bytes.

    The caller writes them atomically."""
    if fmt == "npy":
        buf = io.BytesIO()
        np.save(buf, img, allow_pickle=False)
        return buf.getvalue()
    if fmt == "tiff":
        buf = io.BytesIO()
        if paged:  # one page per image; the last axis of (P, H, W, C) is the samples of a pixel
            rgb = img.ndim == 4 and img.shape[3] == 3
            extra = {"planarconfig": "contig"} if img.ndim == 4 else {}
            tifffile.imwrite(buf, img, photometric="rgb" if rgb else "minisblack", **extra)
        else:
            tifffile.imwrite(buf, img)
        return buf.getvalue()
    if paged:
        raise InputError(f"{path.name}: a multi-page image cannot be PNG; use --format tiff or npy")
    if img.dtype in (np.float32, np.int16):
        raise InputError(f"{path.name}: {img.dtype} images cannot be PNG; use --format tiff or npy")
    channels = img.shape[2] if img.ndim == 3 else 1
    if channels not in (1, 2, 3, 4) or (channels == 2 and img.dtype != np.uint8):
        raise InputError(f"{path.name}: a {channels}-channel {img.dtype} image cannot be written as PNG here; use "
                         "--format tiff or npy")
    if channels == 2:  # gray and alpha, which OpenCV does not write
        buf = io.BytesIO()
        PIL.Image.fromarray(img).save(buf, format="PNG")
        return buf.getvalue()
    if img.ndim == 3 and img.shape[2] in (3, 4):
        img = cv2.cvtColor(img, cv2.COLOR_RGB2BGR if img.shape[2] == 3 else cv2.COLOR_RGBA2BGRA)
    ok, enc = cv2.imencode(".png", img)
    if not ok:
        raise InputError(f"{path.name}: OpenCV cannot write this image as PNG")
    return enc.tobytes()
