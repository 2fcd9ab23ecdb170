"""The training forward pass of the gained models (tools/train.py); inference never imports this.

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
from compressai.ops import quantize_ste

from ..errors import InvalidArgumentError
from . import channel_context
from .architectures import bottleneck_likelihood, has_hyperprior, interpolate_ladder, medians
from .channel_context import is_context
from .registry import COMPRESSAI_LAMBDAS, LEVELS, ModelSpec, check_quality, parse


@dataclass(frozen=True)
class TrainingName:
    """A model name as tools/train.py takes it: ARCH-VARIANT, optionally with one tag."""

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

    A channel-context model (``channel_context.py``) gives one likelihood tensor per slice (then z's):
    each slice's from the noised slice under its Gaussian, as CompressAI's GaussianConditional trains,
    while the slices the later ones and g_s see are rounded about their means with a straight-through
    gradient (round(y - mu) + mu, Minnen & Singh's training), plus the LRP.
    """

    def cast():
        return torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=amp, cache_enabled=False)

    def run(transform: torch.nn.Module, v: torch.Tensor) -> torch.Tensor:
        with cast():
            return transform(v).float()

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
        if is_context(model):
            y_hat, liks = _context_train(model, y, params.float(), run)
            liks.append(z_lik)
        else:
            scales, means = params.float().chunk(2, 1)
            y_hat, y_lik = model.gaussian_conditional(y, scales, means=means)
            liks = [y_lik, z_lik]
    with cast():
        x_hat = model.g_s(y_hat * inv)
    return x_hat.float(), liks


def _context_train(model, y: torch.Tensor, params: torch.Tensor, run) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """(y_hat with LRP, each slice's likelihoods): the channel-context model's training walk."""
    parts, liks = channel_context.split(model, y), []

    def take(k: int, mu: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        liks.append(model.gaussian_conditional(parts[k], sigma, means=mu)[1])
        return quantize_ste(parts[k] - mu) + mu

    return channel_context.walk(model, params, take, run), liks


# CompressAI's published Kodak results of its mbt2018-mean zoo models at qualities 1-8 (MSE-trained; the
# figures of docs/results/rd/compressai_published_kodak.json): the per-quality reference of the normalised loss.
ZOO_BPP = (0.12392171223958336, 0.19798109266493058, 0.3072441948784722, 0.46061197916666674,
           0.6616651746961806, 0.9144049750434027, 1.2342088487413194, 1.619089762369792)
ZOO_PSNR = (27.699473000769824, 29.35881842156732, 31.128916249986656, 32.95067519149061,
            34.968296546935704, 36.911094917040515, 38.83751427361349, 40.633312667109166)
LOSSES = ("normalised", "rd")


def reference_losses() -> tuple[float, ...]:
    """Per ladder level, the RD loss lambda * 255^2 * MSE + bpp of CompressAI's zoo model on Kodak: from 0.32 at
    quality 1 to 2.63 at quality 8."""
    return tuple(lam * 255**2 * 10 ** (-psnr / 10) + bpp
                 for lam, psnr, bpp in zip(COMPRESSAI_LAMBDAS, ZOO_PSNR, ZOO_BPP))


def log_reference_table(device) -> torch.Tensor:
    """log of ``reference_losses`` on ``device`` (made once, outside any CUDA graph capture)."""
    return torch.log(torch.tensor(reference_losses(), dtype=torch.float32, device=device))


def rd_loss(x: torch.Tensor, x_hat: torch.Tensor, liks: list[torch.Tensor], quality: torch.Tensor,
            log_lambdas: torch.Tensor, log_references: torch.Tensor | None = None
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(loss, mse, bpp): the batch mean of lambda_i * 255^2 * MSE_i + bpp_i (CompressAI's RD loss, per sample),
    each sample's divided by its quality's reference loss when ``log_references`` (``log_reference_table``) is given.

    Why normalise: a sample's RD loss grows with its lambda (the zoo's Kodak points give 0.32 at quality 1 and
    2.63 at quality 8), so in the plain batch mean the high qualities' samples carry about eight times the
    gradient of the low ones, and the low end of the ladder trains slowly.  Divided by the loss a good model
    reaches at its quality (the zoo's, interpolated geometrically between levels as lambda is), every sample
    weighs its relative improvement alike, whatever its quality; at one fixed quality it is the plain loss
    times a constant.  The reference is a fixed table, not a running statistic, so the objective does not
    move during training and a resumed run optimises the same thing."""
    pixels = x.shape[2] * x.shape[3]
    bits = sum(torch.log(lik).flatten(1).sum(1) for lik in liks) / -math.log(2)
    bpp = bits / pixels
    mse = torch.mean((x_hat - x) ** 2, dim=(1, 2, 3))
    per_sample = lambdas(quality, log_lambdas) * 255**2 * mse + bpp
    if log_references is not None:
        per_sample = per_sample / interpolate_ladder(log_references, quality)
    return torch.mean(per_sample), mse.mean(), bpp.mean()


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
            if is_context(model):
                parts = channel_context.split(model, y)

                def run(transform: torch.nn.Module, v: torch.Tensor) -> torch.Tensor:
                    with cast():
                        return transform(v).float()

                y_hat = channel_context.walk(model, params, lambda k, mu, sigma: torch.round(parts[k] - mu) + mu, run)
            else:
                _, means = params.chunk(2, 1)
                y_hat = torch.round(y - means) + means
        with cast():
            features = model.g_s[:-1](y_hat * inv)
            x_hat = model.g_s[-1](features)
        return features.float(), x_hat.float()
