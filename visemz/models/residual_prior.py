"""The residual prior: a distribution for every pixel of an image given its lossy reconstruction.

Lossless and near-lossless coding (``visemz/image/residual_coder.py``) code each pixel x under a logistic
distribution (mean mu, scale s, in the image's own levels) that this network predicts from

- the lossy reconstruction x_hat (in [0, 1]) and the synthesis transform's last hidden features (the
  N channels at half resolution that g_s's last layer turns into pixels), and
- a parallel context: the pixels are coded in four passes over the 2 x 2 polyphase grid (space to
  depth at half resolution), and each pass sees the pixels decoded by the passes before it.  Pass 0
  codes the (0, 0) pixel of every 2 x 2 cell, pass 1 the (1, 1), pass 2 the (0, 1), pass 3 the (1, 0):
  no pixel-by-pixel serial loop.  A colour image's pass is coded a channel at a time (``steps``), each
  channel seeing the pass's earlier channels at the same positions too: colour residuals correlate
  strongly, which a pass coding its channels side by side cannot use.  Four network evaluations of
  the heads for a gray image, twelve for RGB.

Everything runs at half resolution: ``trunk`` once per image, ``head(k, ...)`` once per pass.
Units: u = (hi - lo) / 255 levels of the image (1 for uint8), so that 8- and 16-bit images and
images of any range look alike to the network; two constant channels tell it log2 u and the
near-lossless bin 2E + 1, which sets how coarse the context pixels are.

mu = lo + x_hat (hi - lo) + u * offset and s = u * exp(log_scale), (offset, log_scale) the head's
outputs.  Training (``nll_bits``) runs the passes in float32 with the true pixels' quantised
values as context, exactly as a decoder would see them; coding runs them in float64
(``visemz/image/residual_coder.py`` makes the parameters identical on every device).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from . import conv64
from .architectures import first_part, implicit_gemm_on, joined, native_forward

# sub-pixel (dy, dx) of each pass, in coding order
PASSES = ((0, 0), (1, 1), (0, 1), (1, 0))
CONTEXT_SCALE = 8.0  # context pixels enter as residual / (8 u): most of them then lie in [-1, 1]
LOG_SCALE_RANGE = (-9.0, 12.0)  # log of s / u: the heads' output is clamped to it
OFFSET_RANGE = 256.0  # |offset| in units u: a mean beyond 256 u of the reconstruction is clamped
HALO = 5  # half-resolution positions that trunk (3) and head (2) see around a position
# the activations' layout on conv64's path: its tiles over channels-last tensors ran the 3 x 3 convolutions faster
ACTIVATIONS = torch.channels_last


def steps(channels: int) -> list[tuple[int, slice]]:
    """The coding steps in order: (pass k, the channels of the space-to-depth stack it codes).  One step per
    pass for one channel; one per pass and channel for more, so that a channel's step sees the pass's
    earlier channels."""
    if channels == 1:
        return [(k, slice(k, k + 1)) for k in range(len(PASSES))]
    return [(k, slice(k * channels + j, k * channels + j + 1)) for k in range(len(PASSES)) for j in range(channels)]


def head_channels(k: int, sl: slice, channels: int) -> slice:
    """The channels of head k's output (one per image channel) that step (k, ``sl``) codes."""
    return slice(sl.start - k * channels, sl.stop - k * channels)


def space_to_depth(x: torch.Tensor) -> torch.Tensor:
    """(B, C, H, W) with even H, W -> (B, 4C, H/2, W/2), channel p * C + c holding pass p's sub-pixel."""
    return torch.cat([x[:, :, dy::2, dx::2] for dy, dx in PASSES], 1)


def depth_to_space(x: torch.Tensor, channels: int) -> torch.Tensor:
    """Inverse of ``space_to_depth``."""
    b, _, h, w = x.shape
    out = x.new_empty(b, channels, 2 * h, 2 * w)
    for p, (dy, dx) in enumerate(PASSES):
        out[:, :, dy::2, dx::2] = x[:, p * channels:(p + 1) * channels]
    return out


class ResidualPrior(nn.Module):
    """Trunk (conditioning, once) and four heads (one per pass) of 3 x 3 convolutions at half resolution."""

    def __init__(self, channels: int = 1, features: int = 128, width: int = 48, reduced: int = 32):
        super().__init__()
        self.channels, self.features, self.width, self.reduced = channels, features, width, reduced
        c4 = 4 * channels
        # g_s's features are reduced at once (inside a striped synthesis, so the N channels never sit whole)
        self.reduce = nn.Conv2d(features, reduced, 1)
        self.trunk = nn.Sequential(
            nn.Conv2d(reduced + c4 + 2, width, 3, padding=1), nn.ReLU(),
            nn.Conv2d(width, width, 3, padding=1), nn.ReLU(),
            nn.Conv2d(width, width, 3, padding=1), nn.ReLU(),
        )
        self.heads = nn.ModuleList(
            nn.Sequential(
                nn.Conv2d(width + c4, width, 3, padding=1), nn.ReLU(),
                nn.Conv2d(width, width, 3, padding=1), nn.ReLU(),
                nn.Conv2d(width, 2 * channels, 1),
            ) for _ in PASSES
        )
        for head in self.heads:  # start at the reconstruction with s = u
            nn.init.zeros_(head[-1].weight)
            nn.init.zeros_(head[-1].bias)

    @property
    def config(self) -> dict:
        return {"channels": self.channels, "features": self.features, "width": self.width, "reduced": self.reduced}

    def condition(self, reduced: torch.Tensor, x01: torch.Tensor, log2_u: torch.Tensor,
                  log2_bin: torch.Tensor) -> torch.Tensor:
        """The trunk's output at half resolution.  ``reduced``: ``self.reduce`` of g_s's features (B, R, h, w);
        ``x01``: the reconstruction (B, C, 2h, 2w) in [0, 1]; ``log2_u``, ``log2_bin``: per sample (B,)."""
        b, _, h, w = reduced.shape
        side = torch.stack([log2_u / 8.0, log2_bin / 4.0], 1).to(reduced.dtype)[:, :, None, None].expand(b, 2, h, w)
        return _run(self.trunk, torch.cat([reduced, space_to_depth(x01.clamp(0, 1)), side], 1))

    def head(self, k: int, trunk: torch.Tensor, context: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Pass k's (offset, log_scale), each (B, C, h, w) in units u.  ``context``: (B, 4C, h, w), the decoded
        residuals of the steps before (divided by CONTEXT_SCALE u), zero for the others; only the channels of
        the step being coded are used (``steps``)."""
        out = _run(self.heads[k], (trunk, context))
        offset, log_scale = out.chunk(2, 1)
        return offset.clamp(-OFFSET_RANGE, OFFSET_RANGE), log_scale.clamp(*LOG_SCALE_RANGE)


def _run(layers: nn.Sequential, x) -> torch.Tensor:
    """On a GPU in float64 (coding) on the implicit-GEMM kernel or cuBLAS's float64 GEMM rather than cuDNN's slow
    float64 convolutions.  ``x``: a tensor, or two to concatenate along the channels (which the kernel reads
    where they lie)."""
    first = first_part(x)
    if first.is_cuda and first.dtype == torch.float64:
        if implicit_gemm_on(first) and conv64.layout_of(first) != ACTIVATIONS:  # the trunk's input: the heads'
            laid = first.contiguous(memory_format=ACTIVATIONS)  # first part, the trunk's output, follows it
            x = laid if isinstance(x, torch.Tensor) else (laid, *x[1:])
        return native_forward(layers, x, implicit_gemm=True)
    return layers(joined(x))


def _log_bin_prob(lo_edge: torch.Tensor, hi_edge: torch.Tensor) -> torch.Tensor:
    """log P(lo < X < hi) for a standard logistic X, stable in both tails (PixelCNN++'s way)."""
    mid = 0.5 * (lo_edge + hi_edge)
    delta = torch.sigmoid(hi_edge) - torch.sigmoid(lo_edge)
    # far in a tail the difference of two sigmoids loses every digit: the density at the middle times the width
    log_density = mid - 2 * F.softplus(mid) + torch.log((hi_edge - lo_edge).clamp_min(1e-12))
    return torch.where(delta > 1e-5, torch.log(delta.clamp_min(1e-30)), log_density)


MIN_LOG_PROB = math.log(2.0 ** -16)  # the coder's tables give every value at least 1 / 2**16 of the mass


def nll_bits(prior: ResidualPrior, reduced: torch.Tensor, x01: torch.Tensor, x: torch.Tensor, lo: torch.Tensor,
             hi: torch.Tensor, max_error: torch.Tensor) -> torch.Tensor:
    """Training loss: bits of each sample (B,) for coding ``x`` (B, C, H, W: integer levels as floats, within
    [lo, hi] per sample) with bound ``max_error`` (per sample, levels), the passes run in order with the context
    a decoder would have.  ``reduced``/``x01`` as for ``ResidualPrior.condition``."""
    span = (hi - lo).clamp_min(1.0)
    u = span / 255.0
    bin_ = 2 * max_error + 1
    view = lambda v: v.view(-1, 1, 1, 1)  # noqa: E731
    trunk = prior.condition(reduced, x01, torch.log2(u), torch.log2(bin_))
    pred = space_to_depth(view(lo) + x01.clamp(0, 1) * view(span))
    xs = space_to_depth(x)
    c = prior.channels
    known = torch.zeros_like(xs)
    bits = xs.new_zeros(xs.shape[0])
    for k, sl in steps(c):
        offset, log_scale = prior.head(k, trunk, known)
        own = head_channels(k, sl, c)
        mu = pred[:, sl] + view(u) * offset[:, own]
        s = view(u) * torch.exp(log_scale[:, own])
        m0 = torch.floor(mu + 0.5).detach()
        q = torch.floor((xs[:, sl] - m0 + view(max_error)) / view(bin_))
        centre = m0 + q * view(bin_)  # the decoded value (before clamping to [lo, hi])
        half = view(max_error) + 0.5
        logp = _log_bin_prob((centre - half - mu) / s, (centre + half - mu) / s).clamp_min(MIN_LOG_PROB)
        bits = bits - logp.flatten(1).sum(1) / math.log(2.0)
        decoded = torch.minimum(torch.maximum(centre, view(lo)), view(hi))
        known = torch.cat([known[:, :sl.start], (decoded - pred[:, sl]) / (CONTEXT_SCALE * view(u)),
                           known[:, sl.stop:]], 1)
    return bits
