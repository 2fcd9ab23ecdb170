"""Reading images on the CPU: OpenCV for common formats, tifffile for TIFF, NumPy for .npy.

Every failure (unreadable, empty, not an image, unsupported layout) is an ``InputError``
naming the file, so a folder job can report it and go on.  Inputs are opened read-only.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import VisemzError


class InputError(VisemzError, ValueError):
    """An input file cannot be read as an image."""


def load_image(path: Path) -> np.ndarray:
    """HxW or HxWxC array (RGB channel order) of the file's own dtype."""
    try:
        if path.stat().st_size == 0:
            raise InputError(f"{str(path)!r} is empty")
    except OSError as e:
        raise InputError(f"cannot read {str(path)!r}: {e.strerror}") from None
    ext = path.suffix.lower()
    try:
        if ext == ".npy":
            img = np.load(path, allow_pickle=False)
        elif ext in (".tif", ".tiff"):
            img = _tiff(path)
        elif ext == ".dcm":
            img = _dicom(path)
        else:
            img = _opencv(path)
    except InputError:
        raise
    except Exception as e:  # decoders raise many types on damaged files; all mean "not readable"
        raise InputError(f"cannot decode {str(path)!r}: {type(e).__name__}: {e}") from None
    if img.ndim not in (2, 3):
        raise InputError(f"{str(path)!r} holds an array of shape {img.shape}, not HxW or HxWxC")
    return img


def _opencv(path: Path) -> np.ndarray:
    import cv2

    img = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
    if img is None:
        raise InputError(f"{str(path)!r} is not an image OpenCV can decode")
    if img.ndim == 3 and img.shape[2] == 3:
        img = cv2.cvtColor(img, cv2.COLOR_BGR2RGB)
    elif img.ndim == 3 and img.shape[2] == 4:
        img = cv2.cvtColor(img, cv2.COLOR_BGRA2RGBA)
    return img


def _tiff(path: Path) -> np.ndarray:
    import tifffile

    with tifffile.TiffFile(path) as tif:
        if len(tif.pages) > 1:
            raise InputError(f"{str(path)!r} is a multi-page TIFF ({len(tif.pages)} pages); only single images are supported")
        return tif.asarray()


def _dicom(path: Path) -> np.ndarray:
    try:
        import pydicom
    except ImportError:
        raise InputError(f"{str(path)!r} is DICOM and pydicom is not installed") from None
    return pydicom.dcmread(path).pixel_array


def save_image(path: Path, img: np.ndarray, fmt: str) -> bytes:
    """Encode an image as PNG, TIFF or .npy bytes (the caller writes them atomically)."""
    import io

    if fmt == "npy":
        buf = io.BytesIO()
        np.save(buf, img, allow_pickle=False)
        return buf.getvalue()
    if fmt == "tiff":
        import tifffile

        buf = io.BytesIO()
        tifffile.imwrite(buf, img)
        return buf.getvalue()
    import cv2

    if img.dtype == np.float32:
        raise InputError(f"{path.name}: float32 images cannot be PNG; use --format tiff or npy")
    if img.ndim == 3 and img.shape[2] in (3, 4):
        img = cv2.cvtColor(img, cv2.COLOR_RGB2BGR if img.shape[2] == 3 else cv2.COLOR_RGBA2BGRA)
    ok, enc = cv2.imencode(".png", img)
    if not ok:
        raise InputError(f"{path.name}: OpenCV cannot write this image as PNG")
    return enc.tobytes()
