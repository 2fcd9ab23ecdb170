"""conv64's Triton kernel (``conv64.py`` says what it computes and why); imported only where Triton is."""

import triton
import triton.language as tl


@triton.jit
def finish(acc, n, m_ok, i, j, img, x_ptr, b_ptr, out_ptr, c_out, h, w, oh, ow, sy, sx, py, px,
           HAS_BIAS: tl.constexpr, RELU: tl.constexpr, NORM: tl.constexpr):
    """Bias, GDN's root and product, ReLU, store: outputs ``n`` of the positions of ``acc``'s rows."""
    n_ok = n < c_out
    if HAS_BIAS:
        acc += tl.load(b_ptr + n, mask=n_ok, other=0.0)[None, :]
    if NORM != 0:  # the input's channel n at the same position (a GDN keeps its channels and positions)
        v = tl.load(x_ptr + img[:, None] * c_out * h * w + n[None, :].to(tl.int64) * h * w + (i * w + j)[:, None],
                    mask=m_ok[:, None] & n_ok[None, :], other=0.0)
        root = tl.sqrt(acc)  # float64: IEEE-rounded (sqrt.rn.f64, PTX has no approximate one)
        acc = v * root if NORM == 1 else v / root
    if RELU:
        acc = tl.maximum(acc, 0.0)
    pix = (i * sy + py) * ow + j * sx + px
    dst = img[:, None] * c_out * oh * ow + n[None, :].to(tl.int64) * oh * ow + pix[:, None]
    tl.store(out_ptr + dst, acc, mask=m_ok[:, None] & n_ok[None, :])

def taps_kernel(x_ptr, w_ptr, taps_ptr, b_ptr, out_ptr, positions, n_taps, c_in, c_out, h, w, gh, gw, oh, ow,
                sy, sx, py, px, HAS_BIAS: tl.constexpr, RELU: tl.constexpr, NORM: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_N2: tl.constexpr, SPLIT: tl.constexpr,
                BLOCK_K: tl.constexpr):
    m = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n2 = BLOCK_N + tl.arange(0, BLOCK_N2)  # the second block (SPLIT: one program spans every output)
    m_ok = m < positions
    j = m % gw
    i = (m // gw) % gh
    img = m // (gw * gh)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float64)
    acc2 = tl.zeros((BLOCK_M, BLOCK_N2), dtype=tl.float64)
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
            if NORM != 0:
                a = a * a
            row = (t * c_in + k[:, None]) * c_out
            b = tl.load(w_ptr + row + n[None, :], mask=k_ok[:, None] & (n < c_out)[None, :], other=0.0)
            acc += tl.dot(a, b)
            if SPLIT:
                b2 = tl.load(w_ptr + row + n2[None, :], mask=k_ok[:, None] & (n2 < c_out)[None, :], other=0.0)
                acc2 += tl.dot(a, b2)
    finish(acc, n, m_ok, i, j, img, x_ptr, b_ptr, out_ptr, c_out, h, w, oh, ow, sy, sx, py, px, HAS_BIAS, RELU,
           NORM)
    if SPLIT:
        finish(acc2, n2, m_ok, i, j, img, x_ptr, b_ptr, out_ptr, c_out, h, w, oh, ow, sy, sx, py, px, HAS_BIAS,
               RELU, NORM)


GENERIC = ["positions", "n_taps", "c_in", "c_out", "h", "w", "gh", "gw", "oh", "ow", "sy", "sx", "py", "px"]
taps_kernel_generic = triton.jit(do_not_specialize=GENERIC)(taps_kernel)  # one compile serves every shape
taps_kernel = triton.jit(taps_kernel)  # compiled per shape class (sizes of 1 or multiples of 16 known)
