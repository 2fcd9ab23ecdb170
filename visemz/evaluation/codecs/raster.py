"""Standard lossy image codecs: JPEG and WebP (OpenCV), JPEG 2000 (Pillow), JPEG XL (imagecodecs), nvJPEG
(torchvision, CUDA)."""

from __future__ import annotations

import io
import warnings

import cv2
import numpy as np
import torch
from PIL import Image
from torchvision.io import ImageReadMode, decode_jpeg, encode_jpeg

from ...errors import CorruptStreamError, DeviceUnavailableError
from .base import Codec, Layout
from .lossless import JPEGXL_EFFORT, THREADS, as_layout, gray_or_rgb, imagecodecs, need_imagecodecs


def _to_bgr(image: np.ndarray) -> np.ndarray:
    return cv2.cvtColor(image, cv2.COLOR_RGB2BGR) if image.ndim == 3 else image


def _from_decoded(decoded, layout: Layout, name: str) -> np.ndarray:
    """OpenCV's decoded array -> the original layout (RGB order; gray stays HxW)."""
    if decoded is None:
        raise CorruptStreamError(f"{name} could not decode its own output")
    if layout.channels == 1 and decoded.ndim == 3:  # WebP has no gray mode: it decodes R=G=B
        decoded = cv2.cvtColor(decoded, cv2.COLOR_BGR2GRAY)
    elif decoded.ndim == 3:
        decoded = cv2.cvtColor(decoded, cv2.COLOR_BGR2RGB)
    return decoded.reshape(layout.shape)


class OpenCVCodec(Codec):
    """A codec of OpenCV's imencode/imdecode with one quality parameter."""

    modules = ("cv2",)

    def __init__(self, name: str, ext: str, param_name: str, ladder: tuple):
        self.name, self.ext, self.param_name, self.ladder, self.unit = name, ext, param_name, ladder, "q"

    def encode(self, image, setting) -> bytes:
        ok, buf = cv2.imencode(self.ext, _to_bgr(image), [getattr(cv2, self.param_name), int(setting)])
        if not ok:
            raise CorruptStreamError(f"OpenCV could not encode {self.ext} at {self.label(setting)}")
        return buf.tobytes()

    def decode(self, data, setting, layout) -> np.ndarray:
        return _from_decoded(cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED), layout, self.name)


def jpeg() -> Codec:
    return OpenCVCodec("jpeg", ".jpg", "IMWRITE_JPEG_QUALITY", (1, 5, 10, 20, 30, 50, 70, 90))


def webp() -> Codec:
    return OpenCVCodec("webp", ".webp", "IMWRITE_WEBP_QUALITY", (1, 5, 10, 20, 40, 60, 80, 95))


class JPEG2000(Codec):
    """JPEG 2000 (OpenJPEG through Pillow) at target bit rates, on 8-bit gray and RGB and 16-bit gray.

    Pillow rather than OpenCV: OpenCV's writer cannot switch on the colour transform (MCT),
    and without it RGB costs about 4 dB at equal rate on Kodak; Pillow's ``mct=1`` with the
    irreversible 9/7 wavelet is the usual lossy JPEG 2000.  Settings are bits per pixel.
    """

    name, unit = "jpeg2000", "bpp"
    modules = ("PIL",)
    ladder = (0.02, 0.05, 0.1, 0.2, 0.4, 0.8, 1.6)

    def supports(self, layout):
        if layout.dtype == "uint16" and layout.channels == 1:
            return None  # Pillow's I;16 mode; it has no 16-bit RGB
        return super().supports(layout)

    def encode(self, image, setting) -> bytes:
        bits = 8.0 * image.itemsize * (image.shape[2] if image.ndim == 3 else 1)
        f = io.BytesIO()
        Image.fromarray(image).save(f, format="JPEG2000", quality_mode="rates", quality_layers=[bits / float(setting)],
                                    irreversible=True, mct=1 if image.ndim == 3 else 0)
        return f.getvalue()

    def decode(self, data, setting, layout) -> np.ndarray:
        with Image.open(io.BytesIO(data)) as im:
            return np.asarray(im).astype(layout.dtype, copy=False).reshape(layout.shape)


class JPEGXL(Codec):
    """Lossy JPEG XL (libjxl through imagecodecs, effort 7, one thread) at Butteraugli distances
    (lower: more bits), on 8- and 16-bit gray and RGB."""

    name, unit = "jpegxl", "d"
    modules = ("imagecodecs",)
    ladder = (25.0, 15.0, 8.0, 4.0, 2.0, 1.0, 0.6, 0.3)

    def __init__(self):
        need_imagecodecs(self.name)

    def supports(self, layout):
        return gray_or_rgb(layout, self.name)

    def encode(self, image, setting) -> bytes:
        return bytes(imagecodecs.jpegxl_encode(image, distance=float(setting), effort=JPEGXL_EFFORT,
                                               numthreads=THREADS))

    def decode(self, data, setting, layout) -> np.ndarray:
        return as_layout(imagecodecs.jpegxl_decode(data, numthreads=THREADS), layout, self.name)


class NvJPEG(Codec):
    """nvJPEG through torchvision's ``encode_jpeg`` / ``decode_jpeg`` on a CUDA device.

    torchvision's GPU encoder takes 3 channels only, so a gray image is encoded as R=G=B
    (its chroma planes are constant and cost few bits) and decoded in GRAY mode.
    """

    name, unit, device = "nvjpeg", "q", "cuda"
    modules = ("torchvision",)
    ladder = (1, 5, 10, 20, 30, 50, 70, 90)

    def __init__(self):
        if not torch.cuda.is_available():
            raise DeviceUnavailableError("nvjpeg needs a CUDA device visible to torch, and none is")

    def encode(self, image, setting) -> bytes:
        t = torch.from_numpy(np.ascontiguousarray(image)).cuda()
        t = t[None].expand(3, -1, -1) if t.dim() == 2 else t.permute(2, 0, 1)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torchvision 0.29 marks its image codecs deprecated
            return encode_jpeg(t.contiguous(), quality=int(setting)).cpu().numpy().tobytes()

    def decode(self, data, setting, layout) -> np.ndarray:
        mode = ImageReadMode.GRAY if layout.channels == 1 else ImageReadMode.RGB
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            t = decode_jpeg(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=mode, device="cuda")
        return t.permute(1, 2, 0).cpu().numpy().reshape(layout.shape)

    def sync(self) -> None:
        torch.cuda.synchronize()
