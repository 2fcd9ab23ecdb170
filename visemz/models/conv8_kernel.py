"""conv8's Triton kernel (``conv8.py`` says what it computes and why); imported only where Triton is.

Activations are (images, h, w, C) int8, C = 64 channels (zeros beyond a layer's own); a program computes a tile of
BLOCK_M // TILE_W rows by TILE_W positions for all C outputs: for each tap, a (positions x C) by (C x C) product on
the 8-bit tensor cores into 32-bit sums, then the bias and the requantisation in 64 bits, and either the int8 store
or (HEAD) a fused 1 x 1 layer of at most HN outputs whose 32-bit sums are stored channels first."""

import triton
import triton.language as tl


@triton.jit
def conv8_kernel(x_ptr, w_ptr, b_ptr, m_ptr, out_ptr, hw_ptr, hb_ptr, h, w, c_store, n_head, half, shift,
                 KSIZE: tl.constexpr, HEAD: tl.constexpr, C: tl.constexpr, HN: tl.constexpr,
                 BLOCK_M: tl.constexpr, TILE_W: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    rows: tl.constexpr = BLOCK_M // TILE_W
    tiles_w = (w + TILE_W - 1) // TILE_W
    tiles_h = (h + rows - 1) // rows
    r = tl.arange(0, BLOCK_M)
    j = (pid % tiles_w) * TILE_W + r % TILE_W
    i = ((pid // tiles_w) % tiles_h) * rows + r // TILE_W
    img = pid // (tiles_w * tiles_h)
    m_ok = (i < h) & (j < w)
    c = tl.arange(0, C)
    acc = tl.zeros((BLOCK_M, C), dtype=tl.int32)
    for t in tl.static_range(KSIZE * KSIZE):
        y = i + (t // KSIZE - KSIZE // 2)
        x = j + (t % KSIZE - KSIZE // 2)
        inside = m_ok & (y >= 0) & (y < h) & (x >= 0) & (x < w)
        a = tl.load(x_ptr + (((img * h + y) * w + x) * C)[:, None] + c[None, :], mask=inside[:, None], other=0)
        wt = tl.load(w_ptr + t * C * C + c[:, None] * C + c[None, :])
        acc += tl.dot(a, wt, out_dtype=tl.int32)
    acc += tl.load(b_ptr + c)[None, :]
    y8 = (acc.to(tl.int64) * tl.load(m_ptr + c)[None, :] + half) >> shift
    y8 = tl.minimum(tl.maximum(y8, 0), 127).to(tl.int8)
    if HEAD:
        hn = tl.arange(0, HN)
        o = tl.dot(y8, tl.load(hw_ptr + c[:, None] * HN + hn[None, :]), out_dtype=tl.int32)
        o += tl.load(hb_ptr + hn)[None, :]
        dst = ((img * n_head + hn[None, :]) * h + i[:, None]) * w + j[:, None]
        tl.store(out_ptr + dst, o, mask=m_ok[:, None] & (hn < n_head)[None, :])
    else:
        dst = (((img * h + i) * w + j) * C)[:, None] + c[None, :]
        tl.store(out_ptr + dst, y8, mask=m_ok[:, None] & (c < c_store)[None, :])
