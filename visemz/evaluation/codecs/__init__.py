"""The codecs the evaluation can run, by name."""

from __future__ import annotations

from ...errors import DeviceUnavailableError, InvalidArgumentError
from .base import Codec, Layout

ARCHS = ("balle2016", "mbt2018-mean")
NAMES = (
    "jpeg", "jpeg2000", "webp", "nvjpeg", "sz3", "zfp",
    *(f"compressai-{a}" for a in ARCHS),
    *(f"visemz-{a}" for a in ARCHS),
    *(f"visemz-{a}-maxerr" for a in ARCHS),
)
GPU_ONLY = ("nvjpeg",)


def default_names(device: str) -> tuple[str, ...]:
    """Every codec that can run with ``device`` (nvJPEG only on CUDA)."""
    return tuple(n for n in NAMES if device == "cuda" or n not in GPU_ONLY)


def build(name: str, device: str) -> Codec:
    """The codec called ``name``; learned codecs run their models on ``device``."""
    from . import learned, raster, scientific

    if name not in NAMES:
        raise InvalidArgumentError(f"unknown codec {name!r}: expected one of {', '.join(NAMES)}")
    if name in GPU_ONLY and device != "cuda":
        raise DeviceUnavailableError(f"codec {name!r} runs on CUDA only; pass --device cuda on a GPU machine")
    simple = {"jpeg": raster.jpeg, "webp": raster.webp, "jpeg2000": raster.JPEG2000, "nvjpeg": raster.NvJPEG,
              "sz3": scientific.SZ3, "zfp": scientific.ZFP}
    if name in simple:
        return simple[name]()
    family, _, arch = name.partition("-")
    if family == "compressai":
        return learned.CompressAIRans(arch, device)
    if arch.endswith("-maxerr"):
        return learned.VisemzBounded(arch.removesuffix("-maxerr"), device)
    return learned.Visemz(arch, device)


__all__ = ["Codec", "Layout", "NAMES", "build", "default_names"]
