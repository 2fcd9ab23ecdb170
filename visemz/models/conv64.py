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

Any summation order of a float64 sum of K terms is within 2 (K - 1) 2**-53 sum |terms| of any other, the
bound both float64 coders already allow for; tests/test_conv64.py compares with torch's convolutions.
"""

from __future__ import annotations

import contextlib
import functools
import warnings

import torch

BLOCK_M, BLOCK_K = 128, 16  # output positions per program; input channels per tensor-core step
BLOCK_N_MAX = 64  # output channels per program (at least 16, the tensor cores' smallest)
WARPS, STAGES = 4, 2


@functools.lru_cache(maxsize=None)
def available() -> bool:
    """Whether the kernel runs in this process: Triton is installed (it comes with torch's CUDA builds) and a
    first small convolution on the current GPU gave torch's result.  A failure there (Triton finds no C compiler
    for its launcher, a driver too old for it...) is warned about once, and ATen's convolutions serve instead."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    try:
        _probe()
    except Exception as e:  # noqa: BLE001 (whatever stops the kernel, ATen's path gives the same values)
        warnings.warn(f"visemz: the float64 implicit-GEMM convolution cannot run here, ATen's convolutions serve "
                      f"instead: {type(e).__name__}: {e}", RuntimeWarning, stacklevel=2)
        return False
    return True


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


def conv2d(x: torch.Tensor, layer: torch.nn.Conv2d, relu: bool = False) -> torch.Tensor:
    """``layer(x)`` (then ReLU), for a stride-1, zero-padded, ungrouped, undilated Conv2d."""
    kh, kw = layer.kernel_size
    ph, pw = layer.padding
    b, _, h, w = x.shape
    oh, ow = h + 2 * ph - kh + 1, w + 2 * pw - kw + 1
    out = x.new_empty(b, layer.out_channels, oh, ow)
    taps = [(ky - ph, kx - pw) for ky in range(kh) for kx in range(kw)]
    weights = layer.weight.permute(2, 3, 1, 0).reshape(kh * kw, layer.in_channels, layer.out_channels)
    _launch(x, weights, taps, layer.bias, out, (oh, ow), (1, 1), (0, 0), relu)
    return out


def conv_transpose2d(x: torch.Tensor, layer: torch.nn.ConvTranspose2d, relu: bool = False) -> torch.Tensor:
    """``layer(x)`` (then ReLU), for a zero-padded, ungrouped, undilated ConvTranspose2d: one launch per output
    phase (the output pixels of one position modulo the stride)."""
    (kh, kw), (sh, sw), (ph, pw) = layer.kernel_size, layer.stride, layer.padding
    b, _, h, w = x.shape
    oh = (h - 1) * sh - 2 * ph + kh + layer.output_padding[0]
    ow = (w - 1) * sw - 2 * pw + kw + layer.output_padding[1]
    out = x.new_empty(b, layer.out_channels, oh, ow)
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
            weights = torch.stack([layer.weight[:, :, ky, kx] for ky, _ in rows for kx, _ in cols])
            _launch(x, weights, taps, layer.bias, out, grid, (sh, sw), (py, px), relu)
    return out


def _launch(x, weights, taps, bias, out, grid, stride, phase, relu: bool) -> None:
    """out[:, :, s i + p, s j + p'] = bias + sum_t weights[t]^T x[:, :, i + dy_t, j + dx_t] over the (i, j) of
    ``grid``; ``weights`` (taps, C_in, C_out)."""
    x = x.contiguous()
    c_in, c_out = weights.shape[1], weights.shape[2]
    block_n = min(BLOCK_N_MAX, max(16, 1 << (c_out - 1).bit_length()))
    w = weights.to(x.dtype).contiguous()
    t = _taps_on(tuple(taps), x.device)
    positions = x.shape[0] * grid[0] * grid[1]
    launch = (-(-positions // BLOCK_M), -(-c_out // block_n))
    # Triton launches on the current device's current stream: make it the tensors' (a CPU tensor: the interpreter)
    with torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext():
        _kernel()[launch](x, w, t, bias if bias is not None else w, out, positions, len(taps), c_in, c_out,
                          x.shape[2], x.shape[3], grid[0], grid[1], out.shape[2], out.shape[3], stride[0], stride[1],
                          phase[0], phase[1], HAS_BIAS=bias is not None, RELU=relu, BLOCK_M=BLOCK_M, BLOCK_N=block_n,
                          BLOCK_K=BLOCK_K, num_warps=WARPS, num_stages=STAGES)


@functools.lru_cache(maxsize=64)
def _taps_on(taps: tuple, device: torch.device) -> torch.Tensor:
    """A layer's taps (dy, dx) as a flat int32 tensor on ``device``, made once: a host-to-device copy of a list
    waits for the device, which a launch per layer must not do."""
    return torch.tensor(taps, dtype=torch.int32, device=device).reshape(-1)


@functools.lru_cache(maxsize=None)
def _kernel():
    """The Triton kernel, defined on first use so that importing this module needs no Triton."""
    import triton
    import triton.language as tl

    @triton.jit(do_not_specialize=["positions", "n_taps", "c_in", "c_out", "h", "w", "gh", "gw", "oh", "ow", "sy",
                                   "sx", "py", "px"])  # one compile serves every shape
    def taps_kernel(x_ptr, w_ptr, taps_ptr, b_ptr, out_ptr, positions, n_taps, c_in, c_out, h, w, gh, gw, oh, ow,
                    sy, sx, py, px, HAS_BIAS: tl.constexpr, RELU: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        m = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
        n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        m_ok, n_ok = m < positions, n < c_out
        j = m % gw
        i = (m // gw) % gh
        img = m // (gw * gh)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float64)
        for t in range(n_taps):
            y = i + tl.load(taps_ptr + 2 * t)
            xx = j + tl.load(taps_ptr + 2 * t + 1)
            inside = m_ok & (y >= 0) & (y < h) & (xx >= 0) & (xx < w)
            base = img * c_in * h * w + y * w + xx
            for c0 in range(0, c_in, BLOCK_K):
                k = c0 + tl.arange(0, BLOCK_K)
                k_ok = k < c_in
                a = tl.load(x_ptr + base[:, None] + k[None, :].to(tl.int64) * h * w,
                            mask=inside[:, None] & k_ok[None, :], other=0.0)
                b = tl.load(w_ptr + (t * c_in + k[:, None]) * c_out + n[None, :],
                            mask=k_ok[:, None] & n_ok[None, :], other=0.0)
                acc += tl.dot(a, b)
        if HAS_BIAS:
            acc += tl.load(b_ptr + n, mask=n_ok, other=0.0)[None, :]
        if RELU:
            acc = tl.maximum(acc, 0.0)
        pix = (i * sy + py) * ow + j * sx + px
        dst = img[:, None] * c_out * oh * ow + n[None, :].to(tl.int64) * oh * ow + pix[:, None]
        tl.store(out_ptr + dst, acc, mask=m_ok[:, None] & n_ok[None, :])

    return taps_kernel
