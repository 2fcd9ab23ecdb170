"""Image quality metrics of one decoded image against its original.

Every metric compares the two arrays in the original's own scale: PSNR and bpp are
``visemz.measure``'s (the peak is the bit depth's range, 255 for uint8 and 65535 for uint16, so
PSNR is comparable across codecs).  SSIM, MS-SSIM and GMSD run in torch (on the evaluation's
device) on [0, 1] values.
"""

from __future__ import annotations

import numpy as np
import torch
from pytorch_msssim import ms_ssim as _ms_ssim
from pytorch_msssim import ssim as _ssim

from .. import measure as M
from ..errors import InvalidArgumentError, UnsupportedFormatError, VisemzError

try:
    import piq
except ImportError:  # the 'eval' extra: GMSD and MS-SSIM of small images need it
    piq = None

DTYPES = ("uint8", "uint16")  # what the evaluation's codecs take
# pytorch_msssim's five-scale MS-SSIM needs the short side above (11 - 1) * 2**4 pixels
MSSSIM_MIN_SIDE = 161
MSSSIM_WEIGHTS = (0.0448, 0.2856, 0.3001, 0.2363, 0.1333)


def check_dtype(dtype) -> None:
    name = np.dtype(dtype).name
    if name not in DTYPES:
        raise UnsupportedFormatError(f"image dtype {name}: the evaluation handles {list(DTYPES)}")


def check_same_layout(ref: np.ndarray, rec: np.ndarray) -> None:
    if ref.shape != rec.shape or ref.dtype != rec.dtype:
        raise InvalidArgumentError(f"decoded image {rec.shape} {rec.dtype} does not match the original {ref.shape} "
                                   f"{ref.dtype}")


def _need_piq() -> None:
    if piq is None:
        raise VisemzError("this metric needs piq: pip install 'visemz[eval]'")


def to_unit_batch(img: np.ndarray, device: str = "cpu"):
    """HxW or HxWxC -> (1, C, H, W) float32 tensor in [0, 1] on ``device``."""
    check_dtype(img.dtype)
    x = torch.from_numpy(img.astype(np.float32) / M.peak(img)).to(device)
    return x[None, None] if x.dim() == 2 else x.permute(2, 0, 1)[None]


def ssim(x, y) -> float:
    """Gaussian-window SSIM (Wang et al. 2004, 11x11, sigma 1.5), averaged over channels."""
    return float(_ssim(x, y, data_range=1.0, size_average=True))


def ms_ssim(x, y) -> float:
    """Five-scale MS-SSIM (pytorch_msssim, as the model cards use).

    Images too small for five scales use as many of the standard scales as fit, with the
    weights renormalised (piq's implementation accepts fewer scales): only tiny test images
    take this path; every evaluation image of the reports is large enough for five.
    """
    side = min(x.shape[-2:])
    if side >= MSSSIM_MIN_SIDE:
        return float(_ms_ssim(x, y, data_range=1.0))
    _need_piq()
    levels = 1
    while levels < len(MSSSIM_WEIGHTS) and (11 - 1) * 2**levels + 1 <= side:
        levels += 1
    if side < 11:
        raise InvalidArgumentError(f"image side {side} is below MS-SSIM's 11-pixel window")
    w = torch.tensor(MSSSIM_WEIGHTS[:levels], dtype=x.dtype, device=x.device)
    return float(piq.multi_scale_ssim(x, y, data_range=1.0, scale_weights=w / w.sum()))


def gmsd(x, y) -> float:
    """Gradient magnitude similarity deviation (Xue et al. 2014, piq; 0 = identical, needs no weights).

    Texture-sensitive: it scores the spread of local gradient agreement, so smoothed-away
    texture costs more than under PSNR.  RGB is compared on its luminance, as piq does.
    """
    _need_piq()
    return float(piq.gmsd(x, y, data_range=1.0))


def measure(ref: np.ndarray, rec: np.ndarray, nbytes: int, device: str = "cpu") -> dict[str, float]:
    """Every metric of one decoded image: bpp, psnr, ssim, ms_ssim, gmsd, max_abs_error."""
    check_same_layout(ref, rec)
    with torch.inference_mode():
        x, y = to_unit_batch(ref, device), to_unit_batch(rec, device)
        return {
            "bpp": M.bpp(nbytes, M.pixel_count(ref.shape)),
            "psnr": M.psnr(ref, rec),
            "ssim": ssim(x, y),
            "ms_ssim": ms_ssim(x, y),
            "gmsd": gmsd(x, y),
            "max_abs_error": M.max_abs_error(ref, rec),
        }
