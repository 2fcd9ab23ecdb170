"""CompressAI architectures with 1 or 3 image channels and gain units, and their latent interfaces.

CompressAI's classes hard-code RGB in the first analysis and last synthesis layers;
``build`` swaps those two layers for the spec's channel count and adds gain units
(Cui et al., "Asymmetric Gained Deep Image Compression with Continuous Rate Adaptation",
CVPR 2021): a learned gain vector per ladder level scales the latent before quantisation
and a separate inverse gain scales it back before synthesis; the hyperprior model has a
second pair on its hyper-latent.  Between two levels the vectors are interpolated
geometrically, which gives every quality in [1, 8].

``minnen2020`` is the mean-scale hyperprior with a channel-conditional context model
(``channel_context.py``): its y is quantised, dequantised and (for the codec's scales, in
float64) modelled slice by slice through ``channel_context.walk``.

The functions below are what the codec needs from a model: analysis to integer
symbols and synthesis from them, at a quality.  The codec never calls CompressAI's rANS;
``compressai_compress``/``compressai_decompress`` run CompressAI's own coder on the same
latents, for comparisons.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from compressai.layers import GDN
from compressai.models import FactorizedPrior, MeanScaleHyperprior
from compressai.models.utils import conv, deconv

from .. import defaults
from . import blocks, channel_context, conv64, graphs
from .channel_context import is_context
from .registry import COMPRESSAI_LAMBDAS, LEVELS, ModelSpec, level_and_fraction

_CLASSES = {"balle2016": FactorizedPrior, "mbt2018-mean": MeanScaleHyperprior}
# lambda of the middle of the ladder: gains start at sqrt(lambda / this), so that the latent's
# quantisation step starts out roughly where each lambda wants it (step ~ lambda^-1/2)
_LAMBDA_REF = COMPRESSAI_LAMBDAS[3]
STRIDE = 16  # pixels per position of the latent y (g_a: four stride-2 convolutions)


class GainUnits(torch.nn.Module):
    """Per-level gain and inverse-gain vectors, stored as logarithms (so they stay positive)."""

    def __init__(self, channels: int, levels: int = LEVELS):
        super().__init__()
        init = torch.tensor([0.5 * math.log(lam / _LAMBDA_REF) for lam in COMPRESSAI_LAMBDAS[:levels]])
        self.log_gain = torch.nn.Parameter(init[:, None].repeat(1, channels))
        self.log_inv_gain = torch.nn.Parameter(-init[:, None].repeat(1, channels))
        self._at_cache: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    def at(self, quality: float, dtype: torch.dtype, device) -> tuple[torch.Tensor, torch.Tensor]:
        """(gain, inverse gain), each (1, C, 1, 1), for one quality.

        Computed in float64 on the CPU whatever the model's device, so the encoder and a
        decoder on another device scale by the same numbers.

        Cached per (quality, dtype, device) while the parameters stay the same (their storage and
        version counter are in the key, so a training step or a load_state_dict makes new ones): on
        a GPU each computation is two blocking host-to-device copies, and torch synchronises the
        stream after each, which stalled the host in the middle of the network's queued work (6 of
        them per image analysed, 4 per image decoded).  The cached tensors are read-only for the
        callers (every use is out of place)."""
        device = _indexed(torch.device(device))
        if self.log_gain.is_inference() or self.log_inv_gain.is_inference():
            return self._compute_at(quality, dtype, device)  # no version counter to tell a change: not cached
        key = (float(quality), dtype, device, _state(self.log_gain), _state(self.log_inv_gain))
        hit = self._at_cache.get(key)
        if hit is None:
            if len(self._at_cache) >= _AT_CACHE_SIZE:
                _drop(self._at_cache)
            hit = self._at_cache[key] = self._compute_at(quality, dtype, device)
        return hit

    def _compute_at(self, quality: float, dtype: torch.dtype,
                    device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        i, a = level_and_fraction(quality)
        out = []
        # ordinary tensors (not inference tensors, whatever the caller's mode), without a graph: a cached
        # pair made under the codec's inference mode is used later by encoder-side refinement under autograd
        with torch.inference_mode(False), torch.no_grad():
            for logs in (self.log_gain, self.log_inv_gain):
                v = logs.detach().to("cpu", torch.float64)
                out.append(torch.exp((1 - a) * v[i] + a * v[i + 1]).view(1, -1, 1, 1).to(device, dtype))
        return out[0], out[1]

    def per_sample(self, quality: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(gain, inverse gain), each (B, C, 1, 1), for a batch of float qualities on the device
        (training: differentiable, no host sync)."""
        return (interpolate_ladder(self.log_gain, quality)[:, :, None, None],
                interpolate_ladder(self.log_inv_gain, quality)[:, :, None, None])


_AT_CACHE_SIZE = 64  # (quality, dtype, device) pairs a GainUnits keeps; a sweep over more qualities starts over


def _state(p: torch.Tensor) -> tuple:
    """What changes when a parameter's values may have: its storage, device and version counter (bumped by
    every in-place write: optimiser steps, load_state_dict's copies)."""
    return (p.data_ptr(), p.device, p.dtype, p._version)


def _indexed(device: torch.device) -> torch.device:
    """A CUDA device with its index (plain "cuda" means the current device, which may change)."""
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def _drop(cache: dict) -> None:
    """Empty a gain cache.  Another stream may still read a cached CUDA tensor, and the caching allocator
    could hand its memory to a new tensor at once: wait for each device first (rare: a full cache)."""
    with graphs.outside_capture():  # no capture between the wait and the clear (it would read a freed gain)
        for device in {k[2] for k in list(cache)}:  # a snapshot: other threads may add meanwhile
            if device.type == "cuda":
                torch.cuda.synchronize(device)
        cache.clear()


def interpolate_ladder(logs: torch.Tensor, quality: torch.Tensor) -> torch.Tensor:
    """exp of per-level values ``logs`` (levels first) interpolated linearly at each of a batch of float
    qualities: the tensor form of ``level_and_fraction`` (on the device, no host sync)."""
    q = quality.clamp(1.0, float(LEVELS))
    low = torch.clamp(torch.floor(q), max=LEVELS - 1)
    a = (q - low).view(-1, *([1] * (logs.dim() - 1)))
    i = (low - 1).long()
    return torch.exp((1 - a) * logs[i] + a * logs[i + 1])


def build(spec: ModelSpec) -> torch.nn.Module:
    if spec.context:
        model = channel_context.ChannelContextHyperprior(spec.N, spec.M, spec.slices)
    else:
        model = _CLASSES[spec.arch](spec.N, spec.M)
    if spec.channels != 3:
        model.g_a[0] = conv(spec.channels, spec.N)
        model.g_s[-1] = deconv(spec.N, spec.channels)
    model.gain = GainUnits(spec.M)
    if has_hyperprior(model):
        model.hyper_gain = GainUnits(spec.N)
    return model


class FrozenGDN(GDN):
    """A GDN (or IGDN) whose non-negative beta and gamma were computed once from its parameters
    (``freeze_gdn``): CompressAI's layer re-derives them on every call, about 12 small kernels and
    a custom autograd function per layer, host work on every image.  The same values, so
    the same outputs.  Its buffers are derived in ``frozen_dtype``; converted to another dtype (a
    float64 copy) they would round differently from a derivation in that dtype, so it then computes
    as CompressAI's layer does, until frozen again."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gamma_eff.dtype != self.frozen_dtype:
            return super().forward(x)
        norm = F.conv2d(x**2, self.gamma_eff, self.beta_eff)
        return x * (torch.sqrt(norm) if self.inverse else torch.rsqrt(norm))


def freeze_gdn(model: torch.nn.Module) -> torch.nn.Module:
    """Every GDN layer of an inference model (no training: the parameters must not change after this)
    becomes a ``FrozenGDN`` with beta and gamma derived in the parameters' current dtype and device;
    call again after a dtype change.  Buffers not persistent: the state dict is unchanged."""
    for m in model.modules():
        if isinstance(m, GDN) and type(m) in (GDN, FrozenGDN):
            with torch.no_grad():
                beta, gamma = m.beta_reparam(m.beta), m.gamma_reparam(m.gamma)
            c = beta.numel()
            m.register_buffer("beta_eff", beta.detach().clone(), persistent=False)
            m.register_buffer("gamma_eff", gamma.detach().reshape(c, c, 1, 1).clone(), persistent=False)
            m.frozen_dtype = beta.dtype
            m.__class__ = FrozenGDN
    return model


def gains(model: torch.nn.Module, quality: float, dtype: torch.dtype, device) -> tuple:
    """Every cached gain tensor the model's functions read at this quality, dtype and device (what a CUDA
    graph of them must keep alive: ``models/graphs.py``)."""
    units = [model.gain] + ([model.hyper_gain] if has_hyperprior(model) else [])
    return tuple(u.at(quality, dtype, device) for u in units)


def has_hyperprior(model: torch.nn.Module) -> bool:
    return hasattr(model, "h_a")


def medians(bottleneck) -> torch.Tensor:
    """Per-channel medians of a CompressAI EntropyBottleneck, shaped (1, C, 1, 1)."""
    return bottleneck.quantiles[:, 0, 1].detach().view(1, -1, 1, 1)


def bottleneck_likelihood(bottleneck, values: torch.Tensor) -> torch.Tensor:
    """A CompressAI EntropyBottleneck's likelihood of each of ``values`` (B, C, ...), lower bound applied;
    differentiable in ``values``, which it takes as they are (noised, rounded or relaxed by the caller).

    What EntropyBottleneck.forward computes after its quantisation, with the channel permutation as
    Python ints (CompressAI builds it as a device tensor, a host-to-device copy that a CUDA graph
    cannot capture).  Swapping the first two axes is its own inverse."""
    perm = (1, 0, *range(2, values.ndim))
    v = values.permute(*perm).contiguous()
    likelihood, _, _ = bottleneck._likelihood(v.reshape(v.shape[0], 1, -1))
    if bottleneck.use_likelihood_bound:
        likelihood = bottleneck.likelihood_lower_bound(likelihood)
    return likelihood.reshape(v.shape).permute(*perm).contiguous()


def _hyper_params(model, z_sym: torch.Tensor, quality: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Integer hyper-latent symbols -> (scales, means) of the gained latent."""
    scales, means = hyper_output(model, z_sym, quality).chunk(2, 1)
    return scales, means


def hyper_output(model, z_sym: torch.Tensor, quality: float) -> torch.Tensor:
    """Integer hyper-latent symbols (as floats of the model's dtype) -> h_s's output (scales, means)."""
    _, inv = model.hyper_gain.at(quality, z_sym.dtype, z_sym.device)
    z_hat = (z_sym + medians(model.entropy_bottleneck).to(z_sym.dtype)) * inv
    return hyper_synthesis(model, z_hat)


def hyper_synthesis(model, z_hat: torch.Tensor) -> torch.Tensor:
    """h_s(z_hat).  On a GPU in float64 (the scales every device must agree on) its convolutions run on
    PyTorch's own im2col + GEMM kernels, i.e. cuBLAS's float64 GEMM, instead of cuDNN's float64
    convolutions, which ran at 1.5-9 TFLOP/s on an H200 and took 0.76 ms of a Kodak image's compress and
    as much of its decompress.  Both are float64: they differ in the last bits only, which the
    scale-index exceptions absorb as between any two devices."""
    return transform(model.h_s, z_hat)


def transform(layers, x: torch.Tensor) -> torch.Tensor:
    """A Sequential of the entropy model (h_s, a slice transform) on ``x``: in float64 on a GPU through
    ATen's GEMM convolutions (``hyper_synthesis`` says why), else the modules' own forward."""
    if x.is_cuda and x.dtype == torch.float64:
        return native_forward(layers, x)
    return layers(x)


# conv64 pays where a layer has many outputs: on an H200, layers of 48 and 128 outputs ran 1.6-2.5x faster than
# ATen's, g_s's last (one output, padded to the tensor cores' 16) 7x slower
IMPLICIT_MIN_CHANNELS = 48


def native_forward(layers, x, implicit_gemm: bool = False) -> torch.Tensor:
    """A Sequential's forward with its plain convolutions (zero padding, no groups or dilation) on
    ATen's im2col + GEMM kernels (slow_conv2d / slow_conv_transpose2d) rather than cuDNN's.  With
    ``implicit_gemm`` (for large inputs: the residual prior, the float64 synthesis), those of stride 1 or
    transposed with IMPLICIT_MIN_CHANNELS outputs or more (on a GPU) run as ``conv64``'s kernel instead, a ReLU after
    one and a small 1 x 1 convolution after that (``conv64.fuses_head``) applied before its store, and so do
    float64 GDN layers of as many channels, when the ``implicit_gemm`` setting is on and Triton is installed.  A
    layer the kernel fails on (``conv64.KernelFailed``) and every one after it run on ATen: the same values up to
    float64 rounding.  ``x``: a tensor, or a tuple of two whose concatenation along the channels is the input
    (the kernel reads a first convolution's parts where they lie)."""
    implicit_gemm = implicit_gemm and implicit_gemm_on(first_part(x))
    layers = list(layers)
    i = 0
    while i < len(layers):
        if implicit_gemm:
            try:
                taken = _on_kernel(layers, i, x)
            except conv64.KernelFailed:
                implicit_gemm = False  # conv64 has turned itself off (and said why): this layer again, on ATen
                continue
            if taken is not None:
                x, i = taken
                continue
        x = _on_aten(layers[i], joined(x))
        i += 1
    return x


def joined(x) -> torch.Tensor:
    """A layer's input (a tensor, or a tuple of parts to concatenate along the channels) as one tensor."""
    return torch.cat(x, 1) if isinstance(x, tuple) else x


def first_part(x) -> torch.Tensor:
    """A layer's input's first part (the input itself where it is one tensor)."""
    return x[0] if isinstance(x, tuple) else x


def implicit_gemm_on(x: torch.Tensor) -> bool:
    """Whether ``native_forward(..., implicit_gemm=True)`` runs ``x``'s wide layers on conv64: a GPU tensor, the
    ``implicit_gemm`` setting on and the kernel available.  Its callers then need no im2col buffers, which is
    what sizes their blocks otherwise (``models/blocks.py``)."""
    return x.is_cuda and bool(defaults.get("implicit_gemm")) and conv64.available()


def _plain(layer) -> bool:
    """A convolution of zero padding, no groups and no dilation (what ATen's slow kernels and conv64 compute)."""
    return isinstance(layer, (torch.nn.Conv2d, torch.nn.ConvTranspose2d)) and layer.groups == 1 \
        and layer.padding_mode == "zeros" and tuple(layer.dilation) == (1, 1) and not isinstance(layer.padding, str)


def _on_kernel(layers: list, i: int, x) -> tuple[torch.Tensor, int] | None:
    """Layer i on conv64, a ReLU after it fused: (its output, the next layer's index); None where conv64 does not
    serve it."""
    layer = layers[i]
    transposed = isinstance(layer, torch.nn.ConvTranspose2d)
    if _plain(layer) and layer.out_channels >= IMPLICIT_MIN_CHANNELS and (transposed or tuple(layer.stride) == (1, 1)):
        relu = i + 1 < len(layers) and isinstance(layers[i + 1], torch.nn.ReLU)
        after = i + (2 if relu else 1)
        if transposed:
            return conv64.conv_transpose2d(joined(x), layer, relu), after
        if after < len(layers) and conv64.fuses_head(layer, layers[after]):  # the residual prior's heads' last two
            return conv64.conv2d(x, layer, relu, head=layers[after]), after + 1
        return conv64.conv2d(x, layer, relu), after
    if _frozen_gdn(layer, first_part(x)):
        return conv64.gdn(joined(x), layer.gamma_eff, layer.beta_eff, layer.inverse), i + 1
    return None


def _on_aten(layer, x: torch.Tensor) -> torch.Tensor:
    if _plain(layer) and isinstance(layer, torch.nn.ConvTranspose2d):
        return torch.ops.aten.slow_conv_transpose2d(x, layer.weight, layer.kernel_size, layer.bias, layer.stride,
                                                    layer.padding, layer.output_padding, layer.dilation)
    if _plain(layer):
        return torch.ops.aten._slow_conv2d_forward(x, layer.weight, layer.kernel_size, layer.bias, layer.stride,
                                                   layer.padding)
    return layer(x)


def _frozen_gdn(layer, x: torch.Tensor) -> bool:
    """Whether ``layer`` is a FrozenGDN whose frozen parameters serve ``x`` (float64, on a GPU, enough channels)."""
    return isinstance(layer, FrozenGDN) and layer.gamma_eff.dtype == layer.frozen_dtype == x.dtype == torch.float64 \
        and x.is_cuda and layer.beta_eff.numel() >= IMPLICIT_MIN_CHANNELS


def analysis_latents(model: torch.nn.Module, x: torch.Tensor, quality: float,
                     crop: tuple[int, int, int, int] | None = None) -> dict[str, torch.Tensor]:
    """Image batch in [0, 1] -> the gained latents before rounding: {"y": g * y, ["z": hg * h_a(g * y)]}.

    ``crop`` (y0, y1, x0, x1) in latent positions keeps that part of g_a's output, and the hyperprior
    sees only it: a tile's core analysed with a halo of pixels around it (``visemz/image/tiling.py``)."""
    g, _ = model.gain.at(quality, x.dtype, x.device)
    y = analysis_transform(model, x) * g
    if crop is not None:
        y = y[:, :, crop[0]:crop[1], crop[2]:crop[3]]
    if not has_hyperprior(model):
        return {"y": y}
    hg, _ = model.hyper_gain.at(quality, x.dtype, x.device)
    return {"y": y, "z": model.h_a(y) * hg}


# latent positions of context before / after a block that g_a needs (32 and 16 pixels: position m depends on
# pixels 16m - 30 .. 16m + 30)
ANALYSIS_HALO = (2, 1)


def analysis_transform(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """g_a(x), block by block where the image is large (``blocks.py``: memory follows a block; the same latent
    up to float rounding).  Working memory per latent position: its 16 x 16 pixels' first-layer activations
    (N channels at a quarter of the pixels) and GDN's temporaries."""
    h, w = x.shape[2] // STRIDE, x.shape[3] // STRIDE
    n = model.g_a[0].out_channels
    unit = x.shape[0] * STRIDE * STRIDE * (n // 4) * x.element_size() * 4
    plan = blocks.plan(h, w, *ANALYSIS_HALO, unit, x.device)
    if len(plan) == 1:
        return model.g_a(x)
    s = STRIDE
    return blocks.run(lambda r, c: (model.g_a(x[:, :, r[0] * s:r[1] * s, c[0] * s:c[1] * s]),), plan, (1,))[0]


def quantise(model: torch.nn.Module, latents: dict[str, torch.Tensor], quality: float) -> dict[str, torch.Tensor]:
    """Gained latents (``analysis_latents``, or refined ones, ``visemz/image/refine.py``) -> integer symbols (int32).

    Factorized: y_sym = round(y - median).  Mean-scale hyperprior: z_sym = round(z - median_z), and
    y_sym = round(y - mean), the mean predicted from the dequantised z_sym as the decoder predicts it."""
    y = latents["y"]
    if not has_hyperprior(model):
        return {"y": torch.round(y - medians(model.entropy_bottleneck).to(y.dtype)).to(torch.int32)}
    z_sym = torch.round(latents["z"] - medians(model.entropy_bottleneck).to(y.dtype))
    if is_context(model):
        return {"y": _context_symbols(model, y, hyper_output(model, z_sym, quality)), "z": z_sym.to(torch.int32)}
    _, means = _hyper_params(model, z_sym, quality)
    return {"y": torch.round(y - means).to(torch.int32), "z": z_sym.to(torch.int32)}


def _context_symbols(model, y: torch.Tensor, params: torch.Tensor) -> torch.Tensor:
    """A channel-context model's y symbols, slice by slice: round(y_k - mu_k), mu_k from the slices before."""
    parts, symbols = channel_context.split(model, y), []

    def take(k: int, mu: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        symbols.append(torch.round(parts[k] - mu))
        return symbols[-1] + mu

    channel_context.walk(model, params, take, transform)
    return torch.cat(symbols, 1).to(torch.int32)


def context_scales(model, symbols: dict[str, torch.Tensor], quality: float) -> list[torch.Tensor]:
    """A channel-context model's scale of every y symbol, per slice, from the symbols as a decoder holds them
    (in the model's dtype: float64 for coding, on any device alike up to the last bits)."""
    dtype = next(model.parameters()).dtype
    parts, scales = channel_context.split(model, symbols["y"].to(dtype)), []

    def take(k: int, mu: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        scales.append(sigma.contiguous())
        return parts[k] + mu

    channel_context.walk(model, hyper_output(model, symbols["z"].to(dtype), quality), take, transform)
    return scales


def analyse(model: torch.nn.Module, x: torch.Tensor, quality: float,
            crop: tuple[int, int, int, int] | None = None) -> dict[str, torch.Tensor]:
    """Image batch in [0, 1] -> integer symbols {"y": ..., ["z": ...]} (int32, same device).

    Factorized: y_sym = round(g * y - median).  Mean-scale hyperprior: z_sym = round(hg * z - median_z)
    with z = h_a(g * y), and y_sym = round(g * y - mean), the mean predicted from the dequantised z.
    ``crop``: see ``analysis_latents``.
    """
    return quantise(model, analysis_latents(model, x, quality, crop), quality)


def dequantise(model: torch.nn.Module, symbols: dict[str, torch.Tensor], quality: float,
               dtype=torch.float32) -> torch.Tensor:
    """Integer symbols -> the latent g_s takes (the decoded y times the inverse gain), in ``dtype``."""
    y_sym = symbols["y"].to(dtype)
    if not has_hyperprior(model):
        y_hat = y_sym + medians(model.entropy_bottleneck).to(dtype)
    elif is_context(model):
        parts = channel_context.split(model, y_sym)
        y_hat = channel_context.walk(model, hyper_output(model, symbols["z"].to(dtype), quality),
                                     lambda k, mu, sigma: parts[k] + mu, transform)
    else:
        _, means = _hyper_params(model, symbols["z"].to(dtype), quality)
        y_hat = y_sym + means
    _, inv = model.gain.at(quality, dtype, y_sym.device)
    return y_hat * inv


def latent_shapes(model: torch.nn.Module, batch: int, height: int, width: int) -> dict[str, tuple]:
    """Shapes of the symbol tensors for a padded image of height x width (multiples of 64)."""
    m = model.g_a[-1].out_channels
    shapes = {"y": (batch, m, height // 16, width // 16)}
    if has_hyperprior(model):
        shapes["z"] = (batch, model.h_a[-1].out_channels, height // 64, width // 64)
    return shapes


def compressai_compress(model: torch.nn.Module, x: torch.Tensor, quality: float) -> dict:
    """CompressAI's own compress() (its rANS coder on the CPU) on this model's gained latents.

    Needs ``model.update(force=True)`` first.  Returns {"strings": [...], "shape": (h, w)} as
    CompressAI's models do."""
    g, _ = model.gain.at(quality, x.dtype, x.device)
    y = model.g_a(x) * g
    if not has_hyperprior(model):
        return {"strings": [model.entropy_bottleneck.compress(y)], "shape": y.size()[-2:]}
    hg, _ = model.hyper_gain.at(quality, x.dtype, x.device)
    z = model.h_a(y) * hg
    z_strings = model.entropy_bottleneck.compress(z)
    z_sym = model.entropy_bottleneck.decompress(z_strings, z.size()[-2:]) - medians(model.entropy_bottleneck)
    if is_context(model):
        parts, strings = channel_context.split(model, y), []

        def take(k: int, mu: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
            gc = model.gaussian_conditional
            indexes = gc.build_indexes(sigma)
            strings.append(gc.compress(parts[k], indexes, means=mu))
            return gc.decompress(strings[-1], indexes, means=mu)

        channel_context.walk(model, hyper_output(model, torch.round(z_sym), quality), take)
        return {"strings": [*strings, z_strings], "shape": z.size()[-2:]}
    scales, means = _hyper_params(model, torch.round(z_sym), quality)
    indexes = model.gaussian_conditional.build_indexes(scales)
    y_strings = model.gaussian_conditional.compress(y, indexes, means=means)
    return {"strings": [y_strings, z_strings], "shape": z.size()[-2:]}


def compressai_decompress(model: torch.nn.Module, strings: list, shape, quality: float) -> torch.Tensor:
    """Inverse of ``compressai_compress``: the reconstructed batch (unclipped)."""
    if not has_hyperprior(model):
        y_hat = model.entropy_bottleneck.decompress(strings[0], shape)
    elif is_context(model):
        z_hat = model.entropy_bottleneck.decompress(strings[-1], shape)
        z_sym = torch.round(z_hat - medians(model.entropy_bottleneck))
        gc = model.gaussian_conditional
        y_hat = channel_context.walk(model, hyper_output(model, z_sym, quality),
                                     lambda k, mu, sigma: gc.decompress(strings[k], gc.build_indexes(sigma), means=mu))
    else:
        z_hat = model.entropy_bottleneck.decompress(strings[1], shape)
        z_sym = torch.round(z_hat - medians(model.entropy_bottleneck))
        scales, means = _hyper_params(model, z_sym, quality)
        indexes = model.gaussian_conditional.build_indexes(scales)
        y_hat = model.gaussian_conditional.decompress(strings[0], indexes, means=means)
    _, inv = model.gain.at(quality, y_hat.dtype, y_hat.device)
    return model.g_s(y_hat * inv)
