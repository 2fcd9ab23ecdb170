"""Encoder-side latent refinement: better symbols for the same decoder and file format.

The analysis transform is trained to give good latents on average; for one image, a few
steps of gradient descent on the latents themselves lower that image's rate-distortion cost
(Campos et al., "Content Adaptive Optimization for Neural Image Compression", CVPRW 2019;
Yang et al., "Improving Inference for Neural Image Compression", NeurIPS 2020).  Starting from
the gained latents of ``architectures.analysis_latents`` (y, and the hyper-latent z of the
mean-scale model), Adam minimises the loss the model was trained with at that quality
(``tools/train.py``: bpp + lambda * 255^2 * MSE on [0, 1] pixels, lambda interpolated on the
ladder as the gains are): the rate from the model's own likelihoods (the EntropyBottleneck's for
z or the factorized y, the GaussianConditional's with the scales and means h_s predicts from the
rounded z for y), the distortion from g_s's reconstruction.  Rounding is relaxed by stochastic
Gumbel annealing (SGA, Yang et al.: each value a random soft mix of its floor and ceiling that
hardens as a temperature falls), which measured better than a straight-through estimator (also
available, ``RefineSettings.rounding``): on a 256x256 crop of skimage's astronaut, 50 steps at
qualities 2 and 6 changed the real files' bpp + lambda * 255^2 * MSE by -3.6% to -6.4% with SGA
and by +0.6% to -2.7% with straight-through rounding (docs/results/codec/refine_tuning.md).  The
cost of the hard-rounded latents is measured at the start and the end, and the lower one's latents
are kept, so refinement never writes symbols the model itself rates worse than the analysis's.
``architectures.quantise`` then turns them into symbols exactly as ``analyse`` does, the means
recomputed from the integer z the decoder will see.
Any integer symbols are a valid file: the decoder is unchanged.

Tiles (``tiling.analyse``): each tile's core latents are refined against the tile's core pixels,
synthesised from that tile's latents alone, so near tile borders (where the decoder also reads
the neighbours' latents) the distortion the refinement sees is approximate; the decoder is
unaffected.  Only real pixels count: the edge padding to multiples of 64 is left out of the
distortion.  The refined symbols depend on the device's float arithmetic along the way, so a
GPU and a CPU may write different (equally valid) files; every file still decodes alike everywhere.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..config import check_steps
from ..errors import InvalidArgumentError
from ..models import architectures, registry

ROUNDINGS = ("sga", "ste")
PRECISIONS = ("auto", "bfloat16", "float32")
PIXEL_PEAK = 255  # the training loss weighs MSE on [0, 1] pixels by lambda * 255^2


@dataclass(frozen=True)
class RefineSettings:
    """How latents are refined: ``steps`` Adam steps at ``lr`` (in latent units, where the quantisation
    step is 1), decaying along a half cosine to ``lr * lr_floor`` at the last step.

    ``rounding``: "ste" rounds with a straight-through estimator; "sga" rounds softly (stochastic
    Gumbel annealing, Yang et al. 2020) at a temperature falling from ``tau_start`` to ``tau_end``
    geometrically over the steps, from a generator seeded with ``seed`` (the same file every run).
    ``precision``: what the transforms (g_s, h_s) run in while refining: "bfloat16" (autocast, as in
    training; the gains, rates and the final quantisation stay float32), "float32", or "auto":
    bfloat16 on CUDA (tensor cores), float32 on the CPU (where bfloat16 convolutions are slower)."""

    steps: int
    lr: float = 2e-2
    lr_floor: float = 0.1
    rounding: str = "sga"
    precision: str = "auto"
    tau_start: float = 0.5
    tau_end: float = 0.05
    seed: int = 0

    def __post_init__(self):
        check_steps(self.steps)
        if self.rounding not in ROUNDINGS:
            raise InvalidArgumentError(f"rounding={self.rounding!r}: expected one of {ROUNDINGS}")
        if self.precision not in PRECISIONS:
            raise InvalidArgumentError(f"precision={self.precision!r}: expected one of {PRECISIONS}")
        if not (self.lr > 0 and 0 <= self.lr_floor <= 1 and 0 < self.tau_end <= self.tau_start):
            raise InvalidArgumentError(f"refine settings lr={self.lr}, lr_floor={self.lr_floor}, "
                                       f"tau {self.tau_start} -> {self.tau_end}: expected lr > 0, lr_floor in "
                                       f"[0, 1] and 0 < tau_end <= tau_start")

    def lr_at(self, step: int) -> float:
        frac = step / max(self.steps - 1, 1)
        return self.lr * (self.lr_floor + (1 - self.lr_floor) * 0.5 * (1 + math.cos(math.pi * frac)))

    def tau_at(self, step: int) -> float:
        frac = step / max(self.steps - 1, 1)
        return self.tau_start * (self.tau_end / self.tau_start) ** frac


def settings_for(refine) -> RefineSettings | None:
    """The settings for ``refine``: a number of steps (checked; the other settings their defaults) or
    a RefineSettings (as it is: for measuring other settings, ``visemz.benchmarks.refine``); None for
    0 steps (the analysis's own symbols)."""
    settings = refine if isinstance(refine, RefineSettings) else RefineSettings(check_steps(refine))
    return settings if settings.steps else None


def refine_symbols(net, x: torch.Tensor, quality: float, crop, valid: list[tuple[int, int]],
                   settings: RefineSettings) -> dict[str, torch.Tensor]:
    """``architectures.analyse``'s symbols for the batch ``x``, after refining its latents.

    ``crop``: as in ``analyse`` (the core of a tile's window, in latent positions; None: all);
    ``valid``: for each sample of the batch, the (height, width) of real pixels at the top left of
    its core.  Runs with autograd on whatever the caller's mode (no_grad, inference_mode); the
    model's parameters and mode are left as they are (gradients are taken for the latents only)."""
    with torch.inference_mode(False), torch.enable_grad():
        x = x.clone()  # an inference-mode tensor cannot be saved for backward; a clone made here can
        with torch.no_grad():
            start = architectures.analysis_latents(net, x, quality, crop)
        target = _core(x, crop)
        mask = _valid_mask(target, valid)
        cost = _Cost(net, quality, target, mask, _half(settings.precision, x.device))
        best = _optimise(cost, start, settings)
        with torch.no_grad():
            return architectures.quantise(net, best, quality)


def _core(x: torch.Tensor, crop) -> torch.Tensor:
    """The pixels a window's latent core stands for (the whole window when ``crop`` is None)."""
    if crop is None:
        return x
    y0, y1, x0, x1 = (v * architectures.STRIDE for v in crop)
    return x[:, :, y0:y1, x0:x1]


def _valid_mask(target: torch.Tensor, valid: list[tuple[int, int]]) -> torch.Tensor:
    """(B, 1, H, W) float mask: 1 on each sample's real pixels, 0 on the edge padding."""
    if len(valid) != target.shape[0]:
        raise ValueError(f"{len(valid)} valid sizes for a batch of {target.shape[0]}")
    mask = torch.zeros(target.shape[0], 1, *target.shape[2:], dtype=target.dtype, device=target.device)
    for b, (h, w) in enumerate(valid):
        mask[b, :, :h, :w] = 1
    return mask


class _Cost:
    """The training loss of one batch's latents: (bits + lambda * 255^2 * SSE / channels) / real pixels,
    i.e. bpp + lambda * 255^2 * MSE over the real pixels, with the latents rounded by ``rounder``."""

    def __init__(self, net, quality: float, target: torch.Tensor, mask: torch.Tensor, half: bool):
        self.net, self.quality, self.target, self.mask, self.half = net, quality, target, mask, half
        self.weight = registry.lam(quality) * PIXEL_PEAK**2 / target.shape[1]
        self.pixels = float(mask.sum())
        _, self.inv = net.gain.at(quality, target.dtype, target.device)

    def __call__(self, latents: dict[str, torch.Tensor], rounder) -> torch.Tensor:
        bits, y_hat = _bits_and_latent(self.net, latents, self.quality, rounder, self.transforms)
        with self.transforms():
            x_hat = self.net.g_s(y_hat * self.inv)
        sse = ((x_hat.float() - self.target) ** 2 * self.mask).sum()
        return (bits + self.weight * sse) / self.pixels

    def transforms(self):
        """The context the transforms run in: bfloat16 autocast or nothing (float32)."""
        return torch.autocast(self.target.device.type, dtype=torch.bfloat16, enabled=self.half)


def _half(precision: str, device: torch.device) -> bool:
    return precision == "bfloat16" or (precision == "auto" and device.type == "cuda")


def _ste_round(v: torch.Tensor) -> torch.Tensor:
    """round(v) forward, identity backward."""
    return v + (torch.round(v) - v).detach()


class _SoftRound:
    """Stochastic Gumbel annealing (Yang et al. 2020): v becomes a random mix of floor(v) and
    floor(v) + 1 that favours the nearer, harder as the temperature ``tau`` falls; differentiable."""

    EPS = 1e-5

    def __init__(self, tau: float, generator: torch.Generator):
        self.tau, self.generator = tau, generator

    def __call__(self, v: torch.Tensor) -> torch.Tensor:
        low = torch.floor(v.detach())
        dist = torch.stack([v - low, low + 1 - v], -1).clamp(0, 1 - self.EPS)
        logits = -torch.atanh(dist) / self.tau
        u = torch.rand(dist.shape, generator=self.generator, dtype=v.dtype, device=v.device)
        gumbel = -torch.log(-torch.log(u.clamp(self.EPS, 1 - self.EPS)))
        return low + torch.softmax((logits + gumbel) / self.tau, -1)[..., 1]


def _bits_and_latent(net, latents: dict[str, torch.Tensor], quality: float, rounder,
                     transforms) -> tuple[torch.Tensor, torch.Tensor]:
    """(bits of the rounded latents under the model's priors, the dequantised y), differentiable.

    The same path as ``architectures.quantise`` + ``dequantise``: z rounded about its medians, y
    about the means h_s predicts from that rounded z; ``rounder`` rounds (hard, straight-through or soft),
    ``transforms()`` is the context h_s runs in."""
    y, eb = latents["y"], net.entropy_bottleneck
    if not architectures.has_hyperprior(net):
        med = architectures.medians(eb).to(y.dtype)
        y_hat = rounder(y - med) + med
        return _bits(architectures.bottleneck_likelihood(eb, y_hat)), y_hat
    z = latents["z"]
    med = architectures.medians(eb).to(z.dtype)
    z_sym = rounder(z - med)
    with transforms():
        scales, means = architectures._hyper_params(net, z_sym, quality)
    scales, means = scales.float(), means.float()
    y_hat = rounder(y - means) + means
    gc = net.gaussian_conditional
    y_lik = gc._likelihood(y_hat, scales, means)
    if gc.use_likelihood_bound:
        y_lik = gc.likelihood_lower_bound(y_lik)
    return _bits(architectures.bottleneck_likelihood(eb, z_sym + med)) + _bits(y_lik), y_hat


def _bits(likelihood: torch.Tensor) -> torch.Tensor:
    return torch.log2(likelihood).sum().neg()


class _Best:
    """The latents of the lowest cost offered, kept on the device (no host sync per offer)."""

    def __init__(self, latents: dict[str, torch.Tensor], cost: torch.Tensor):
        self.latents = {k: v.detach().clone() for k, v in latents.items()}
        self.cost = cost.detach()

    def offer(self, latents: dict[str, torch.Tensor], cost: torch.Tensor) -> None:
        better = cost.detach() < self.cost
        self.latents = {k: torch.where(better, latents[k].detach(), v) for k, v in self.latents.items()}
        self.cost = torch.minimum(cost.detach(), self.cost)


def _optimise(cost: _Cost, start: dict[str, torch.Tensor], settings: RefineSettings) -> dict[str, torch.Tensor]:
    """Adam on the latents for ``settings.steps`` steps; the latents whose rounded cost is the lowest
    of those measured: the start, the end and, with straight-through rounding, every step (whose loss
    is that cost)."""
    latents = {k: v.detach().clone().requires_grad_(True) for k, v in start.items()}
    params = list(latents.values())
    opt = torch.optim.Adam(params, lr=settings.lr)
    generator = torch.Generator(device=params[0].device).manual_seed(settings.seed)
    with torch.no_grad():
        best = _Best(start, cost(start, torch.round))
    for step in range(settings.steps):
        ste = settings.rounding == "ste"
        loss = cost(latents, _ste_round if ste else _SoftRound(settings.tau_at(step), generator))
        if ste:
            best.offer(latents, loss)
        grads = torch.autograd.grad(loss, params)  # the latents' only: the model's parameters get no .grad
        for p, g in zip(params, grads):
            p.grad = g
        opt.param_groups[0]["lr"] = settings.lr_at(step)
        opt.step()
    with torch.no_grad():
        best.offer(latents, cost(latents, torch.round))
    return best.latents
