"""The channel-conditional context model (Minnen & Singh, "Channel-wise Autoregressive Entropy Models
for Learned Image Compression", ICIP 2020), with latent residual prediction.

CompressAI's mean-scale hyperprior (``MeanScaleHyperprior``: g_a, g_s, h_a with GDN, the entropy
bottleneck, the Gaussian conditional) whose latent y is coded in slices of channels.  Slice k's
Gaussian (mean, scale) comes from the hyperprior's scales and means of its own channels and the
slices decoded before it; once it is decoded, a latent residual prediction (LRP) from the same
context and the slice itself corrects the slice's quantisation error before the next slices see it:

    hyper scales, hyper means = h_s(z_hat).chunk(2)                 (per channel, scales first)
    sigma_k, mu_k = params_k(cat(hyper scales_k, hyper means_k, y_hat_0 .. y_hat_{k-1})).chunk(2)
    y_hat_k = round(y_k - mu_k) + mu_k + 0.5 tanh(lrp_k(cat(hyper means_k, y_hat_0 .. y_hat_{k-1}, that)))

Decoding runs in as many steps as there are slices, with no serial loop over positions.  Every
slice sees all slices before it (Minnen & Singh cap the support at five of their ten slices; with
five slices that is all of them).  Slices may be uneven (``ModelSpec.slices``, e.g. ELIC's 16, 16,
32, 64, 192).

Where this departs from Minnen & Singh, to fit two models (RGB and gray) into the package's weights
budget beside the older models (int8 kernels; 18.3 M parameters, 19.2 MB, each at N = 192, M = 320):
one transform gives a slice's mean and scale together (as CompressAI's ``ChannelGroupsLatentCodec``
with a ``GaussianConditionalLatentCodec`` does) rather than one each; the transforms see the
hyperprior's parameters of their own slice's channels rather than all M; they are three 3x3
convolutions of 128 and 96 hidden channels (``WIDTHS``; theirs 5x5, 5x5, 3x3 of 224 and 128); and
h_s is CompressAI's ELIC-shaped one.  CompressAI's latent codecs themselves are not used: the codec
runs the slice loop in float64 for its integer coding (``walk``), with gain units between the
transforms, and training needs the per-sample gains inside the loop too.

``walk`` is the one slice loop: the codec's encoder and decoder, dequantisation, CompressAI's coder
(for comparisons) and training each hand it what happens to a slice (``take``) and how a transform
runs (``run``).
"""

from __future__ import annotations

from typing import Callable

import torch
from compressai.models import MeanScaleHyperprior
from compressai.models.utils import conv, deconv

WIDTHS = (128, 96)  # hidden channels of every slice transform (Minnen & Singh's: 224, 128)


def slice_transform(inputs: int, outputs: int) -> torch.nn.Sequential:
    """Context -> a slice's Gaussian parameters or its residual prediction (3x3 convolutions, stride 1)."""
    a, b = WIDTHS
    return torch.nn.Sequential(conv(inputs, a, kernel_size=3, stride=1), torch.nn.ReLU(),
                               conv(a, b, kernel_size=3, stride=1), torch.nn.ReLU(),
                               conv(b, outputs, kernel_size=3, stride=1))


def hyper_synthesis(N: int, M: int) -> torch.nn.Sequential:
    """h_s: CompressAI's ELIC / Cheng 2020 hyper-synthesis shape (about half the parameters of the mean-scale
    model's at M = 320), to the scales and means of every latent channel (2M, scales first)."""
    return torch.nn.Sequential(deconv(N, N, kernel_size=5, stride=2), torch.nn.ReLU(),
                               deconv(N, N * 3 // 2, kernel_size=5, stride=2), torch.nn.ReLU(),
                               conv(N * 3 // 2, 2 * M, kernel_size=3, stride=1))


class ChannelContextHyperprior(MeanScaleHyperprior):
    """CompressAI's mean-scale hyperprior (its h_s replaced by ``hyper_synthesis``) plus per-slice parameter
    and LRP transforms."""

    def __init__(self, N: int, M: int, slices: tuple[int, ...]):
        super().__init__(N, M)
        self.h_s = hyper_synthesis(N, M)
        self.slices = tuple(slices)
        before = [sum(self.slices[:k]) for k in range(len(self.slices))]
        self.param_transforms = torch.nn.ModuleList(slice_transform(2 * g + c, 2 * g)
                                                    for c, g in zip(before, self.slices))
        self.lrp_transforms = torch.nn.ModuleList(slice_transform(2 * g + c, g) for c, g in zip(before, self.slices))


def is_context(model: torch.nn.Module) -> bool:
    return isinstance(model, ChannelContextHyperprior)


Take = Callable[[int, torch.Tensor, torch.Tensor], torch.Tensor]  # (slice, means, scales) -> y_hat_k before LRP
Run = Callable[[torch.nn.Module, torch.Tensor], torch.Tensor]  # (transform, input) -> output


def call(transform: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    return transform(x)


def walk(model: ChannelContextHyperprior, params: torch.Tensor, take: Take, run: Run = call) -> torch.Tensor:
    """The decoded latent y_hat (gained, LRP applied), slice after slice.

    ``params``: h_s's output (the hyperprior's scales and means, 2M channels).  ``take(k, mu, sigma)``
    returns slice k's y_hat before LRP: the encoder's round(y_k - mu) + mu, the decoder's decoded
    symbols + mu, training's straight-through rounding; it may also record mu and sigma."""
    scales, means = (split(model, t) for t in params.chunk(2, 1))
    done: list[torch.Tensor] = []
    for k in range(len(model.slices)):
        sigma, mu = run(model.param_transforms[k], torch.cat([scales[k], means[k], *done], 1)).chunk(2, 1)
        y_k = take(k, mu, sigma)
        lrp = run(model.lrp_transforms[k], torch.cat([means[k], *done, y_k], 1))
        done.append(y_k + 0.5 * torch.tanh(lrp))
    return torch.cat(done, 1)


def split(model: ChannelContextHyperprior, y: torch.Tensor) -> list[torch.Tensor]:
    """A latent (B, M, h, w) as its slices (views)."""
    return list(torch.split(y, model.slices, dim=1))
