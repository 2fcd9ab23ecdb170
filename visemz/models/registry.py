"""Named models and their quality ladders.

A model is an architecture from CompressAI (``balle2016``: bmshj2018-factorized;
``mbt2018-mean``: the mean-scale hyperprior) in an RGB (3-channel) or grayscale
(1-channel) variant, at one of four qualities.  Each quality is trained with one
lambda of CompressAI's ladder (0.0018 ... 0.18).

Sizes: CompressAI's zoo uses N=128/M=192 (and 192/320 at high rates).  visemz ships
16 models inside the package, and the package must stay small enough to travel with
every GPU job of this project (a 64 MiB limit), so the shipped models use N=64, M=96
with int8 convolution weights (about 21 MB for all 16).  The registry takes any N/M.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import InvalidArgumentError

# CompressAI's lambda ladder (qualities 1..8 of its zoo)
COMPRESSAI_LAMBDAS = (0.0018, 0.0035, 0.0067, 0.0130, 0.0250, 0.0483, 0.0932, 0.1800)
LADDER = (1, 3, 5, 7)  # which CompressAI qualities visemz's qualities 1..4 train at
ARCHITECTURES = ("balle2016", "mbt2018-mean")
VARIANTS = {"rgb": 3, "gray": 1}
SHIPPED_N, SHIPPED_M = 64, 96


@dataclass(frozen=True)
class ModelSpec:
    arch: str  # "balle2016" or "mbt2018-mean"
    variant: str  # "rgb" or "gray"
    quality: int  # 1..4
    N: int = SHIPPED_N
    M: int = SHIPPED_M

    @property
    def channels(self) -> int:
        return VARIANTS[self.variant]

    @property
    def lam(self) -> float:
        return COMPRESSAI_LAMBDAS[LADDER[self.quality - 1] - 1]

    @property
    def name(self) -> str:
        return f"{self.arch}-{self.variant}-q{self.quality}"

    @property
    def compressai_quality(self) -> int:
        return LADDER[self.quality - 1]


def spec(arch: str, quality: int, variant: str) -> ModelSpec:
    if arch not in ARCHITECTURES:
        raise InvalidArgumentError(f"model={arch!r}: expected one of {list(ARCHITECTURES)}")
    if variant not in VARIANTS:
        raise InvalidArgumentError(f"variant={variant!r}: expected one of {list(VARIANTS)}")
    if quality not in range(1, len(LADDER) + 1):
        raise InvalidArgumentError(f"quality={quality!r}: expected 1..{len(LADDER)}")
    return ModelSpec(arch, variant, int(quality))


def parse(name: str) -> ModelSpec:
    """'balle2016-gray-q3' -> ModelSpec."""
    try:
        rest, q = name.rsplit("-q", 1)
        arch, variant = rest.rsplit("-", 1)
        return spec(arch, int(q), variant)
    except ValueError:
        raise InvalidArgumentError(f"model name {name!r} is not ARCH-VARIANT-qN, e.g. balle2016-rgb-q3") from None


def all_specs() -> list[ModelSpec]:
    return [spec(a, q, v) for a in ARCHITECTURES for v in VARIANTS for q in range(1, len(LADDER) + 1)]
