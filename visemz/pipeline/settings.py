"""The settings of the folder jobs, checked before any file is touched (without loading the codec).

A bad setting is one ``InvalidArgumentError`` (exit code 2 on the command line) naming the value,
raised before the destination is created, never a failure repeated for every file.
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import config, cuda
from ..config import LOADERS
from ..encoders import entropy
from ..errors import DeviceUnavailableError, InvalidArgumentError, UnsupportedFormatError
from ..models import registry

FORMATS = {"png": ".png", "tiff": ".tif", "npy": ".npy"}
AUTO = "auto"  # decompress: each file back in its source's type (PNG, TIFF, .npy; PNG for any other)
WRITERS = ("auto", "kvikio", "posix")


@dataclass(frozen=True)
class CompressConfig:
    model: str = registry.DEFAULT_MODEL
    quality: float = registry.DEFAULT_QUALITY
    max_error: float | None = None
    entropy: str = "zstd"
    device: str | None = None
    streams: int = 0  # compute lanes (CUDA streams on a GPU); 0: VISEMZ_STREAMS or automatic
    resume: bool = True
    loader: str = ""  # "auto", "dali", "kvikio" or "cpu"; "": VISEMZ_LOADER
    tile: int = 0  # core tile size in pixels (a multiple of 64); 0: VISEMZ_TILE
    refine: int | None = None  # encoder-side latent refinement steps; None: VISEMZ_REFINE


@dataclass(frozen=True)
class DecompressConfig:
    fmt: str = AUTO  # "auto", "png", "tiff" or "npy"
    device: str | None = None
    streams: int = 0
    writer: str = "auto"  # "kvikio" writes .npy from GPU memory; "auto": when on a GPU with kvikio
    region: tuple[int, int, int, int] | None = None  # (y0, y1, x0, x1): decode only that window
    resume: bool = True

    def __post_init__(self):
        if self.fmt != AUTO and self.fmt not in FORMATS:
            raise InvalidArgumentError(f"format {self.fmt!r}: expected auto, png, tiff or npy")
        if self.writer not in WRITERS:
            raise InvalidArgumentError(f"writer {self.writer!r}: expected one of {', '.join(WRITERS)}")
        if self.region is not None:  # what needs no file (each file checks the region against its size)
            config.check_region(self.region)


def check_compress(cfg: CompressConfig) -> str:
    """Check every setting of a compression that can be checked without the codec; returns the device.

    (The tile size and the refinement steps are checked by the codec's own rules, ``tiling.check_tile``
    and ``refine.check_steps``, which the job calls before any file.)"""
    registry.spec(cfg.model, "gray")  # names the known architectures
    registry.check_quality(cfg.quality)
    config.check_max_error(cfg.max_error)
    if cfg.entropy not in entropy.KINDS:
        raise InvalidArgumentError(f"entropy {cfg.entropy!r}: expected one of {', '.join(sorted(entropy.KINDS))}")
    if cfg.loader and cfg.loader not in LOADERS:
        raise InvalidArgumentError(f"loader {cfg.loader!r}: expected one of {', '.join(LOADERS)}")
    config.check("streams", cfg.streams)
    device = cuda.resolve(cfg.device)
    if cfg.entropy == "ans" and device != "cuda":
        raise DeviceUnavailableError("entropy 'ans' is coded by nvCOMP on a GPU: use zstd on the CPU")
    return device


def check_weights_installed(model: str) -> None:
    """A model with weights for gray or RGB images (else every file would fail alike).  It loads torch: the command
    line checks its other settings and its folders first."""
    from ..models import weights as W

    if not any(W.weights_path(registry.spec(model, v)).is_file() for v in ("gray", "rgb")):
        raise UnsupportedFormatError(f"model {model!r}: no weights are installed for it (gray or RGB) in "
                                     f"{W.weights_dir()}")


def check_decompress(cfg: DecompressConfig) -> str:
    """Check a decompression's settings; returns the device."""
    config.check("streams", cfg.streams)
    return cuda.resolve(cfg.device)
