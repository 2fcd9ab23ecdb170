"""float64 convolutions on a GPU as one implicit-GEMM Triton kernel (the coding networks' float64 path).

The residual prior, the float64 synthesis and h_s run in float64 on a GPU so that every device computes
the same values up to the last bits (``image/residual_coder.py``, ``encoders/scale_indexes.py``).  cuDNN's
float64 convolutions are slow, and ATen's im2col + GEMM (``architectures.native_forward``'s fallback)
writes and reads every input value once per tap: over a 2048 x 2048 image those copies took as long as
the GEMMs.  This kernel reads the input where it lies and multiplies on the float64 tensor cores
(``tl.dot``), with the bias and a following ReLU applied before the single store.  It pays on layers with many
outputs over large inputs (``architectures.native_forward`` sends it those of the residual prior and the float64
synthesis); h_s's small inputs stay on ATen, which was faster there.

One kernel serves both kinds of layer, as a list of taps over the input:

- a stride-1 convolution: output (i, j) = bias + sum over taps (dy, dx) of W_t^T x(i + dy, j + dx);
- a transposed convolution of stride s: its s x s output phases, each such a sum over the kernel taps that
  reach that phase (a 5 x 5 kernel of stride 2 gives 9, 6, 6 and 4 taps), written to every s-th pixel.

A GDN layer (``architectures.FrozenGDN``: x / sqrt(beta + gamma x**2), or x times it inverted, per position) is the
same kernel as a 1 x 1 convolution of x squared with weights gamma and bias beta, the root and the product with x
applied before the store: over g_s's largest outputs ATen's four passes (square, cuDNN's float64 convolution,
root, product) took longer than the transposed convolution before them.

A layer of 48 outputs (the residual prior's) is one block of 32 and one of 16 rather than one of 64: the tensor
cores then do no work for outputs that do not exist.  A small 1 x 1 convolution after a layer and its ReLU (the
residual prior's heads' last) multiplies the accumulators before the store (``fuses_head``), and a convolution's
input may come in two parts read where they lie (the heads' trunk and context): neither the activation nor the
concatenation is written out.

Any summation order of a float64 sum of K terms is within 2 (K - 1) 2**-53 sum |terms| of any other, the
bound both float64 coders already allow for; tests/test_conv64.py compares with torch's convolutions.
"""

from __future__ import annotations

import contextlib
import functools
import warnings

import torch
from torch.utils.weak import WeakTensorKeyDictionary

from ..device import published
from . import probes

BLOCK_M, BLOCK_K = 128, 16  # output positions per program; input channels per tensor-core step
BLOCK_K_WIDE, WIDE_INPUT = 32, 96  # the step over inputs of WIDE_INPUT channels or more (g_s's 128: faster)
BLOCK_N_MAX = 64  # output channels per program (at least 16, the tensor cores' smallest)
WARPS, STAGES = 4, 2
SPECIALIZE = True  # compile per shape class (Triton then knows sizes of 1 and multiples of 16) or once
SPLIT_N = True  # a program's outputs as two blocks (48 = 32 + 16) where one power of two would pad them
# a program's positions: 0, BLOCK_M consecutive ones; else a tile of BLOCK_M // TILE_W rows by TILE_W, by the layout
# of the output (the first input's): over channels-last tensors tiles of 4 x 32 ran the residual prior's 3 x 3
# convolutions 1.2-1.4x faster than rows on an H200; over channels-first ones tiles gained less and lost on g_s's
# transposed convolution
TILE_W, TILE_W_LAST = 0, 32
HEAD_FUSION, HEAD_MAX = True, 16  # a following 1 x 1 convolution of up to HEAD_MAX outputs applied before the store
NORM_NONE, NORM_INVERSE, NORM_FORWARD = 0, 1, 2  # what follows the sum: nothing, x sqrt(.), x / sqrt(.)


class KernelFailed(RuntimeError):
    """Triton could not compile or launch the kernel for a layer (a variant needing more shared memory than this
    GPU has, a compiler error...): the kernel is off in this process from then on, and the caller computes the
    layer on ATen."""


_TURNED_OFF: list[str] = []  # why the kernel was turned off in this process, once it has been


@functools.lru_cache(maxsize=None)
def available() -> bool:
    """Whether the kernel runs in this process: Triton is installed (it comes with torch's CUDA builds), a first
    small convolution on the current GPU gave torch's result and no layer has failed since.  A failure (Triton
    finds no C compiler for its launcher, a driver too old for it...) is warned about once, and ATen's
    convolutions serve instead."""
    if _TURNED_OFF:
        return False
    return probes.runs(_probe, "the float64 implicit-GEMM convolution", "ATen's convolutions serve instead",
                       quiet=(KernelFailed,))  # a KernelFailed was warned about where it failed


def _probe() -> None:
    """One small convolution on the current GPU against torch's; raises if it fails or differs."""
    g = torch.Generator().manual_seed(0)
    layer = torch.nn.Conv2d(3, 16, 3, padding=1).double().requires_grad_(False)
    layer.weight.copy_(torch.randn(layer.weight.shape, generator=g, dtype=torch.float64))
    layer = layer.cuda()
    x = torch.randn((1, 3, 8, 8), generator=g, dtype=torch.float64).cuda()
    want = torch.nn.functional.conv2d(x, layer.weight, layer.bias, padding=1)
    if not torch.allclose(conv2d(x, layer), want, rtol=1e-12, atol=1e-12):
        raise RuntimeError("its result differs from torch's")


def conv2d(x, layer: torch.nn.Conv2d, relu: bool = False, head: torch.nn.Conv2d | None = None) -> torch.Tensor:
    """``layer(x)`` (then ReLU, then ``head``), for a stride-1, zero-padded, ungrouped, undilated Conv2d.  ``x``: a
    tensor, or two whose concatenation along the channels is the input (read where they lie, not concatenated
    first).  ``head``: a 1 x 1 Conv2d of at most HEAD_MAX outputs applied before the store (``fuses_head``)."""
    first, second = (x, None) if isinstance(x, torch.Tensor) else x
    kh, kw = layer.kernel_size
    ph, pw = layer.padding
    b, _, h, w = first.shape
    oh, ow = h + 2 * ph - kh + 1, w + 2 * pw - kw + 1
    out = _empty(first, (b, (head or layer).out_channels, oh, ow))
    taps = [(ky - ph, kx - pw) for ky in range(kh) for kx in range(kw)]
    weights = _prepared(layer.weight, "taps", lambda w: w.permute(2, 3, 1, 0).reshape(kh * kw, *w.shape[1::-1]))
    _launch((first, second), weights, taps, layer.bias, out, (oh, ow), (1, 1), (0, 0), relu, head=head)
    return out


def fuses_head(layer: torch.nn.Module, head: torch.nn.Module) -> bool:
    """Whether ``conv2d`` takes ``head`` after ``layer``: a 1 x 1 convolution of ``layer``'s outputs into at most
    HEAD_MAX channels, those outputs all in one program (HEAD_FUSION on)."""
    if not (HEAD_FUSION and isinstance(head, torch.nn.Conv2d) and tuple(head.kernel_size) == (1, 1)):
        return False
    plain = tuple(head.stride) == (1, 1) and tuple(head.padding) == (0, 0) and head.groups == 1 \
        and tuple(head.dilation) == (1, 1)
    block, second = n_blocks(layer.out_channels)
    return plain and head.in_channels == layer.out_channels <= block + second and head.out_channels <= HEAD_MAX


def conv_transpose2d(x: torch.Tensor, layer: torch.nn.ConvTranspose2d, relu: bool = False) -> torch.Tensor:
    """``layer(x)`` (then ReLU), for a zero-padded, ungrouped, undilated ConvTranspose2d: one launch per output
    phase (the output pixels of one position modulo the stride)."""
    (kh, kw), (sh, sw), (ph, pw) = layer.kernel_size, layer.stride, layer.padding
    b, _, h, w = x.shape
    oh = (h - 1) * sh - 2 * ph + kh + layer.output_padding[0]
    ow = (w - 1) * sw - 2 * pw + kw + layer.output_padding[1]
    out = _empty(x, (b, layer.out_channels, oh, ow))
    for py in range(min(sh, oh)):
        for px in range(min(sw, ow)):
            # output row oy = s i + py takes input row i + dy through kernel row ky where s dy = py + p - ky
            rows = [(ky, (py + ph - ky) // sh) for ky in range(kh) if (py + ph - ky) % sh == 0]
            cols = [(kx, (px + pw - kx) // sw) for kx in range(kw) if (px + pw - kx) % sw == 0]
            grid = (-(-(oh - py) // sh), -(-(ow - px) // sw))
            if not rows or not cols:  # no tap reaches this phase: the bias alone
                bias = layer.bias if layer.bias is not None else x.new_zeros(layer.out_channels)
                out[:, :, py::sh, px::sw] = bias.view(1, -1, 1, 1).clamp_min(0) if relu else bias.view(1, -1, 1, 1)
                continue
            taps = [(dy, dx) for _, dy in rows for _, dx in cols]
            weights = _prepared(layer.weight, ("phase", py, px), lambda w, rows=rows, cols=cols: torch.stack(
                [w[:, :, ky, kx] for ky, _ in rows for kx, _ in cols]))
            _launch((x, None), weights, taps, layer.bias, out, grid, (sh, sw), (py, px), relu)
    return out


def gdn(x: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor, inverse: bool) -> torch.Tensor:
    """A GDN layer on ``x`` (B, C, H, W): x * sqrt(norm) (``inverse``) or x / sqrt(norm), norm = beta + gamma x**2
    at every position; ``gamma`` (C, C) or (C, C, 1, 1), output channel first (``F.conv2d``'s weight)."""
    c = x.shape[1]
    out = _empty(x, x.shape)
    weights = _prepared(gamma, "gdn", lambda g: g.reshape(c, c).t().reshape(1, c, c))
    _launch((x, None), weights, [(0, 0)], beta, out, tuple(x.shape[2:]), (1, 1), (0, 0), False,
            NORM_INVERSE if inverse else NORM_FORWARD)
    return out


def layout_of(x: torch.Tensor) -> torch.memory_format:
    """``x``'s layout: channels last where its channels (more than one) lie innermost, else channels first."""
    last = x.dim() == 4 and x.shape[1] > 1 and x.stride(1) == 1
    return torch.channels_last if last else torch.contiguous_format


def _empty(like: torch.Tensor, shape) -> torch.Tensor:
    """A layer's output, laid out as its input ``like`` is."""
    return torch.empty(tuple(shape), dtype=like.dtype, device=like.device, memory_format=layout_of(like))


def n_blocks(c_out: int) -> tuple[int, int]:
    """A program's output channels as (block, second block or 0), each a power of two of at least 16: one block
    of up to BLOCK_N_MAX (more outputs take more programs), or two where they fit fewer channels than one."""
    whole = max(16, 1 << (c_out - 1).bit_length())
    if whole > BLOCK_N_MAX:
        return BLOCK_N_MAX, 0
    first = 1 << (c_out.bit_length() - 1)
    rest = c_out - first
    second = max(16, 1 << (rest - 1).bit_length()) if rest else 0
    if SPLIT_N and first >= 16 and rest and first + second < whole:
        return first, second
    return whole, 0


def _launch(parts, weights, taps, bias, out, grid, stride, phase, relu: bool, norm: int = NORM_NONE,
            head: torch.nn.Conv2d | None = None) -> None:
    """out[:, :, s i + p, s j + p'] = bias + sum_t weights[t]^T x[:, :, i + dy_t, j + dx_t] over the (i, j) of
    ``grid``; ``weights`` (taps, C_in, C_out); x the concatenation along the channels of ``parts`` (a tensor and
    a second one or None), each read through its strides.  ``norm``: GDN's (``gdn``: x squared in the sum, then
    the root).  ``head``: ``conv2d``'s."""
    x, x2 = parts
    c1 = x.shape[1]
    if x2 is None:
        x2 = x
    c_in, c_out = weights.shape[1], weights.shape[2]
    block_n, block_n2 = n_blocks(c_out)
    w = weights.to(x.dtype).contiguous()
    t = _taps_on(tuple(taps), x.device)
    h_out = head.out_channels if head is not None else 0
    hw = _prepared(head.weight, "head", lambda g: g.reshape(h_out, c_out).t()).to(x.dtype) if head is not None else w
    hb = w if head is None else head.bias if head.bias is not None else x.new_zeros(h_out)
    positions = x.shape[0] * grid[0] * grid[1]
    tile = TILE_W_LAST if layout_of(out) == torch.channels_last else TILE_W
    programs = -(-positions // BLOCK_M) if not tile else \
        x.shape[0] * -(-grid[0] // (BLOCK_M // tile)) * -(-grid[1] // tile)
    launch = (programs, -(-c_out // block_n) if not block_n2 else 1)
    # Triton launches on the current device's current stream: make it the tensors' (a CPU tensor: the interpreter)
    with torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext(), _off_on_failure():
        _kernel()[launch](x, x2, w, t, bias if bias is not None else w, out, positions, len(taps), c1, c_in, c_out,
                          x.shape[2], x.shape[3], grid[0], grid[1], *x.stride(), *x2.stride(), *out.stride(),
                          stride[0], stride[1], phase[0], phase[1], HAS_BIAS=bias is not None, RELU=relu, NORM=norm,
                          BLOCK_M=BLOCK_M, BLOCK_N=block_n, BLOCK_N2=max(block_n2, 16), SPLIT=block_n2 > 0,
                          BLOCK_K=BLOCK_K_WIDE if c_in >= WIDE_INPUT else BLOCK_K, TILE_W=tile, hw_ptr=hw,
                          hb_ptr=hb, h_out=h_out, HEAD_N=0 if head is None else max(16, 1 << (h_out - 1).bit_length()),
                          num_warps=WARPS, num_stages=STAGES)


@contextlib.contextmanager
def _off_on_failure():
    """Triton's compile and resource errors -> KernelFailed, the kernel turned off with one warning.  Each class of
    shape compiles a variant of its own: one can fail where the probe's compiled."""
    try:
        yield
    except _triton_failures() as e:
        why = f"{type(e).__name__}: {e}"
        if not _TURNED_OFF:
            warnings.warn(f"visemz: the float64 implicit-GEMM convolution failed on a layer, ATen's convolutions serve "
                          f"from now on: {why}", RuntimeWarning, stacklevel=4)
        _TURNED_OFF.append(why)
        available.cache_clear()
        raise KernelFailed(why) from e


@functools.lru_cache(maxsize=None)
def _triton_failures() -> tuple:
    """Triton's compile and resource errors (PTXASError where this Triton has it)."""
    from triton.compiler.errors import CompilationError
    from triton.runtime import errors
    return CompilationError, errors.OutOfResources, getattr(errors, "PTXASError", CompilationError)


_PREPARED = WeakTensorKeyDictionary()  # by identity: a tensor's == is elementwise


def _prepared(weight: torch.Tensor, key, make) -> torch.Tensor:
    """``make(weight)`` (a layer's weights as the kernel reads them), contiguous, made once per weight tensor and
    ``key`` and kept while the tensor lives and is unchanged (same storage, no in-place write since): a reshape and
    copy at every launch were about thirty small device copies, and their host time, per image.  An inference
    tensor (made under ``torch.inference_mode``) has no version counter to see in-place writes by: made each time."""
    if weight.is_inference():
        return make(weight).contiguous()
    stamp = (weight.data_ptr(), weight._version, weight.dtype, weight.device)
    entries = _PREPARED.setdefault(weight, {})
    hit = entries.get(key)
    if hit is None or hit[0] != stamp:
        with torch.no_grad():
            hit = entries[key] = (stamp, published(make(weight).contiguous()))
    return hit[1]


@functools.lru_cache(maxsize=64)
def _taps_on(taps: tuple, device: torch.device) -> torch.Tensor:
    """A layer's taps (dy, dx) as a flat int32 tensor on ``device``, made once: a host-to-device copy of a list
    waits for the device, which a launch per layer must not do."""
    return torch.tensor(taps, dtype=torch.int32, device=device).reshape(-1)


def _kernel():
    """The Triton kernel (``conv64_kernel.py``), imported on first use so that importing this module needs no Triton."""
    from . import conv64_kernel
    return conv64_kernel.taps_kernel if SPECIALIZE else conv64_kernel.taps_kernel_generic
