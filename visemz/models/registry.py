"""Named models and the continuous quality ladder.

A model is an architecture from CompressAI (``balle2016``: bmshj2018-factorized;
``mbt2018-mean``: the mean-scale hyperprior; ``minnen2020``: the mean-scale hyperprior with a
channel-conditional context model, ``models/channel_context.py``) in an RGB (3-channel) or
grayscale (1-channel) variant.  Every model is variable-rate (gain units, Cui et al., CVPR 2021):
one network covers the whole ladder, and ``quality`` is a float in [1, 8] on CompressAI's
lambda ladder.  An integer quality q is trained with the lambda of CompressAI's zoo
quality q; between two integers the gain vectors and the lambda are interpolated
geometrically, so a fractional quality lands between its neighbours' rates.

Sizes: N=128, M=192, CompressAI's zoo size for qualities 1-5 of the first two architectures;
N=192, M=320 (the zoo's size for its high qualities) for ``minnen2020``, whose latent is coded in
slices of channels (``ModelSpec.slices``, default five of 64).  Convolution kernels are stored as
int8 with per-channel scales (weights.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..config import real_number, whole_number
from ..errors import InvalidArgumentError

# CompressAI's lambda ladder (qualities 1..8 of its zoo, MSE)
COMPRESSAI_LAMBDAS = (0.0018, 0.0035, 0.0067, 0.0130, 0.0250, 0.0483, 0.0932, 0.1800)
LEVELS = len(COMPRESSAI_LAMBDAS)
QUALITY_MIN, QUALITY_MAX = 1.0, float(LEVELS)
# The hyperprior model, coded by the conditional rANS coder (image format 3), writes the smaller
# files on Kodak and on the X-rays (docs/results/rd/summary.md).
DEFAULT_MODEL = "mbt2018-mean"
DEFAULT_QUALITY = 4.0  # CompressAI's quality 4 (lambda 0.013): about 0.5 bpp on Kodak with its zoo models
ARCHITECTURES = ("balle2016", "mbt2018-mean", "minnen2020")
CHANNEL_CONTEXT = ("minnen2020",)  # architectures whose y is coded slice by slice (image format 7)
VARIANTS = {"rgb": 3, "gray": 1}
SHIPPED_N, SHIPPED_M = 128, 192
# N, M and the channel slices of each architecture's registered models
SIZES = {"balle2016": (SHIPPED_N, SHIPPED_M, ()), "mbt2018-mean": (SHIPPED_N, SHIPPED_M, ()),
         "minnen2020": (192, 320, (64,) * 5)}


@dataclass(frozen=True)
class ModelSpec:
    arch: str  # one of ARCHITECTURES
    variant: str  # "rgb" or "gray"
    N: int = SHIPPED_N
    M: int = SHIPPED_M
    slices: tuple[int, ...] = ()  # channel-context models: the latent's channel slices, in coding order

    def __post_init__(self):
        if (self.arch in CHANNEL_CONTEXT) != bool(self.slices):
            raise InvalidArgumentError(f"model {self.arch!r}: slices {self.slices!r} (only {list(CHANNEL_CONTEXT)} "
                                       f"code their latent in slices)")
        if self.slices:
            check_slices(self.slices, self.M)

    @property
    def channels(self) -> int:
        return VARIANTS[self.variant]

    @property
    def context(self) -> bool:
        """Whether the latent is coded slice by slice, each conditioned on the slices before it."""
        return bool(self.slices)

    @property
    def name(self) -> str:
        return f"{self.arch}-{self.variant}"

    @property
    def zoo_name(self) -> str:
        return {"balle2016": "bmshj2018-factorized"}.get(self.arch, self.arch)


def check_slices(slices, M: int) -> tuple[int, ...]:
    """Channel slices as a tuple of positive ints adding up to M (e.g. (64,) * 5 or ELIC's uneven
    (16, 16, 32, 64, M - 128)), or InvalidArgumentError naming them."""
    if not (isinstance(slices, (tuple, list)) and slices
            and all(whole_number(g) and g >= 1 for g in slices) and sum(slices) == M):
        raise InvalidArgumentError(f"slices={slices!r}: expected positive channel counts adding up to M={M}")
    return tuple(int(g) for g in slices)


def check_quality(quality) -> float:
    """A quality as a float in [1, 8], or InvalidArgumentError naming the bad value."""
    if not real_number(quality):
        raise InvalidArgumentError(f"quality={quality!r}: expected a number in [{QUALITY_MIN:g}, {QUALITY_MAX:g}]")
    q = float(quality)
    if not (QUALITY_MIN <= q <= QUALITY_MAX):  # NaN fails this too
        raise InvalidArgumentError(f"quality={quality!r}: expected a number in [{QUALITY_MIN:g}, {QUALITY_MAX:g}]")
    return q


def level_and_fraction(quality: float) -> tuple[int, float]:
    """Quality in [1, 8] -> (lower ladder index 0..6, weight of the upper one in [0, 1])."""
    q = check_quality(quality)
    low = min(int(math.floor(q)), LEVELS - 1)
    return low - 1, q - low


def lam(quality) -> float:
    """The rate-distortion lambda a quality is trained for: CompressAI's ladder, interpolated geometrically."""
    i, a = level_and_fraction(quality)
    if a in (0.0, 1.0):  # an integer quality: the zoo's own lambda, exactly
        return COMPRESSAI_LAMBDAS[i + int(a)]
    return math.exp((1 - a) * math.log(COMPRESSAI_LAMBDAS[i]) + a * math.log(COMPRESSAI_LAMBDAS[i + 1]))


def spec(arch: str, variant: str) -> ModelSpec:
    if arch not in ARCHITECTURES:
        raise InvalidArgumentError(f"model={arch!r}: expected one of {list(ARCHITECTURES)}")
    if variant not in VARIANTS:
        raise InvalidArgumentError(f"variant={variant!r}: expected one of {list(VARIANTS)}")
    n, m, slices = SIZES[arch]
    return ModelSpec(arch, variant, n, m, slices)


def parse(name: str) -> ModelSpec:
    """'balle2016-gray' -> ModelSpec."""
    arch, sep, variant = name.rpartition("-")
    if not sep:
        raise InvalidArgumentError(f"model name {name!r} is not ARCH-VARIANT, e.g. balle2016-rgb")
    return spec(arch, variant)


def all_specs() -> list[ModelSpec]:
    return [spec(a, v) for a in ARCHITECTURES for v in VARIANTS]
