"""The training forward pass of the gained models (scripts/train.py); inference never imports this.

Every sample of a batch has its own quality: its gain vectors scale its latent, and its
lambda weighs its distortion, so one step trains the whole ladder.  A training name may
carry one tag (``TrainingName``): ``@area`` draws crops by area (the gray mix's ablation),
``@qQ`` trains a fixed-rate model, every sample at quality Q (the variable-rate ladder's
reference: same network, same steps, one lambda).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..errors import InvalidArgumentError
from .architectures import bottleneck_likelihood, has_hyperprior, interpolate_ladder, medians
from .registry import COMPRESSAI_LAMBDAS, LEVELS, ModelSpec, check_quality, parse


@dataclass(frozen=True)
class TrainingName:
    """A model name as scripts/train.py takes it: ARCH-VARIANT, optionally with one tag."""

    spec: ModelSpec
    draw: str = "mix"  # how crops are drawn: "mix" (the gray groups' shares) or "area"
    quality: float | None = None  # None: every quality of [1, 8] (variable rate); else the one fixed quality


def parse_name(name: str) -> TrainingName:
    """'mbt2018-mean-rgb' -> variable rate; '...@area' -> drawn by area; '...@q2' -> fixed rate at
    quality 2.  InvalidArgumentError naming the bad tag or quality."""
    base, sep, tag = name.partition("@")
    spec = parse(base)
    if not sep:
        return TrainingName(spec)
    if tag == "area":
        return TrainingName(spec, draw="area")
    if tag.startswith("q"):
        try:
            value = float(tag[1:])
        except ValueError:
            raise InvalidArgumentError(f"model {name!r}: tag @{tag} is not q followed by a quality, e.g. @q2") from None
        try:
            return TrainingName(spec, quality=check_quality(value))
        except InvalidArgumentError as e:
            raise InvalidArgumentError(f"model {name!r}: fixed quality {tag[1:]!r} is outside [1, {LEVELS}]") from e
    raise InvalidArgumentError(f"model {name!r}: unknown tag @{tag}; expected @area or @qQ, "
                               f"Q a quality in [1, {LEVELS}] (e.g. @q2)")


def batch_qualities(n: int, device, fixed: float | None = None) -> torch.Tensor:
    """The qualities of a batch of n samples: stratified over [1, 8], one random point per stratum
    (variable rate), or all ``fixed`` (a fixed-rate model).  Tensor ops only (CUDA-graph safe)."""
    if fixed is not None:
        return torch.full((n,), float(fixed), device=device)
    return 1.0 + (LEVELS - 1) * (torch.arange(n, device=device) + torch.rand(n, device=device)) / n


def bottleneck_train(bottleneck, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """CompressAI's EntropyBottleneck.forward in training mode (noise, likelihoods), same result,
    capturable in a CUDA graph (``architectures.bottleneck_likelihood`` says why)."""
    perm = (1, 0, *range(2, x.ndim))
    v = x.permute(*perm).contiguous()
    values = bottleneck.quantize(v.reshape(v.shape[0], 1, -1), "noise", bottleneck._get_medians())
    values = values.reshape(v.shape).permute(*perm).contiguous()
    return values, bottleneck_likelihood(bottleneck, values)


def log_lambda_table(device) -> torch.Tensor:
    """log of CompressAI's lambda ladder on ``device`` (made once, outside any CUDA graph capture)."""
    return torch.log(torch.tensor(COMPRESSAI_LAMBDAS, dtype=torch.float32, device=device))


def lambdas(quality: torch.Tensor, logs: torch.Tensor) -> torch.Tensor:
    """Per-sample lambda for float qualities in [1, 8]: the ladder ``logs`` (log_lambda_table), interpolated
    geometrically (registry.lam on a tensor)."""
    return interpolate_ladder(logs, quality)


def forward_train(model: torch.nn.Module, x: torch.Tensor, quality: torch.Tensor,
                  amp: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Training forward pass for a batch with per-sample qualities: (x_hat, likelihoods).

    The transforms run under bf16 autocast when ``amp``; the gains and entropy models
    (likelihoods, whose small probabilities bf16 would flatten) always run in float32.
    Autocast's weight cache is off so that the step can be captured in a CUDA graph.
    """

    def cast():
        return torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=amp, cache_enabled=False)

    g, inv = model.gain.per_sample(quality)
    with cast():
        y = model.g_a(x)
    y = y.float() * g
    if not has_hyperprior(model):
        y_hat, y_lik = bottleneck_train(model.entropy_bottleneck, y)
        liks = [y_lik]
    else:
        hg, hinv = model.hyper_gain.per_sample(quality)
        with cast():
            z = model.h_a(y)
        z_hat, z_lik = bottleneck_train(model.entropy_bottleneck, z.float() * hg)
        with cast():
            params = model.h_s(z_hat * hinv)
        scales, means = params.float().chunk(2, 1)
        y_hat, y_lik = model.gaussian_conditional(y, scales, means=means)
        liks = [y_lik, z_lik]
    with cast():
        x_hat = model.g_s(y_hat * inv)
    return x_hat.float(), liks


def rd_loss(x: torch.Tensor, x_hat: torch.Tensor, liks: list[torch.Tensor], quality: torch.Tensor,
            log_lambdas: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(loss, mse, bpp): the batch mean of lambda_i * 255^2 * MSE_i + bpp_i (CompressAI's RD loss, per sample)."""
    pixels = x.shape[2] * x.shape[3]
    bits = sum(torch.log(lik).flatten(1).sum(1) for lik in liks) / -math.log(2)
    bpp = bits / pixels
    mse = torch.mean((x_hat - x) ** 2, dim=(1, 2, 3))
    loss = torch.mean(lambdas(quality, log_lambdas) * 255**2 * mse + bpp)
    return loss, mse.mean(), bpp.mean()


def reconstruct(model: torch.nn.Module, x: torch.Tensor, quality: torch.Tensor,
                amp: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """What a decoder of the lossy file has, for a batch with per-sample qualities and no gradient: (g_s's
    last hidden features, x_hat), both float32.  The latents are rounded as the codec rounds them (around the
    hyperprior's means), so the residual prior trains on the reconstructions it will see."""
    def cast():
        return torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=amp, cache_enabled=False)

    with torch.no_grad():
        g, inv = model.gain.per_sample(quality)
        with cast():
            y = model.g_a(x).float() * g
        if not has_hyperprior(model):
            med = medians(model.entropy_bottleneck)
            y_hat = torch.round(y - med) + med
        else:
            hg, hinv = model.hyper_gain.per_sample(quality)
            with cast():
                z = model.h_a(y).float() * hg
            med = medians(model.entropy_bottleneck)
            z_hat = torch.round(z - med) + med
            with cast():
                params = model.h_s(z_hat * hinv).float()
            _, means = params.chunk(2, 1)
            y_hat = torch.round(y - means) + means
        with cast():
            features = model.g_s[:-1](y_hat * inv)
            x_hat = model.g_s[-1](features)
        return features.float(), x_hat.float()
