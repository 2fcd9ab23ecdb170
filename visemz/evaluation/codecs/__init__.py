"""The codecs the evaluation can run, by name.

Besides ``NAMES``, ``visemz-<arch>-refine<N>`` is visemz at qualities 1-8 with N steps of
encoder-side latent refinement (``visemz/refine.py``), N in 1..MAX_REFINE.
"""

from __future__ import annotations

import re

from ...config import MAX_REFINE
from ...errors import DeviceUnavailableError, InvalidArgumentError
from . import learned, raster, scientific
from .base import Codec, Layout
from .learned import refined_name

ARCHS = ("balle2016", "mbt2018-mean")
NAMES = (
    "jpeg", "jpeg2000", "webp", "nvjpeg", "sz3", "zfp",
    *(f"compressai-{a}" for a in ARCHS),
    *(f"visemz-{a}" for a in ARCHS),
    *(f"visemz-{a}-maxerr" for a in ARCHS),
)
GPU_ONLY = ("nvjpeg",)
_REFINED = re.compile(r"visemz-(.+)-refine(0|[1-9][0-9]*)")


def parse_refined(name: str) -> tuple[str, int] | None:
    """(arch, steps) of a ``visemz-<arch>-refine<N>`` name (N checked, 1..MAX_REFINE), None for other names."""
    m = _REFINED.fullmatch(name)
    if m is None or m.group(1) not in ARCHS:
        return None
    arch, steps = m.group(1), int(m.group(2))
    if not 1 <= steps <= MAX_REFINE:
        raise InvalidArgumentError(f"codec {name!r}: expected 1..{MAX_REFINE} refinement steps "
                                   f"(0 steps is codec 'visemz-{arch}')")
    return arch, steps


def with_refined(names: tuple[str, ...], steps: int) -> tuple[str, ...]:
    """``names`` and, after them, ``visemz-<arch>-refine<steps>`` for each ``visemz-<arch>`` among them (none for 0)."""
    extra = [refined_name(a, steps) for a in ARCHS if steps and f"visemz-{a}" in names]
    return tuple(dict.fromkeys((*names, *extra)))


def default_names(device: str) -> tuple[str, ...]:
    """Every codec that can run with ``device`` (nvJPEG only on CUDA) and whose library is installed."""
    missing = {"sz3", "zfp"} - scientific.installed()
    return tuple(n for n in NAMES if (device == "cuda" or n not in GPU_ONLY) and n not in missing)


def build(name: str, device: str) -> Codec:
    """The codec called ``name``; learned codecs run their models on ``device``."""
    refined = parse_refined(name)
    if refined is not None:
        arch, steps = refined
        return learned.Visemz(arch, device, refine=steps)
    if name not in NAMES:
        raise InvalidArgumentError(f"unknown codec {name!r}: expected one of {', '.join(NAMES)}, "
                                   f"or visemz-<{'|'.join(ARCHS)}>-refine<steps>")
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


def build_many(names, device: str, ladders: dict) -> list[Codec]:
    """The codecs called ``names``, each with its ladder replaced where ``ladders`` names one."""
    unknown = set(ladders) - set(names)
    if unknown:
        raise InvalidArgumentError(f"ladder override for codec(s) {sorted(unknown)} that are not evaluated")
    out = []
    for name in names:
        c = build(name, device)
        out.append(c.with_ladder(ladders[name]) if name in ladders else c)
    return out


__all__ = ["Codec", "Layout", "NAMES", "build", "build_many", "default_names", "parse_refined", "refined_name",
           "with_refined"]
