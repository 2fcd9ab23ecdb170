"""conv64's Triton kernel (``conv64.py`` says what it computes and why); imported only where Triton is.

Tensors are addressed through their strides (image, channel, row, column), so that one kernel reads and writes
channels-first and channels-last tensors alike; the input may come in two parts, channels 0..c1-1 from the
first and c1..c_in-1 from the second, read where they lie instead of concatenated first."""

import triton
import triton.language as tl


@triton.jit
def step(acc, acc2, a, w_ptr, row, k_ok, c_out, n, n2, NORM: tl.constexpr, SPLIT: tl.constexpr):
    """One tensor-core step: ``a`` (positions x BLOCK_K inputs) times the weights of rows ``row`` (tap t's input
    channels k: t * c_in + k), into both output blocks."""
    if NORM != 0:
        a = a * a
    b = tl.load(w_ptr + row[:, None] * c_out + n[None, :], mask=k_ok[:, None] & (n < c_out)[None, :], other=0.0)
    acc += tl.dot(a, b)
    if SPLIT:
        b2 = tl.load(w_ptr + row[:, None] * c_out + n2[None, :], mask=k_ok[:, None] & (n2 < c_out)[None, :],
                     other=0.0)
        acc2 += tl.dot(a, b2)
    return acc, acc2


@triton.jit
def activate(acc, n, m_ok, i, j, img, x_ptr, xs_n, xs_c, xs_h, xs_w, b_ptr, c_out, HAS_BIAS: tl.constexpr,
             RELU: tl.constexpr, NORM: tl.constexpr):
    """Bias, GDN's root and product, ReLU: outputs ``n`` of the positions of ``acc``'s rows."""
    n_ok = n < c_out
    if HAS_BIAS:
        acc += tl.load(b_ptr + n, mask=n_ok, other=0.0)[None, :]
    if NORM != 0:  # the input's channel n at the same position (a GDN keeps its channels and positions)
        v = tl.load(x_ptr + (img * xs_n + i * xs_h + j * xs_w)[:, None] + n[None, :].to(tl.int64) * xs_c,
                    mask=m_ok[:, None] & n_ok[None, :], other=0.0)
        root = tl.sqrt(acc)  # float64: IEEE-rounded (sqrt.rn.f64, PTX has no approximate one)
        acc = v * root if NORM == 1 else v / root
    if RELU:
        acc = tl.maximum(acc, 0.0)
    return acc


@triton.jit
def store(acc, n, m_ok, i, j, img, out_ptr, channels, os_n, os_c, os_h, os_w, sy, sx, py, px):
    dst = (img * os_n + (i * sy + py) * os_h + (j * sx + px) * os_w)[:, None] + n[None, :].to(tl.int64) * os_c
    tl.store(out_ptr + dst, acc, mask=m_ok[:, None] & (n < channels)[None, :])


def taps_kernel(x_ptr, x2_ptr, w_ptr, taps_ptr, b_ptr, out_ptr, positions, n_taps, c1, c_in, c_out, h, w, gh, gw,
                xs_n, xs_c, xs_h, xs_w, x2s_n, x2s_c, x2s_h, x2s_w, os_n, os_c, os_h, os_w, sy, sx, py, px,
                HAS_BIAS: tl.constexpr, RELU: tl.constexpr, NORM: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_N2: tl.constexpr, SPLIT: tl.constexpr, BLOCK_K: tl.constexpr,
                TILE_W: tl.constexpr, hw_ptr, hb_ptr, h_out, HEAD_N: tl.constexpr):
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n2 = BLOCK_N + tl.arange(0, BLOCK_N2)  # the second block (SPLIT: one program spans every output)
    if TILE_W == 0:  # BLOCK_M consecutive positions of the grid, row after row
        m = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
        m_ok = m < positions
        j = m % gw
        i = (m // gw) % gh
        img = m // (gw * gh)
    else:  # a tile of BLOCK_M // TILE_W rows of TILE_W positions: the taps' shifted reads meet in the cache
        pid = tl.program_id(0).to(tl.int64)
        tiles_w = (gw + TILE_W - 1) // TILE_W
        tiles_h = (gh + BLOCK_M // TILE_W - 1) // (BLOCK_M // TILE_W)
        r = tl.arange(0, BLOCK_M)
        j = (pid % tiles_w) * TILE_W + r % TILE_W
        i = ((pid // tiles_w) % tiles_h) * (BLOCK_M // TILE_W) + r // TILE_W
        img = pid // (tiles_w * tiles_h)
        m_ok = (i < gh) & (j < gw)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float64)
    acc2 = tl.zeros((BLOCK_M, BLOCK_N2), dtype=tl.float64)
    for t in range(n_taps):
        y = i + tl.load(taps_ptr + 2 * t)
        xx = j + tl.load(taps_ptr + 2 * t + 1)
        inside = m_ok & (y >= 0) & (y < h) & (xx >= 0) & (xx < w)
        base = img * xs_n + y * xs_h + xx * xs_w
        for c0 in range(0, c1, BLOCK_K):  # the first part's channels
            k = c0 + tl.arange(0, BLOCK_K)
            k_ok = k < c1
            a = tl.load(x_ptr + base[:, None] + k[None, :].to(tl.int64) * xs_c, mask=inside[:, None] & k_ok[None, :],
                        other=0.0)
            acc, acc2 = step(acc, acc2, a, w_ptr, t * c_in + k, k_ok, c_out, n, n2, NORM, SPLIT)
        base2 = img * x2s_n + y * x2s_h + xx * x2s_w
        for c0 in range(c1, c_in, BLOCK_K):  # the second part's (none for one input)
            k = c0 + tl.arange(0, BLOCK_K)
            k_ok = k < c_in
            a = tl.load(x2_ptr + base2[:, None] + (k - c1)[None, :].to(tl.int64) * x2s_c,
                        mask=inside[:, None] & k_ok[None, :], other=0.0)
            acc, acc2 = step(acc, acc2, a, w_ptr, t * c_in + k, k_ok, c_out, n, n2, NORM, SPLIT)
    acc = activate(acc, n, m_ok, i, j, img, x_ptr, xs_n, xs_c, xs_h, xs_w, b_ptr, c_out, HAS_BIAS, RELU, NORM)
    if SPLIT:
        acc2 = activate(acc2, n2, m_ok, i, j, img, x_ptr, xs_n, xs_c, xs_h, xs_w, b_ptr, c_out, HAS_BIAS, RELU, NORM)
    if HEAD_N == 0:
        store(acc, n, m_ok, i, j, img, out_ptr, c_out, os_n, os_c, os_h, os_w, sy, sx, py, px)
        if SPLIT:
            store(acc2, n2, m_ok, i, j, img, out_ptr, c_out, os_n, os_c, os_h, os_w, sy, sx, py, px)
    else:  # a 1 x 1 convolution of these outputs (hw: c_out x h_out) is the layer's output
        hn = tl.arange(0, HEAD_N)
        h_ok = hn < h_out
        wa = tl.load(hw_ptr + n[:, None] * h_out + hn[None, :], mask=(n < c_out)[:, None] & h_ok[None, :], other=0.0)
        head = tl.dot(acc, wa)
        if SPLIT:
            wb = tl.load(hw_ptr + n2[:, None] * h_out + hn[None, :], mask=(n2 < c_out)[:, None] & h_ok[None, :],
                         other=0.0)
            head += tl.dot(acc2, wb)
        head += tl.load(hb_ptr + hn, mask=h_ok, other=0.0)[None, :]
        store(head, hn, m_ok, i, j, img, out_ptr, h_out, os_n, os_c, os_h, os_w, sy, sx, py, px)

GENERIC = ["positions", "n_taps", "c1", "c_in", "c_out", "h", "w", "gh", "gw", "xs_n", "xs_c", "xs_h", "xs_w",
           "x2s_n", "x2s_c", "x2s_h", "x2s_w", "os_n", "os_c", "os_h", "os_w", "sy", "sx", "py", "px", "h_out"]
taps_kernel_generic = triton.jit(do_not_specialize=GENERIC)(taps_kernel)  # one compile serves every shape
taps_kernel = triton.jit(taps_kernel)  # compiled per shape class (sizes and strides of 1 or multiples of 16 known)
