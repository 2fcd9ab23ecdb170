"""Error-bounded scientific compressors on the image as a float array: SZ3 (pysz) and ZFP (zfpy).

Settings are absolute error bounds in 8-bit levels (scaled by 257 for 16-bit images).
The image is handed over as float32 (exact for 8- and 16-bit values); the decoded floats are
rounded to the nearest level and clipped to the dtype's range.  For a whole-number bound E,
rounding keeps every pixel within E of the original (the nearest integer to a value within E
of an integer is within E of it), so the bound holds on the image as on the float array.
"""

from __future__ import annotations

import numpy as np

from ...measure import integer_peak
from .base import Codec, Layout

EB_LADDER = (1, 2, 4, 8, 16, 32)


def _scale(layout_dtype: str) -> float:
    return integer_peak(layout_dtype) / 255.0


def _to_image(values: np.ndarray, layout: Layout) -> np.ndarray:
    top = integer_peak(layout.dtype)
    return np.clip(np.rint(values.reshape(layout.shape)), 0, top).astype(layout.dtype)


class ErrorBoundedCodec(Codec):
    unit, kind = "eb", "bound"
    ladder = EB_LADDER

    def supports(self, layout):
        if layout.dtype not in ("uint8", "uint16"):
            return f"{self.name} is evaluated on 8- and 16-bit images"
        return None

    def bound(self, setting, dtype: str) -> float:
        return float(setting) * _scale(dtype)


class SZ3(ErrorBoundedCodec):
    """SZ3 in absolute-error mode (its default interpolation + Lorenzo predictor)."""

    name = "sz3"

    def encode(self, image, setting) -> bytes:
        from pysz import sz, szConfig, szErrorBoundMode

        conf = szConfig()
        conf.errorBoundMode = szErrorBoundMode.ABS
        conf.absErrorBound = self.bound(setting, image.dtype.name)
        data, _ratio = sz.compress(np.ascontiguousarray(image, dtype=np.float32), conf)
        return data.tobytes()

    def decode(self, data, setting, layout) -> np.ndarray:
        from pysz import sz

        values, _conf = sz.decompress(np.frombuffer(data, np.uint8), np.float32, layout.shape)
        return _to_image(values, layout)


class ZFP(ErrorBoundedCodec):
    """ZFP in fixed-accuracy mode (tolerance = the bound); its stream carries its own header."""

    name = "zfp"

    def encode(self, image, setting) -> bytes:
        import zfpy

        return zfpy.compress_numpy(np.ascontiguousarray(image, dtype=np.float32), tolerance=self.bound(setting, image.dtype.name))

    def decode(self, data, setting, layout) -> np.ndarray:
        import zfpy

        return _to_image(zfpy.decompress_numpy(data), layout)
