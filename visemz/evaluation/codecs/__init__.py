"""The codecs the evaluation can run, by name.

Besides ``NAMES``, ``visemz-<arch>-refine<N>`` is visemz at qualities 1-8 with N steps of
encoder-side latent refinement (``visemz/image/refine.py``), N in 1..MAX_REFINE, and
``visemz-<arch>-maxerr-q<Q>`` is visemz's error-bounded ladder (lossless, then maximum errors
in the image's own levels) at model quality Q instead of ``learned.MAXERR_QUALITY``.
"""

from __future__ import annotations

import re

from ...config import MAX_REFINE
from ...errors import DeviceUnavailableError, InvalidArgumentError
from . import learned, lossless, raster, scientific
from .base import Codec, Layout
from .learned import bounded_name, refined_name

ARCHS = ("balle2016", "mbt2018-mean")
LOSSLESS_NAMES = tuple(lossless.CODECS)  # png, jpegls, jpeg2000-lossless, jpegxl-lossless, webp-lossless
NAMES = (
    "jpeg", "jpeg2000", "jpegxl", "webp", "nvjpeg", "sz3", "zfp", *LOSSLESS_NAMES,
    *(f"compressai-{a}" for a in ARCHS),
    *(f"visemz-{a}" for a in ARCHS),
    *(f"visemz-{a}-maxerr" for a in ARCHS),
)
GPU_ONLY = ("nvjpeg",)
IMAGECODECS = ("jpegxl", *LOSSLESS_NAMES)  # the codecs that need imagecodecs
_REFINED = re.compile(r"visemz-(.+)-refine(0|[1-9][0-9]*)")
_BOUNDED = re.compile(r"visemz-(.+)-maxerr-q(.+)")


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


def parse_bounded(name: str) -> tuple[str, object] | None:
    """(arch, quality) of a ``visemz-<arch>-maxerr-q<Q>`` name (Q checked by the library), None for other names."""
    m = _BOUNDED.fullmatch(name)
    if m is None or m.group(1) not in ARCHS:
        return None
    try:
        quality = float(m.group(2))
    except ValueError:
        quality = m.group(2)  # a word: the library's check says whether it takes it
    return m.group(1), quality


def with_refined(names: tuple[str, ...], steps: int) -> tuple[str, ...]:
    """``names`` and, after them, ``visemz-<arch>-refine<steps>`` for each ``visemz-<arch>`` among them (none for 0)."""
    extra = [refined_name(a, steps) for a in ARCHS if steps and f"visemz-{a}" in names]
    return tuple(dict.fromkeys((*names, *extra)))


def default_names(device: str) -> tuple[str, ...]:
    """Every codec that can run with ``device`` (nvJPEG only on CUDA) and whose library is installed."""
    missing = ({"sz3", "zfp"} - scientific.installed()) | (set() if lossless.installed() else set(IMAGECODECS))
    return tuple(n for n in NAMES if (device == "cuda" or n not in GPU_ONLY) and n not in missing)


def build(name: str, device: str) -> Codec:
    """The codec called ``name``; learned codecs run their models on ``device``."""
    refined = parse_refined(name)
    if refined is not None:
        arch, steps = refined
        return learned.Visemz(arch, device, refine=steps)
    bounded = parse_bounded(name)
    if bounded is not None:
        arch, quality = bounded
        try:
            return learned.VisemzBounded(arch, device, quality=quality)
        except InvalidArgumentError as e:
            raise InvalidArgumentError(f"codec {name!r}: {e}") from None
    if name not in NAMES:
        raise InvalidArgumentError(f"unknown codec {name!r}: expected one of {', '.join(NAMES)}, "
                                   f"visemz-<{'|'.join(ARCHS)}>-refine<steps> or "
                                   f"visemz-<{'|'.join(ARCHS)}>-maxerr-q<quality>")
    if name in GPU_ONLY and device != "cuda":
        raise DeviceUnavailableError(f"codec {name!r} runs on CUDA only; pass --device cuda on a GPU machine")
    simple = {"jpeg": raster.jpeg, "webp": raster.webp, "jpeg2000": raster.JPEG2000, "jpegxl": raster.JPEGXL,
              "nvjpeg": raster.NvJPEG, "sz3": scientific.SZ3, "zfp": scientific.ZFP, **lossless.CODECS}
    if name in simple:
        return simple[name]()
    family, _, arch = name.partition("-")
    if family == "compressai":
        return learned.CompressAIRans(arch, device)
    if arch.endswith("-maxerr"):
        return learned.VisemzBounded(arch.removesuffix("-maxerr"), device)
    return learned.Visemz(arch, device)


def describe(name: str) -> str:
    """What an error-bounded codec is, by name, without building it (the lossless tables' notes)."""
    described = {**lossless.CODECS, "sz3": scientific.SZ3, "zfp": scientific.ZFP}
    if name in described:
        return described[name].description
    bounded = parse_bounded(name)
    if bounded is None and name in NAMES and name.endswith("-maxerr"):
        bounded = (name.removeprefix("visemz-").removesuffix("-maxerr"), learned.MAXERR_QUALITY)
    return learned.bounded_description(*bounded) if bounded else name


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


__all__ = ["Codec", "Layout", "LOSSLESS_NAMES", "NAMES", "bounded_name", "build", "build_many", "default_names",
           "describe", "parse_bounded", "parse_refined", "refined_name", "with_refined"]
