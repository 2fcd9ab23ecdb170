"""CompressAI architectures with 1 or 3 image channels, and their latent interfaces.

CompressAI's classes hard-code RGB in the first analysis and last synthesis layers;
``build`` swaps those two layers for the spec's channel count.  The functions below
are what the codec needs from a model: analysis to latents, quantisation offsets,
and synthesis from integer symbols.  The codec never calls CompressAI's rANS.
"""

from __future__ import annotations

import torch
from compressai.layers import GDN  # noqa: F401  (GDN layers come with the architectures)
from compressai.models import FactorizedPrior, MeanScaleHyperprior
from compressai.models.utils import conv, deconv

from .registry import ModelSpec

_CLASSES = {"balle2016": FactorizedPrior, "mbt2018-mean": MeanScaleHyperprior}


def build(spec: ModelSpec) -> torch.nn.Module:
    model = _CLASSES[spec.arch](spec.N, spec.M)
    if spec.channels != 3:
        model.g_a[0] = conv(spec.channels, spec.N)
        model.g_s[-1] = deconv(spec.N, spec.channels)
    return model


def has_hyperprior(model: torch.nn.Module) -> bool:
    return hasattr(model, "h_a")


def medians(bottleneck) -> torch.Tensor:
    """Per-channel medians of a CompressAI EntropyBottleneck, shaped (1, C, 1, 1)."""
    return bottleneck.quantiles[:, 0, 1].detach().view(1, -1, 1, 1)


def analyse(model: torch.nn.Module, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """Image batch in [0, 1] -> integer symbols {"y": ..., ["z": ...]} (int32, same device).

    Factorized: y_sym = round(y - median).  Mean-scale hyperprior: z_sym = round(z - median_z),
    and y_sym = round(y - mean), the mean predicted from the dequantised z.
    """
    y = model.g_a(x)
    if not has_hyperprior(model):
        return {"y": torch.round(y - medians(model.entropy_bottleneck).to(y.dtype)).to(torch.int32)}
    z = model.h_a(y)
    mz = medians(model.entropy_bottleneck).to(z.dtype)
    z_sym = torch.round(z - mz)
    means = _means(model, z_sym + mz)
    return {"y": torch.round(y - means).to(torch.int32), "z": z_sym.to(torch.int32)}


def _means(model: torch.nn.Module, z_hat: torch.Tensor) -> torch.Tensor:
    _scales, means = model.h_s(z_hat).chunk(2, 1)
    return means


def synthesise(model: torch.nn.Module, symbols: dict[str, torch.Tensor], dtype=torch.float32) -> torch.Tensor:
    """Integer symbols -> reconstructed image batch (unclipped), computed in ``dtype``."""
    y_sym = symbols["y"].to(dtype)
    if not has_hyperprior(model):
        y_hat = y_sym + medians(model.entropy_bottleneck).to(dtype)
    else:
        z_hat = symbols["z"].to(dtype) + medians(model.entropy_bottleneck).to(dtype)
        y_hat = y_sym + _means(model, z_hat)
    return model.g_s(y_hat)


def latent_shapes(model: torch.nn.Module, batch: int, height: int, width: int) -> dict[str, tuple]:
    """Shapes of the symbol tensors for a padded image of height x width (multiples of 64)."""
    m = model.g_a[-1].out_channels
    shapes = {"y": (batch, m, height // 16, width // 16)}
    if has_hyperprior(model):
        shapes["z"] = (batch, model.h_a[-1].out_channels, height // 64, width // 64)
    return shapes


def bottleneck_train(bottleneck, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """CompressAI's EntropyBottleneck.forward in training mode (noise, likelihoods), same result.

    CompressAI builds its channel permutation as a device tensor, a host-to-device copy that
    a CUDA graph cannot capture; here the permutation is Python ints.  Swapping the first two
    axes is its own inverse.
    """
    perm = (1, 0, *range(2, x.ndim))
    v = x.permute(*perm).contiguous()
    shape = v.shape
    values = bottleneck.quantize(v.reshape(v.shape[0], 1, -1), "noise", bottleneck._get_medians())
    likelihood, _, _ = bottleneck._likelihood(values)
    if bottleneck.use_likelihood_bound:
        likelihood = bottleneck.likelihood_lower_bound(likelihood)
    return (values.reshape(shape).permute(*perm).contiguous(),
            likelihood.reshape(shape).permute(*perm).contiguous())


def forward_train(model: torch.nn.Module, x: torch.Tensor, amp: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Training forward pass: (x_hat, likelihoods).

    The transforms run under bf16 autocast when ``amp``; the entropy models (likelihoods,
    whose small probabilities bf16 would flatten) always run in float32.  Autocast's
    weight cache is off so that the step can be captured in a CUDA graph.
    """

    def cast():
        return torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=amp, cache_enabled=False)

    with cast():
        y = model.g_a(x)
    y = y.float()
    if not has_hyperprior(model):
        y_hat, y_lik = bottleneck_train(model.entropy_bottleneck, y)
        liks = [y_lik]
    else:
        with cast():
            z = model.h_a(y)
        z_hat, z_lik = bottleneck_train(model.entropy_bottleneck, z.float())
        with cast():
            params = model.h_s(z_hat)
        scales, means = params.float().chunk(2, 1)
        y_hat, y_lik = model.gaussian_conditional(y, scales, means=means)
        liks = [y_lik, z_lik]
    with cast():
        x_hat = model.g_s(y_hat)
    return x_hat.float(), liks
