"""Error-bounded scientific compressors on the image as a float array: SZ3 (pysz) and ZFP (zfpy).

Settings are absolute error bounds in levels of the image's own dtype (16-bit levels on a
16-bit image).  The image is handed over as float32 (exact for 8- and 16-bit values); the decoded floats are
rounded to the nearest level and clipped to the dtype's range.  For a whole-number bound E,
rounding keeps every pixel within E of the original (the nearest integer to a value within E
of an integer is within E of it), so the bound holds on the image as on the float array.
"""

from __future__ import annotations

import numpy as np

from ...errors import VisemzError
from ...measure import integer_peak
from .base import Codec, Layout
from .lossless import gray_or_rgb

try:  # the 'eval' extra
    from pysz import sz, szConfig, szErrorBoundMode
except ImportError:
    sz = None
try:
    import zfpy
except ImportError:
    zfpy = None

EB_LADDER = (1, 2, 4, 8, 16, 32)


def _to_image(values: np.ndarray, layout: Layout) -> np.ndarray:
    top = integer_peak(layout.dtype)
    return np.clip(np.rint(values.reshape(layout.shape)), 0, top).astype(layout.dtype)


class ErrorBoundedCodec(Codec):
    unit, kind = "eb", "bound"
    ladder = EB_LADDER

    def supports(self, layout):
        return gray_or_rgb(layout, self.name)  # the evaluation's metrics take gray or RGB images


def installed() -> set[str]:
    """The scientific codecs whose library is installed."""
    return {name for name, lib in (("sz3", sz), ("zfp", zfpy)) if lib is not None}


def _need(name: str, package: str) -> None:
    if name not in installed():
        raise VisemzError(f"codec {name!r} needs {package}: pip install 'visemz[eval]'")


class SZ3(ErrorBoundedCodec):
    """SZ3 in absolute-error mode (its default interpolation + Lorenzo predictor)."""

    name = "sz3"
    modules = ("pysz",)
    description = "SZ3 (pysz, absolute error bound E on the image as float32)"

    def __init__(self):
        _need(self.name, "pysz")

    def encode(self, image, setting) -> bytes:
        conf = szConfig()
        conf.errorBoundMode = szErrorBoundMode.ABS
        conf.absErrorBound = float(setting)
        data, _ratio = sz.compress(np.ascontiguousarray(image, dtype=np.float32), conf)
        return data.tobytes()

    def decode(self, data, setting, layout) -> np.ndarray:
        values, _conf = sz.decompress(np.frombuffer(data, np.uint8), np.float32, layout.shape)
        return _to_image(values, layout)


class ZFP(ErrorBoundedCodec):
    """ZFP in fixed-accuracy mode (tolerance = the bound); its stream carries its own header."""

    name = "zfp"
    modules = ("zfpy",)
    description = "ZFP (zfpy, fixed accuracy E on the image as float32)"

    def __init__(self):
        _need(self.name, "zfpy")

    def encode(self, image, setting) -> bytes:
        return zfpy.compress_numpy(np.ascontiguousarray(image, dtype=np.float32), tolerance=float(setting))

    def decode(self, data, setting, layout) -> np.ndarray:
        return _to_image(zfpy.decompress_numpy(data), layout)
