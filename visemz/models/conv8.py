"""The integer residual prior's layers on a GPU's 8-bit tensor cores: one Triton kernel (``conv8_kernel.py``).

``integer_prior.run_layer`` computes a layer exactly anywhere (on a CPU as 8-bit matrix products, elsewhere through
float64 convolutions, which on a GPU run on the float64 units).  This kernel multiplies the same int8 values on the
8-bit tensor cores into 32-bit sums, which are exact by construction, then adds the bias and requantises in 64-bit
integers: its outputs equal ``run_layer``'s bit for bit (tests/test_conv8.py; the GPU tests compare them).

Activations travel as (images, h, w, C) int8 with C = 64 channels: every layer of the prior has at most 64 inputs
(the trunk's: the reduced features, the reconstruction and the side channels; a head's: the trunk's output and the
context) and outputs, and its weights are padded with zeros to 64 x 64 per tap.  The trunk's last layer writes into
the heads' input buffer, whose channels after the trunk's take each step's context; a head's output layer (1 x 1)
is fused into the layer before it, its 32-bit sums stored channels first.
"""

from __future__ import annotations

import functools
import weakref
from dataclasses import dataclass

import torch

from ..device import published
from . import probes
from .integer_prior import SHIFT, IntegerLayer, IntegerNet, requantised, run_layer

C = 64  # channels of every activation buffer
HN = 16  # a head's fused output layer: at most this many outputs (the tensor cores' smallest block)
BLOCK_M, TILE_W, WARPS = 128, 32, 4


def fits(net: IntegerNet) -> bool:
    """Whether the kernel takes this prior's layers: inputs and outputs of every layer within C, heads within HN."""
    c4 = 4 * net.channels
    return net.reduced + c4 + 2 <= C and net.width + c4 <= C and net.width <= C and 2 * net.channels <= HN


@functools.lru_cache(maxsize=None)
def available() -> bool:
    """Whether the kernel runs here: Triton installed and a first small layer on the current GPU equal to
    ``run_layer``'s.  Otherwise (warned about once) the float64 path serves, with the same values."""
    return probes.runs(_probe, "the 8-bit convolution kernel", "float64 convolutions serve instead")


def _probe() -> None:
    g = torch.Generator().manual_seed(0)
    layer = IntegerLayer(torch.randint(-127, 128, (40, 50, 3, 3), generator=g).to(torch.int8),
                         torch.randint(-5000, 5000, (40,), generator=g).to(torch.int32),
                         torch.randint(1 << 20, 1 << 24, (40,), generator=g), None).to("cuda")
    x = torch.randint(-127, 128, (2, 50, 9, 11), generator=g).to(torch.int8).cuda()
    buf = _buffer(x.shape[0], x.shape[2], x.shape[3], x.device)
    buf[..., :50] = x.permute(0, 2, 3, 1)
    out = _buffer(x.shape[0], x.shape[2], x.shape[3], x.device)
    _launch(buf, layer, out, c_store=40)
    if not torch.equal(out[..., :40].permute(0, 3, 1, 2), run_layer(layer, x)):
        raise RuntimeError("its result differs from the float64 path's")


@dataclass
class Trunk:
    """The heads' input buffer: the trunk's output in channels 0..width-1, a step's context after them."""

    buffer: torch.Tensor
    width: int


def trunk(net: IntegerNet, r: torch.Tensor, recon: torch.Tensor, side: tuple[int, int]) -> Trunk:
    """``IntegerNet.condition`` on the kernel: ``r`` (B, R, h, w), ``recon`` (B, 4C, h, w) integer tensors."""
    b, n_r, h, w = r.shape
    n_x = recon.shape[1]
    x = _buffer(b, h, w, r.device)
    x[..., :n_r] = r.permute(0, 2, 3, 1)
    x[..., n_r:n_r + n_x] = recon.permute(0, 2, 3, 1)
    x[..., n_r + n_x] = side[0]
    x[..., n_r + n_x + 1] = side[1]
    for layer in net.trunk[:-1]:
        out = _buffer(b, h, w, r.device)
        _launch(x, layer, out, C)
        x = out
    heads_in = _buffer(b, h, w, r.device)
    _launch(x, net.trunk[-1], heads_in, net.width)
    return Trunk(heads_in, net.width)


def head(net: IntegerNet, k: int, t: Trunk, context: torch.Tensor) -> torch.Tensor:
    """Head k's output (B, 2C, h, w) float64 (offset, then log_scale channels) on the kernel; ``context``
    (B, 4C, h, w) integers, written into the buffer's channels after the trunk's."""
    buf = t.buffer
    b, h, w, _ = buf.shape
    buf[..., t.width:t.width + context.shape[1]] = context.permute(0, 2, 3, 1)
    first, second, last = net.heads[k]
    mid = _buffer(b, h, w, buf.device)
    _launch(buf, first, mid, C)
    out = torch.empty((b, last.weight.shape[0], h, w), dtype=torch.int32, device=buf.device)
    _launch(mid, second, out, C, last)
    return requantised(out.to(torch.int64), last)


def _buffer(b: int, h: int, w: int, device) -> torch.Tensor:
    return torch.zeros((b, h, w, C), dtype=torch.int8, device=device)


def _launch(x: torch.Tensor, layer: IntegerLayer, out: torch.Tensor, c_store: int,
            head_layer: IntegerLayer | None = None) -> None:
    from .conv8_kernel import conv8_kernel

    b, h, w, _ = x.shape
    weight, bias, mult = _prepared(layer, C)
    hw, hb = _prepared(head_layer, HN)[:2] if head_layer is not None else (weight, bias)
    n_head = head_layer.weight.shape[0] if head_layer is not None else 0
    k = layer.weight.shape[-1]
    grid = (b * -(-h // (BLOCK_M // TILE_W)) * -(-w // TILE_W),)  # ceiling divisions, as conv64 writes them
    conv8_kernel[grid](x, weight, bias, mult, out, hw, hb, h, w, c_store, n_head, 1 << (SHIFT - 1), SHIFT,
                       KSIZE=k, HEAD=head_layer is not None, C=C, HN=HN, BLOCK_M=BLOCK_M, TILE_W=TILE_W,
                       num_warps=WARPS)


_PREPARED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # layer -> {n_out: its tensors for the kernel}


def _prepared(layer: IntegerLayer, n_out: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A layer's weights as (taps, C, n_out) int8 (input channel, output channel), its bias (n_out,) int32 and
    multipliers (n_out,) int64, zero-padded, on the layer's device; made once per layer (a layer lives on one
    device: ``IntegerNet.to`` makes new ones)."""
    made = _PREPARED.setdefault(layer, {})
    if n_out not in made:
        o, i, kh, kw = layer.weight.shape
        weight = torch.zeros((kh * kw, C, n_out), dtype=torch.int8, device=layer.weight.device)
        weight[:, :i, :o] = layer.weight.permute(2, 3, 1, 0).reshape(kh * kw, i, o)
        bias = torch.zeros(n_out, dtype=torch.int32, device=layer.weight.device)
        bias[:o] = layer.bias
        mult = torch.zeros(n_out, dtype=torch.int64, device=layer.weight.device)
        if layer.mult is not None:
            mult[:o] = layer.mult
        made[n_out] = (weight.contiguous(), bias, published(mult))  # one wait for the three (one stream)
    return made[n_out]
