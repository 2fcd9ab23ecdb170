"""What a GPU loader needs to know about a file, read from its header alone.

* ``decode_target(path)``: for files that DALI decodes to exactly what the CPU loader returns
  (shape, channel order, dtype): 8/16-bit PNG (gray, RGB, RGBA; no tRNS chunk, to which
  OpenCV adds an alpha channel), 8-bit baseline/progressive RGB JPEG of even width and height
  (on an H200, DALI 2.4's gray JPEGs came out 19-27 levels off libjpeg-turbo's on average,
  and an odd-width RGB JPEG up to 129 levels at its worst pixel), 8/16-bit
  unsigned JPEG 2000 in a .jp2 file (1 or 3 components) and single-page 8/16-bit TIFF
  (gray or RGB, interleaved).  ``None`` for anything else: the CPU loader takes it.
* ``raw_layout(path)``: for files whose pixels lie uncompressed, in C order, little-endian,
  at one offset: .npy (format 1.0/2.0) and single-page uncompressed TIFF.  kvikio reads them
  straight into GPU memory.  ``None`` for anything else.

Probes never raise on bad files: a damaged header means "not for a GPU loader", and the CPU
loader then reports the damage.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tifffile

from ..io import loaders

# dtypes the codec takes, as NumPy's little-endian type strings
RAW_DTYPES = {"|u1": "uint8", "<u2": "uint16", "<f4": "float32"}
JP2_SIGNATURE = b"\x00\x00\x00\x0cjP  \r\n\x87\n"
MAX_CHUNKS = 4096  # header chunks/markers/boxes scanned before giving up


@dataclass(frozen=True)
class DecodeTarget:
    height: int
    width: int
    channels: int
    dtype: str  # "uint8" or "uint16"

    @property
    def shape(self) -> tuple[int, ...]:
        """The CPU loader's shape: HxW for one channel, HxWxC otherwise."""
        return (self.height, self.width) if self.channels == 1 else (self.height, self.width, self.channels)


@dataclass(frozen=True)
class RawLayout:
    offset: int  # byte offset of the pixels in the file
    shape: tuple[int, ...]
    dtype: str  # "uint8", "uint16" or "float32"

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape)) * np.dtype(self.dtype).itemsize


def decode_target(path: Path) -> DecodeTarget | None:
    ext = path.suffix.lower()
    probe = {".png": _png, ".jpg": _jpeg, ".jpeg": _jpeg, ".jp2": _jp2, ".tif": _tiff_target,
             ".tiff": _tiff_target}.get(ext)
    if probe is None:
        return None
    try:
        return probe(path)
    except (OSError, ValueError, struct.error, IndexError):
        return None


def raw_layout(path: Path) -> RawLayout | None:
    ext = path.suffix.lower()
    probe = {".npy": _npy_layout, ".tif": _tiff_layout, ".tiff": _tiff_layout}.get(ext)
    if probe is None:
        return None
    try:
        layout = probe(path)
    except (OSError, ValueError, struct.error, IndexError):
        return None
    if layout is None or len(layout.shape) not in (2, 3) or min(layout.shape) < 1:
        return None
    if path.stat().st_size < layout.offset + layout.nbytes:
        return None  # truncated: the CPU loader says so
    return layout


# ------------------------------------------------------------------ decode targets
def _png(path: Path) -> DecodeTarget | None:
    """Gray, RGB and RGBA PNGs of 8 or 16 bits without a tRNS chunk (palette, gray and alpha, transparency: CPU)."""
    with open(path, "rb") as f:
        png = loaders.png_header(f)
    if png is None or png.colour not in (0, 2, 6) or png.transparency is not False or png.depth not in (8, 16) \
            or not png.width or not png.height:
        return None
    return DecodeTarget(png.height, png.width, png.channels, "uint8" if png.depth == 8 else "uint16")


_SOF_SUPPORTED = {0xC0, 0xC1, 0xC2}  # baseline, extended and progressive Huffman
_SOF_ALL = set(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
_STANDALONE = {0x01} | set(range(0xD0, 0xD8))


def _jpeg(path: Path) -> DecodeTarget | None:
    with open(path, "rb") as f:
        if f.read(2) != b"\xff\xd8":
            return None
        for _ in range(MAX_CHUNKS):
            if f.read(1) != b"\xff":
                return None
            marker = f.read(1)[0]
            while marker == 0xFF:  # fill bytes
                marker = f.read(1)[0]
            if marker in _STANDALONE:
                continue
            if marker in (0xD9, 0xDA):  # end of image or start of scan before any frame header
                return None
            (length,) = struct.unpack(">H", f.read(2))
            if marker in _SOF_ALL:
                precision, height, width, comps = struct.unpack(">BHHB", f.read(6))
                if marker not in _SOF_SUPPORTED or precision != 8 or comps != 3 or not height or not width:
                    return None
                if width % 2 or height % 2:
                    return None
                return DecodeTarget(height, width, comps, "uint8")
            f.seek(length - 2, 1)
    return None


def _boxes(f, end: int):
    """(type, payload start, payload end) of the JP2 boxes in [f.tell(), end)."""
    for _ in range(MAX_CHUNKS):
        start = f.tell()
        if start + 8 > end:
            return
        size, kind = struct.unpack(">I4s", f.read(8))
        head = 8
        if size == 1:
            (size,) = struct.unpack(">Q", f.read(8))
            head = 16
        elif size == 0:
            size = end - start
        if size < head or start + size > end:
            return
        yield kind, start + head, start + size
        f.seek(start + size)


def _jp2(path: Path) -> DecodeTarget | None:
    end = path.stat().st_size
    with open(path, "rb") as f:
        if f.read(12) != JP2_SIGNATURE:
            return None
        for kind, a, b in _boxes(f, end):
            if kind != b"jp2h":
                continue
            f.seek(a)
            for sub, c, _ in _boxes(f, b):
                if sub != b"ihdr":
                    continue
                f.seek(c)
                height, width, comps, bpc = struct.unpack(">IIHB", f.read(11))
                depth = (bpc & 0x7F) + 1
                if bpc == 0xFF or bpc & 0x80 or depth not in (8, 16) or comps not in (1, 3) or not height or not width:
                    return None  # per-component depths, signed samples, other depths
                return DecodeTarget(height, width, comps, "uint8" if depth == 8 else "uint16")
            return None
    return None


@dataclass(frozen=True)
class _TiffPage:
    shape: tuple[int, ...]
    dtype: np.dtype | None
    bits: int
    photometric: int
    planar: int
    extrasamples: tuple
    final: bool  # uncompressed, contiguous, no predictor or fill order
    offset: int
    byteorder: str


def _tiff_page(path: Path) -> _TiffPage | None:
    """The only page of a single-page TIFF, or None."""
    try:
        with tifffile.TiffFile(path) as tif:
            if len(tif.pages) != 1:
                return None
            p = tif.pages[0]
            return _TiffPage(tuple(int(s) for s in p.shape), p.dtype, int(p.bitspersample), int(p.photometric),
                             int(p.planarconfig), tuple(p.extrasamples), bool(p.is_final),
                             int(p.dataoffsets[0]) if p.dataoffsets else -1, tif.byteorder)
    except Exception:  # tifffile raises many types on damaged files
        return None


def _tiff_target(path: Path) -> DecodeTarget | None:
    page = _tiff_page(path)
    if page is None or page.dtype is None or page.dtype.name not in ("uint8", "uint16") \
            or page.bits != 8 * page.dtype.itemsize:
        return None
    shape = page.shape
    gray = len(shape) == 2 and page.photometric == 1  # MINISBLACK
    rgb = len(shape) == 3 and shape[2] == 3 and page.photometric == 2 and page.planar == 1 and not page.extrasamples
    if not (gray or rgb):
        return None
    return DecodeTarget(shape[0], shape[1], 1 if gray else 3, page.dtype.name)


# ------------------------------------------------------------------ raw layouts
def _npy_layout(path: Path) -> RawLayout | None:
    fmt = np.lib.format
    with open(path, "rb") as f:
        version = fmt.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = fmt.read_array_header_1_0(f)
        elif version == (2, 0):
            shape, fortran, dtype = fmt.read_array_header_2_0(f)
        else:
            return None
        offset = f.tell()
    if fortran or dtype.str not in RAW_DTYPES:
        return None
    return RawLayout(offset, tuple(int(s) for s in shape), RAW_DTYPES[dtype.str])


def _tiff_layout(path: Path) -> RawLayout | None:
    page = _tiff_page(path)
    if page is None or page.dtype is None or not page.final or page.offset < 0 or page.bits != 8 * page.dtype.itemsize:
        return None
    code = page.dtype.newbyteorder(page.byteorder).str if page.dtype.itemsize > 1 else page.dtype.str
    if code not in RAW_DTYPES or (len(page.shape) == 3 and page.planar != 1):
        return None
    return RawLayout(page.offset, page.shape, RAW_DTYPES[code])
