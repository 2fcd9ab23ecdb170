"""The integer residual prior: the residual prior's network in 8-bit integers, exact on every device.

The float prior (``residual_prior.py``) runs in float64 so that a CPU and a GPU compute the same distributions
up to their last bits, and the coder lists the pixels where those bits could matter.  Its convolutions are most
of a lossless compress's GPU work (float64 tensor cores run at a small fraction of the 8-bit ones).  This prior
has the same layers (a trunk once, a head per pass, at half resolution) with integers throughout:

- every convolution multiplies 8-bit inputs by 8-bit weights and sums in 32 bits (at most 9 x 64 x 127 x 127,
  below 2**24), which any device computes exactly: the GPU's 8-bit tensor cores, a CPU's 8-bit matrix products,
  float64 convolutions (every partial sum an integer below 2**53);
- a hidden layer adds its 32-bit bias and requantises with an integer multiplier per output channel,
  ``y = clamp((acc * mult + 2**(SHIFT - 1)) >> SHIFT, 0, ACT_MAX)`` (the ReLU is the clamp at 0), in 64 bits;
- a head's last layer (1 x 1) gives (offset, log_scale) as ``(acc + bias) * step``, one float64 product per
  value, rounded alike everywhere.

So the network's outputs are the same numbers on every device, and only its inputs come from float64 values
(g_s's features and the reconstruction), each turned into an integer by one rounding:

- ``reduced``: the prior's 1 x 1 reduction of g_s's features, computed in float64 in units of one step, rounded
  and clamped to [-IN_MAX, IN_MAX];
- the prediction in sixteenths of a level, ``p16 = floor(16 pred + 1/2)`` (pred = the reconstruction in the
  tile's domain, as the float prior's mean starts from).

From p16 and the tile's integers everything else is integer arithmetic: the reconstruction channel
(``recon_steps``, 0..127 over the domain), the two side channels (log2 u and log2 b in eighths of an octave,
exactly: ``octave_steps``) and each pass's context (the decoded pixels' residuals from p16, ``context_steps``).

Training (``IntegerPrior``, ``nll_bits``) runs the same arithmetic in floating point with rounding's gradient
passed straight through: weights quantised per output channel from the float weights times the input's step,
activations rounded to a learnt step per layer (``log_act``), the reduction's output to a learnt step per channel
(``log_reduced``).  ``IntegerPrior.integers()`` turns a trained prior into the integer layers coding runs.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .. import defaults
from ..device import published
from . import probes
from .residual_prior import (
    LOG_SCALE_RANGE,
    MIN_LOG_PROB,
    OFFSET_RANGE,
    PASSES,
    ResidualPrior,
    _log_bin_prob,
    head_channels,
    space_to_depth,
    steps,
)

W_MAX = 127  # |weight| after quantisation
ACT_MAX = 127  # hidden activations: 0..127 (after the ReLU), 8-bit signed on the tensor cores
IN_MAX = 127  # |input| of the reduced features, the context and the side channels
SHIFT = 32  # the requantisation's multiplier is a fixed-point number of SHIFT fractional bits
SUB = 16  # the prediction's integer unit: a sixteenth of a level
RECON_MAX = 127  # the reconstruction channel: 0..127 over the domain (the float prior's x01 times 127)
SIDE_PER_OCTAVE = 8  # the side channels count eighths of an octave
# what one step of each input is worth to the network (chosen so that the float prior's inputs are these times the
# integers: x01, log2 u / 8, log2 b / 4, residual / (8 u))
RECON_STEP, U_STEP, BIN_STEP, CONTEXT_STEP = 1 / RECON_MAX, 1 / 64, 1 / 32, 1 / 16


# ----------------------------------------------------------------------------- the integer inputs, exact
def octave_steps(num: int, den: int, per: int = SIDE_PER_OCTAVE) -> int:
    """round(per * log2(num / den)) (halves up) in exact integer arithmetic, clamped to [-IN_MAX, IN_MAX]: the same
    on every machine, where a libm's log2 may differ in its last bit.  n is the answer when
    2**(2n - 1) <= (num / den)**(2 per) < 2**(2n + 1)."""
    if num <= 0 or den <= 0:
        raise ValueError(f"octave_steps needs positive integers, got {num} / {den}")
    a, b = num ** (2 * per), den ** (2 * per)

    def below(e: int) -> bool:  # 2**e <= a / b
        return (b << e) <= a if e >= 0 else b <= (a << -e)

    n = (a.bit_length() - b.bit_length()) // 2  # within one of the answer
    while n > -IN_MAX - 1 and not below(2 * n - 1):
        n -= 1
    while n < IN_MAX + 1 and below(2 * n + 1):
        n += 1
    return max(-IN_MAX, min(IN_MAX, n))


def side_steps(span: int, bin_: int) -> tuple[int, int]:
    """The side channels' integers: log2 u (u = span / 255) and log2 b, in eighths of an octave."""
    return octave_steps(max(span, 1), 255), octave_steps(bin_, 1)


def recon_steps(p16: torch.Tensor, lo, span) -> torch.Tensor:
    """The reconstruction channel from the prediction in sixteenths: round(127 (pred - lo) / span), 0..127.
    ``p16`` integers (int64, or floats holding integers); ``lo``, ``span`` numbers or broadcastable tensors."""
    num = 2 * RECON_MAX * (p16 - SUB * lo) + SUB * span
    return torch.div(num, 2 * SUB * span, rounding_mode="floor").clamp(0, RECON_MAX)


def context_steps(decoded: torch.Tensor, p16: torch.Tensor, span) -> torch.Tensor:
    """A decoded pixel's context value: round(2 * 255 (x - p16 / 16) / span) = its residual / (8 u) in sixteenths,
    clamped to [-IN_MAX, IN_MAX]."""
    r16 = SUB * decoded - p16
    return torch.div(255 * r16 + 4 * span, 8 * span, rounding_mode="floor").clamp(-IN_MAX, IN_MAX)


def round_half_up(x: torch.Tensor) -> torch.Tensor:
    return torch.floor(x + 0.5)


def _round_ste(x: torch.Tensor) -> torch.Tensor:
    """Rounding (halves up) with the identity's gradient."""
    return x + (round_half_up(x) - x).detach()


# ----------------------------------------------------------------------------- training form
class IntegerPrior(ResidualPrior):
    """The float prior's layers with the quantisation steps it trains with (``nll_bits``); a float prior's weights
    load into it as a start (``load_state_dict(..., strict=False)``)."""

    def __init__(self, channels: int = 1, features: int = 128, width: int = 48, reduced: int = 32):
        super().__init__(channels, features, width, reduced)
        # log of each hidden layer's output step: the trunk's, then each head's two
        self.log_act = nn.Parameter(torch.zeros(len(self.trunk) // 2 + 2 * len(self.heads)))
        self.log_reduced = nn.Parameter(torch.zeros(reduced))  # log of the reduced features' step, per channel

    def init_steps(self, reduced: torch.Tensor, x01: torch.Tensor, log2_u: torch.Tensor,
                   log2_bin: torch.Tensor, context: torch.Tensor) -> None:
        """Set the steps from the float network's values on a batch: each input or activation's 99.99th percentile
        at the top of its range."""
        with torch.no_grad():
            self.log_reduced.copy_(torch.log(_top(reduced, per_channel=True).clamp_min(1e-4) / IN_MAX))
            acts = []
            b, _, h, w = reduced.shape
            side = torch.stack([log2_u / 8.0, log2_bin / 4.0], 1)[:, :, None, None].expand(b, 2, h, w)
            x = torch.cat([reduced, space_to_depth(x01.clamp(0, 1)), side], 1)
            for layer in self.trunk:
                x = layer(x)
                if isinstance(layer, nn.ReLU):
                    acts.append(_top(x))
            trunk = x
            for head in self.heads:
                x = torch.cat([trunk, context], 1)
                for layer in head:
                    x = layer(x)
                    if isinstance(layer, nn.ReLU):
                        acts.append(_top(x))
            self.log_act.copy_(torch.log(torch.stack(acts).clamp_min(1e-4) / ACT_MAX))

    def quantised_reduced(self, reduced: torch.Tensor) -> torch.Tensor:
        """g_s's reduced features (the float ``reduce``'s output) as the integers the trunk takes."""
        step = torch.exp(self.log_reduced).view(1, -1, 1, 1)
        return _round_ste(reduced / step).clamp(-IN_MAX, IN_MAX)

    def trunk_steps(self) -> torch.Tensor:
        """What one step of each trunk input is worth: reduced, reconstruction (4C), log2 u, log2 b."""
        c4 = 4 * self.channels
        return torch.cat([torch.exp(self.log_reduced), self.log_reduced.new_full((c4,), RECON_STEP),
                          self.log_reduced.new_tensor([U_STEP, BIN_STEP])])

    def head_steps(self) -> torch.Tensor:
        c4 = 4 * self.channels
        return torch.cat([torch.exp(self.log_act[len(self.trunk) // 2 - 1]).expand(self.width),
                          self.log_act.new_full((c4,), CONTEXT_STEP)])

    def condition_int(self, r: torch.Tensor, recon: torch.Tensor, side: torch.Tensor) -> torch.Tensor:
        """The trunk's output (integers as floats) from integer inputs (floats holding integers): ``r`` (B, R, h, w),
        ``recon`` (B, 4C, h, w), ``side`` (B, 2) the side channels' integers."""
        b, _, h, w = r.shape
        x = torch.cat([r, recon, side[:, :, None, None].expand(b, 2, h, w).to(r.dtype)], 1)
        steps_in = self.trunk_steps()
        for j, conv in enumerate(self.trunk[::2]):
            x = _qconv(conv, x, steps_in, torch.exp(self.log_act[j]))
            steps_in = torch.exp(self.log_act[j]).expand(self.width)
        return x

    def head_int(self, k: int, trunk: torch.Tensor, context: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Pass k's (offset, log_scale) from the trunk's integers and the context's (``context_steps``)."""
        first, second, out = self.heads[k][0], self.heads[k][2], self.heads[k][4]
        a0 = self._act(k, 0)
        x = _qconv(first, torch.cat([trunk, context], 1), self.head_steps(), a0)
        a1 = self._act(k, 1)
        x = _qconv(second, x, a0.expand(self.width), a1)
        z = _qconv(out, x, a1.expand(self.width), None)
        offset, log_scale = z.chunk(2, 1)
        return offset.clamp(-OFFSET_RANGE, OFFSET_RANGE), log_scale.clamp(*LOG_SCALE_RANGE)

    def _act(self, k: int, j: int) -> torch.Tensor:
        return torch.exp(self.log_act[len(self.trunk) // 2 + 2 * k + j])

    def integers(self) -> IntegerNet:
        """The integer layers coding runs (CPU tensors)."""
        with torch.no_grad():
            trunk, steps_in = [], self.trunk_steps().double()
            for j, conv in enumerate(self.trunk[::2]):
                a = torch.exp(self.log_act[j]).double()
                trunk.append(IntegerLayer.of(conv, steps_in, a))
                steps_in = a.expand(self.width)
            heads = []
            for k, head in enumerate(self.heads):
                a0, a1 = self._act(k, 0).double(), self._act(k, 1).double()
                heads.append((IntegerLayer.of(head[0], self.head_steps().double(), a0),
                              IntegerLayer.of(head[2], a0.expand(self.width), a1),
                              IntegerLayer.of(head[4], a1.expand(self.width), None)))
            step = torch.exp(self.log_reduced).double().view(-1, 1, 1, 1)
            reduce_w = (self.reduce.weight.double() / step).float()
            reduce_b = (self.reduce.bias.double() / step.view(-1)).float()
        return IntegerNet(self.channels, self.features, self.width, self.reduced, reduce_w, reduce_b, trunk, heads)


def _top(v: torch.Tensor, per_channel: bool = False) -> torch.Tensor:
    """The 99.99th percentile of |v| (per channel, or over all), on a sample small enough for torch.quantile."""
    if per_channel:
        return torch.quantile(v.abs().transpose(0, 1).reshape(v.shape[1], -1)[:, ::7].float(), 0.9999, dim=1)
    return torch.quantile(v.abs().reshape(-1)[::97].float(), 0.9999)


def _qconv(conv: nn.Conv2d, a: torch.Tensor, steps_in: torch.Tensor, step_out: torch.Tensor | None) -> torch.Tensor:
    """``conv`` on integer inputs ``a`` (input channel c worth ``steps_in[c]``): its weights times the steps,
    quantised per output channel to W_MAX (step s_w), summed as integers, the bias rounded to s_w.  Returns the
    hidden layer's integers (``step_out``: its output step) or, with ``step_out`` None, the float output."""
    w = conv.weight * steps_in.view(1, -1, 1, 1).to(conv.weight.dtype)
    s_w = (w.detach().abs().amax(dim=(1, 2, 3)).clamp_min(1e-12) / W_MAX)
    wq = _round_ste(w / s_w.view(-1, 1, 1, 1))
    bq = _round_ste(conv.bias / s_w)
    z = (F.conv2d(a, wq, None, padding=conv.padding) + bq.view(1, -1, 1, 1)) * s_w.view(1, -1, 1, 1)
    if step_out is None:
        return z
    return _round_ste(z / step_out).clamp(0, ACT_MAX)


def nll_bits(prior: IntegerPrior, reduced: torch.Tensor, x01: torch.Tensor, x: torch.Tensor, lo: torch.Tensor,
             hi: torch.Tensor, max_error: torch.Tensor) -> torch.Tensor:
    """Training loss, as ``residual_prior.nll_bits`` with the integer prior's inputs and arithmetic: bits of each
    sample (B,) for coding ``x`` with bound ``max_error``, the passes in order with a decoder's context."""
    span = (hi - lo).clamp_min(1.0)
    u, bin_ = span / 255.0, 2 * max_error + 1
    view = lambda v: v.view(-1, 1, 1, 1).double()  # noqa: E731
    side = torch.tensor([side_steps(int(s), int(b)) for s, b in zip(span.tolist(), bin_.tolist())],
                        dtype=reduced.dtype, device=reduced.device)
    pred = space_to_depth(view(lo) + x01.clamp(0, 1).double() * view(span))
    p16 = round_half_up(SUB * pred)
    recon = recon_steps(p16, view(lo), view(span)).to(reduced.dtype)
    trunk = prior.condition_int(prior.quantised_reduced(reduced), recon, side)
    xs = space_to_depth(x).double()
    c = prior.channels
    known = torch.zeros_like(recon)
    bits = xs.new_zeros(xs.shape[0], dtype=reduced.dtype)
    for k, sl in steps(c):
        offset, log_scale = prior.head_int(k, trunk, known)
        own = head_channels(k, sl, c)
        mu = pred[:, sl].to(offset.dtype) + view(u).to(offset.dtype) * offset[:, own]
        s = view(u).to(offset.dtype) * torch.exp(log_scale[:, own])
        m0 = torch.floor(mu + 0.5).detach()
        e, b = view(max_error).to(mu.dtype), view(bin_).to(mu.dtype)
        q = torch.floor((xs[:, sl].to(mu.dtype) - m0 + e) / b)
        centre = m0 + q * b
        logp = _log_bin_prob((centre - e - 0.5 - mu) / s, (centre + e + 0.5 - mu) / s).clamp_min(MIN_LOG_PROB)
        bits = bits - logp.flatten(1).sum(1) / math.log(2.0)
        decoded = torch.minimum(torch.maximum(centre.double(), view(lo)), view(hi))
        known = torch.cat([known[:, :sl.start], context_steps(decoded, p16[:, sl], view(span)).to(known.dtype),
                           known[:, sl.stop:]], 1)
    return bits


# ----------------------------------------------------------------------------- the integer layers coding runs
@dataclass(frozen=True, eq=False)
class IntegerLayer:
    """One convolution in integers: ``weight`` int8 (out, in, k, k), ``bias`` int32 (out,), then either
    ``mult`` int64 (out,) (a hidden layer: requantised to 0..ACT_MAX) or ``step`` float64 (out,) (an output)."""

    weight: torch.Tensor
    bias: torch.Tensor
    mult: torch.Tensor | None
    step: torch.Tensor | None

    @staticmethod
    def of(conv: nn.Conv2d, steps_in: torch.Tensor, step_out: torch.Tensor | None) -> IntegerLayer:
        w = conv.weight.double() * steps_in.view(1, -1, 1, 1)
        s_w = w.abs().amax(dim=(1, 2, 3)).clamp_min(1e-12) / W_MAX
        wq = round_half_up(w / s_w.view(-1, 1, 1, 1)).clamp(-W_MAX, W_MAX).to(torch.int8)
        bq = round_half_up(conv.bias.double() / s_w).clamp(-(2 ** 30), 2 ** 30).to(torch.int32)
        if step_out is None:
            return IntegerLayer(wq, bq, None, s_w)
        mult = round_half_up(s_w / step_out * 2.0 ** SHIFT).to(torch.int64)
        # a sum (|products| < 2**24, plus the bias) times its multiplier must stay inside int64 on every device
        if int(((2 ** 24 + bq.abs().to(torch.int64)) * mult).max()).bit_length() > 62:
            raise ValueError("an activation step is too small for the requantisation's fixed point")
        return IntegerLayer(wq, bq, mult, None)

    @property
    def padding(self) -> int:
        return self.weight.shape[-1] // 2

    def tensors(self, name: str) -> dict[str, torch.Tensor]:
        out = {f"{name}.weight": self.weight, f"{name}.bias": self.bias}
        out.update({f"{name}.mult": self.mult} if self.mult is not None else {f"{name}.step": self.step})
        return out

    @staticmethod
    def from_tensors(t: dict[str, torch.Tensor], name: str) -> IntegerLayer:
        return IntegerLayer(t[f"{name}.weight"], t[f"{name}.bias"], t.get(f"{name}.mult"), t.get(f"{name}.step"))

    def to(self, device) -> IntegerLayer:
        move = lambda v: None if v is None else v.to(device)  # noqa: E731
        return IntegerLayer(move(self.weight), move(self.bias), move(self.mult), move(self.step))


class IntegerNet:
    """The integer prior as coding runs it: ``reduce`` (float, run in float64 by the caller), the trunk and the heads
    in integers.  Integer tensors in and out: int8 activations, int64 where noted."""

    def __init__(self, channels: int, features: int, width: int, reduced: int, reduce_weight: torch.Tensor,
                 reduce_bias: torch.Tensor, trunk: list[IntegerLayer], heads: list[tuple[IntegerLayer, ...]]):
        self.channels, self.features, self.width, self.reduced = channels, features, width, reduced
        self.reduce_weight, self.reduce_bias = reduce_weight, reduce_bias
        self.trunk, self.heads = trunk, heads

    @property
    def config(self) -> dict:
        return {"channels": self.channels, "features": self.features, "width": self.width, "reduced": self.reduced}

    @functools.cached_property
    def reduce64(self) -> nn.Conv2d:
        """The reduction as a float64 1 x 1 convolution (the synthesis runs it; its outputs are rounded to the
        trunk's integers)."""
        conv = nn.Conv2d(self.features, self.reduced, 1).to(self.reduce_weight.device)
        conv.weight.data, conv.bias.data = self.reduce_weight, self.reduce_bias
        conv = conv.double().eval().requires_grad_(False)
        published(conv.bias)  # converted on this thread's stream; every stream reads the cached layer
        return conv

    def tensors(self) -> dict[str, torch.Tensor]:
        out = {"reduce.weight": self.reduce_weight, "reduce.bias": self.reduce_bias}
        for j, layer in enumerate(self.trunk):
            out.update(layer.tensors(f"trunk.{j}"))
        for k, head in enumerate(self.heads):
            for j, layer in enumerate(head):
                out.update(layer.tensors(f"heads.{k}.{j}"))
        return out

    @staticmethod
    def from_tensors(config: dict, t: dict[str, torch.Tensor]) -> IntegerNet:
        trunk = [IntegerLayer.from_tensors(t, f"trunk.{j}") for j in range(3)]
        heads = [tuple(IntegerLayer.from_tensors(t, f"heads.{k}.{j}") for j in range(3)) for k in range(len(PASSES))]
        return IntegerNet(config["channels"], config["features"], config["width"], config["reduced"],
                          t["reduce.weight"], t["reduce.bias"], trunk, heads)

    def to(self, device) -> IntegerNet:
        return IntegerNet(self.channels, self.features, self.width, self.reduced, self.reduce_weight.to(device),
                          self.reduce_bias.to(device), [layer.to(device) for layer in self.trunk],
                          [tuple(layer.to(device) for layer in head) for head in self.heads])

    def condition(self, r: torch.Tensor, recon: torch.Tensor, side: tuple[int, int]):
        """The trunk's output from ``r`` (B, R, h, w) and ``recon`` (B, 4C, h, w), integer tensors, and ``side`` (the
        two side integers): (B, width, h, w) int8, or on a GPU with the 8-bit kernel its ``conv8.Trunk``."""
        if on_kernel(self, r):
            from . import conv8
            return conv8.trunk(self, r, recon, side)
        b, _, h, w = r.shape
        sides = torch.tensor(side, dtype=torch.int8, device=r.device).view(1, 2, 1, 1).expand(b, 2, h, w)
        x = torch.cat([r.to(torch.int8), recon.to(torch.int8), sides], 1)
        for layer in self.trunk:
            x = run_layer(layer, x)
        return x

    def head(self, k: int, trunk: torch.Tensor, context: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Pass k's (offset, log_scale), float64 (B, C, h, w) each, as ``ResidualPrior.head``; ``trunk`` as
        ``condition`` gave it, ``context`` (B, 4C, h, w) integers (``context_steps``)."""
        if isinstance(trunk, torch.Tensor):
            x = torch.cat([trunk, context.to(torch.int8)], 1)
            for layer in self.heads[k]:
                x = run_layer(layer, x)
        else:
            from . import conv8
            x = conv8.head(self, k, trunk, context)
        offset, log_scale = x.chunk(2, 1)
        return offset.clamp(-OFFSET_RANGE, OFFSET_RANGE), log_scale.clamp(*LOG_SCALE_RANGE)


def on_kernel(net: IntegerNet, x: torch.Tensor) -> bool:
    """Whether ``net`` runs on conv8's kernel: a GPU tensor, the ``implicit_gemm`` setting on (it turns the GPU
    kernels off together), the prior within the kernel's sizes and the kernel available."""
    if not x.is_cuda or not defaults.get("implicit_gemm"):
        return False
    from . import conv8
    return conv8.fits(net) and conv8.available()


def run_layer(layer: IntegerLayer, x: torch.Tensor) -> torch.Tensor:
    """One integer layer on int8 ``x`` (B, in, h, w), exact on any device: its sums, the bias, the requantisation."""
    return requantised(layer_sums(layer.weight, x, layer.padding) + layer.bias.view(1, -1, 1, 1), layer)


def layer_sums(weight: torch.Tensor, x: torch.Tensor, padding: int) -> torch.Tensor:
    """The convolution's integer sums of int8 ``x`` and ``weight`` (int64, (B, out, h, w)), exactly.  On a CPU as
    8-bit matrix products in 32 bits (``_tap_products``; a 3 x 3 layer of the prior at a 512 x 512 image's half
    resolution: 28 ms at one thread against float64's 232);
    elsewhere (a GPU without conv8's kernel), or where those products do not run, through float64 convolutions:
    every partial sum an integer far below 2**53, and the rounding absorbs any algorithm's error (far below 1/2)."""
    if x.device.type == "cpu" and int8_products_run():
        return _tap_products(weight, x, padding).to(torch.int64)
    return _float64_sums(weight, x, padding)


def _float64_sums(weight: torch.Tensor, x: torch.Tensor, padding: int) -> torch.Tensor:
    return torch.round(F.conv2d(x.double(), weight.double(), None, padding=padding)).to(torch.int64)


def _tap_products(weight: torch.Tensor, x: torch.Tensor, padding: int) -> torch.Tensor:
    """The sums as one 8-bit matrix product per tap of the kernel, (B h w, in) @ (in, out), added up in int32 (at most
    9 x 64 x 127 x 127 per sum, far below 2**31): int32 (B, out, h, w), channels last in memory."""
    b, c, h, w = x.shape
    out, k = weight.shape[0], weight.shape[-1]
    rows = F.pad(x, (padding,) * 4).permute(0, 2, 3, 1).contiguous()  # (B, h + 2p, w + 2p, in): each tap reads a window
    taps = weight.permute(2, 3, 1, 0).contiguous()  # (k, k, in, out)
    acc = None
    for dy in range(k):
        for dx in range(k):
            part = torch._int_mm(rows[:, dy:dy + h, dx:dx + w].reshape(b * h * w, c), taps[dy, dx])
            acc = part if acc is None else acc.add_(part)
    return acc.view(b, h, w, out).permute(0, 3, 1, 2)


@functools.lru_cache(maxsize=None)
def int8_products_run() -> bool:
    """Whether the CPU's 8-bit matrix products run here and give the integer sums (checked once on a small layer
    against the float64 path); else, warned about once, float64 convolutions serve, with the same values."""
    return probes.runs(_int8_products_probe, "the CPU's 8-bit matrix products", "float64 convolutions serve the "
                       "integer prior instead", needs=None)


def _int8_products_probe() -> None:
    g = torch.Generator().manual_seed(0)
    weight = torch.randint(-W_MAX, W_MAX + 1, (5, 11, 3, 3), generator=g).to(torch.int8)
    weight[0] = W_MAX  # a sum at its largest
    x = torch.randint(-IN_MAX, IN_MAX + 1, (2, 11, 4, 6), generator=g).to(torch.int8)
    x[0] = IN_MAX
    if not torch.equal(_tap_products(weight, x, 1).to(torch.int64), _float64_sums(weight, x, 1)):
        raise RuntimeError("their sums differ from the float64 path's")


def requantised(acc: torch.Tensor, layer: IntegerLayer) -> torch.Tensor:
    """A layer's sums (int64, bias added) -> its output: 0..ACT_MAX int8 (hidden) or float64 (output)."""
    if layer.mult is None:
        return acc.double() * layer.step.view(1, -1, 1, 1)
    y = (acc * layer.mult.view(1, -1, 1, 1) + (1 << (SHIFT - 1))) >> SHIFT
    return y.clamp(0, ACT_MAX).to(torch.int8)
