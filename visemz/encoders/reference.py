"""NumPy reference of the block encoder: vectorised, and the definition of the bytes.

The CUDA kernels in ``cuda/block.cu`` (with ``cuda/block.cuh``) must produce exactly these bytes; the tests
compare the two on every input they generate.  Work is vectorised over whole
arrays; Python loops run only over tiles or widths, never over values.
"""

from __future__ import annotations

import numpy as np

from ..errors import CorruptStreamError
from . import layout as L

_U8 = np.uint8


# ---------------------------------------------------------------- value maps
def zigzag(v: np.ndarray) -> np.ndarray:
    """Sign-shift: magnitude in the high bits, sign in bit 0; a bijection on int32."""
    v = v.astype(np.int32, copy=False)
    return ((v << 1) ^ (v >> 31)).view(np.uint32)


def unzigzag(u: np.ndarray) -> np.ndarray:
    u = u.astype(np.uint32, copy=False)
    return ((u >> 1) ^ (np.uint32(0) - (u & 1))).view(np.int32)


_SMALL_CATEGORY = np.searchsorted(L.CATEGORY_BOUNDS, np.arange(256), side="right").astype(_U8)


def categories(u: np.ndarray) -> np.ndarray:
    """Magnitude category of each uint32 (see layout.N_CATEGORIES).

    A 256-entry table serves the small values that dominate latents; only values of
    9 or more bits go through a search.
    """
    cat = _SMALL_CATEGORY[np.minimum(u, 255).astype(_U8)]
    big = np.flatnonzero(u > 255)
    cat[big] = np.searchsorted(L.CATEGORY_BOUNDS, u[big], side="right")
    return cat


def bit_length(x: np.ndarray) -> np.ndarray:
    """Bit length of uint32 values (0 for 0); exact through float64's exponent."""
    return np.frexp(x.astype(np.float64))[1].astype(_U8)


# ----------------------------------------------------------- bit (un)packing
def pack_bits(x: np.ndarray, width: int, shuffle: bool) -> np.ndarray:
    """Rows of values -> rows of ``cols * width / 8`` bytes.

    shuffle=False: value i occupies bits [i*width, (i+1)*width), LSB first.
    shuffle=True: bit-plane p (p < width) holds bit p of every value, plane after plane.
    """
    rows, cols = x.shape
    if width <= 8:
        x = x.astype(_U8)  # narrower lanes: every pass below moves 4x fewer bytes
    if shuffle:
        planes = [np.packbits((x >> p) & 1, axis=1, bitorder="little") for p in range(width)]
        return np.stack(planes, axis=1).reshape(rows, width * cols // 8)
    if 8 % width == 0:
        per = 8 // width
        parts = x.reshape(rows, cols // per, per)
        out = parts[:, :, 0].copy()
        for k in range(1, per):
            out |= parts[:, :, k] << (k * width)
        return out
    bits = ((x[:, :, None] >> np.arange(width, dtype=x.dtype)) & 1).astype(_U8)  # (rows, cols, width)
    return np.packbits(bits.reshape(rows, cols * width), axis=1, bitorder="little")


def unpack_bits(b: np.ndarray, cols: int, width: int, shuffle: bool) -> np.ndarray:
    """Inverse of :func:`pack_bits`: rows of bytes -> rows of ``cols`` uint32 values."""
    rows = b.shape[0]
    if shuffle:
        planes = b.reshape(rows, width, cols // 8)
        out = np.zeros((rows, cols), dtype=np.uint8 if width <= 8 else np.uint32)
        for p in range(width):
            out |= np.unpackbits(planes[:, p], axis=1, bitorder="little").astype(out.dtype) << p
        return out.astype(np.uint32)
    if 8 % width == 0:
        per = 8 // width
        mask = np.uint8((1 << width) - 1)
        out = np.empty((rows, cols // per, per), dtype=np.uint8)
        for k in range(per):
            out[:, :, k] = (b >> (k * width)) & mask
        return out.reshape(rows, cols).astype(np.uint32)
    bits = np.unpackbits(b, axis=1, bitorder="little").reshape(rows, cols, width).astype(np.uint32)
    return (bits << np.arange(width, dtype=np.uint32)).sum(axis=2, dtype=np.uint64).astype(np.uint32)


def _padded(u: np.ndarray, block: int) -> np.ndarray:
    nb = -(-u.size // block)
    out = np.zeros(nb * block, dtype=np.uint32)
    out[: u.size] = u
    return out.reshape(nb, block)


def _tile_of(block_ids: np.ndarray, blocks_per_tile: int, ntiles: int, weights=None) -> np.ndarray:
    return np.bincount(block_ids // blocks_per_tile, weights=weights, minlength=ntiles).astype(np.int64)


def _assemble(ntiles: int, parts: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Concatenate, tile by tile, several per-tile-grouped byte arrays.

    ``parts``: (bytes in tile order, bytes per tile).  Returns (payload, tile ends).
    """
    sizes = sum(per for _, per in parts) if parts else np.zeros(ntiles, np.int64)
    ends = np.cumsum(sizes)
    payload = np.empty(int(ends[-1]) if ntiles else 0, dtype=_U8)
    starts = ends - sizes
    pos = starts.copy()
    for data, per in parts:
        src = np.concatenate([[0], np.cumsum(per)])
        for t in np.flatnonzero(per):
            payload[pos[t] : pos[t] + per[t]] = data[src[t] : src[t + 1]]
        pos += per
    return payload, ends


def _stream(hdr: L.Header, ends: np.ndarray, meta: np.ndarray, payload: np.ndarray) -> bytes:
    return b"".join((hdr.pack(), ends.astype("<u4").tobytes(), meta.tobytes(), payload.tobytes()))


# ------------------------------------------------------------ global policy
_POPCOUNT8 = np.array([bin(i).count("1") for i in range(256)], dtype=np.int64)


def _segments(blk: np.ndarray) -> np.ndarray:
    """Start indices of runs of equal block ids in a sorted array."""
    return np.flatnonzero(np.r_[True, blk[1:] != blk[:-1]]) if blk.size else np.zeros(0, np.int64)


def _global_stats(u2: np.ndarray):
    """Histograms the width choice needs, computed over non-zero values only."""
    nb = u2.shape[0]
    flat = u2.reshape(-1)
    nzi = np.flatnonzero(flat)
    u = flat[nzi]
    cat = categories(u)
    value_counts = np.bincount(cat, minlength=L.N_CATEGORIES)
    bmin = np.zeros(nb, dtype=_U8)
    bmax = np.zeros(nb, dtype=_U8)
    planes = np.zeros(len(L.GLOBAL_WIDTHS), np.int64)
    blk = nzi // L.GLOBAL_BLOCK
    starts = _segments(blk)
    if nzi.size:
        bmin[blk[starts]] = np.minimum.reduceat(cat, starts)
        bmax[blk[starts]] = np.maximum.reduceat(cat, starts)
        u8 = np.where(cat <= 8, u, 0).astype(_U8)
        for t in L.GLOBAL_WIDTHS:  # non-zero bit-planes of each block when values of <= t bits are kept
            kept = np.where(u8 < (1 << t), u8, _U8(0))
            planes[t - 1] = _POPCOUNT8[np.bitwise_or.reduceat(kept, starts)].sum()
    return nzi, cat, value_counts, bmin, bmax, planes, blk, starts


def _chunk_masks(u_kept: np.ndarray, blk: np.ndarray, starts: np.ndarray, nb: int, bitshuffle: bool) -> np.ndarray:
    """Per block: which chunks are non-zero (bit p = plane p with bitshuffle, bit 0 = the chunk without)."""
    masks = np.zeros(nb, dtype=np.uint16)
    if starts.size:
        ors = np.bitwise_or.reduceat(u_kept, starts)
        masks[blk[starts]] = ors if bitshuffle else (ors != 0)
    return masks


def _pack_meta(masks: np.ndarray, has_out: np.ndarray, nflag: int) -> np.ndarray:
    """(nflag chunk flags, outlier flag) per block, bit-packed LSB first."""
    bits = ((masks[:, None] >> np.arange(nflag, dtype=np.uint16)) & 1).astype(_U8)
    bits = np.concatenate([bits, has_out[:, None].astype(_U8)], axis=1)
    return np.packbits(bits.reshape(-1), bitorder="little")


def encode_global(v: np.ndarray, bitshuffle: bool) -> bytes:
    n = v.size
    ntiles = L.n_tiles(n)
    u2 = _padded(zigzag(v), L.GLOBAL_BLOCK)
    nb = u2.shape[0]
    nzi, cat, value_counts, bmin, bmax, planes, blk, starts = _global_stats(u2)
    hist = lambda b: np.bincount(b, minlength=L.N_CATEGORIES)
    t = L.choose_width(value_counts, hist(bmin), hist(bmax), planes, nb, bitshuffle) if n else 0
    nflag = L.chunk_flags(t, bitshuffle)
    bpt = L.TILE_VALUES // L.GLOBAL_BLOCK

    kept = cat <= t  # category <= t  <=>  the value fits in t bits
    masks = _chunk_masks(np.where(kept, u2.reshape(-1)[nzi], 0).astype(np.uint16), blk, starts, nb, bitshuffle)
    chunk_blocks = np.flatnonzero(masks)
    present = ((masks[chunk_blocks, None] >> np.arange(nflag, dtype=np.uint16)) & 1).astype(bool)  # (m, nflag)
    ub = u2[chunk_blocks]
    chunk_size = 8 * t // nflag if t else 0
    if chunk_blocks.size:
        packed = pack_bits(np.where(ub < (1 << t), ub, 0), t, bitshuffle)
        chunks = packed.reshape(chunk_blocks.size, nflag, chunk_size)[present].reshape(-1)
    else:
        chunks = np.zeros(0, _U8)

    sel = ~kept
    oidx, ocat = nzi[sel], cat[sel]
    oblk = oidx // L.GLOBAL_BLOCK
    ho_blocks = np.flatnonzero(bmax > t)
    nbytes = L.OUTLIER_BYTES[ocat]
    counts = (np.bincount(oblk, minlength=nb)[ho_blocks] - 1).astype(_U8)
    index = ((nbytes - 1) << 6 | (oidx % L.GLOBAL_BLOCK)).astype(_U8)
    vbytes = u2.reshape(-1)[oidx].astype("<u4").view(_U8).reshape(-1, 4)
    values = vbytes[np.arange(4) < nbytes[:, None]]

    payload, ends = _assemble(
        ntiles,
        [
            (chunks, chunk_size * _tile_of(chunk_blocks, bpt, ntiles, weights=present.sum(1))),
            (counts, _tile_of(ho_blocks, bpt, ntiles)),
            (index, _tile_of(oblk, bpt, ntiles)),
            (values, _tile_of(oblk, bpt, ntiles, weights=nbytes)),
        ],
    )
    has_out = np.zeros(nb, bool)
    has_out[ho_blocks] = True
    meta = _pack_meta(masks, has_out, nflag) if n else np.zeros(0, _U8)
    hdr = L.Header(L.POLICIES["global"], bitshuffle, t, n, ntiles, int(payload.size))
    return _stream(hdr, ends, meta, payload)


def _gather(payload: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenation of payload[starts[i] : starts[i] + lengths[i]] (bounds already checked)."""
    parts = [payload[s : s + n] for s, n in zip(starts.tolist(), lengths.tolist()) if n]
    return np.concatenate(parts) if parts else np.zeros(0, _U8)


def _tile_sums(x: np.ndarray, tile: np.ndarray, ntiles: int) -> np.ndarray:
    return np.bincount(tile, weights=x, minlength=ntiles).astype(np.int64)


def decode_global(buf: memoryview, hdr: L.Header) -> np.ndarray:
    n, t, ntiles = hdr.n, hdr.width, hdr.ntiles
    ends = L.tile_ends(buf, hdr)
    if n == 0:
        return np.zeros(0, np.int32)
    nb = L.n_blocks(hdr.policy, n)
    nflag = L.chunk_flags(t, hdr.bitshuffle)
    meta = np.frombuffer(buf, _U8, L.meta_size(hdr.policy, n, t, hdr.bitshuffle), L.meta_offset(n))
    payload = np.frombuffer(buf, _U8, hdr.payload, L.payload_offset(hdr.policy, n, t, hdr.bitshuffle))
    bits = np.unpackbits(meta, bitorder="little")
    if np.any(bits[nb * (nflag + 1) :]):
        raise CorruptStreamError("block stream sets flags for blocks past its end")
    bits = bits[: nb * (nflag + 1)].reshape(nb, nflag + 1).astype(bool)
    present_all, has_out = bits[:, :nflag], bits[:, nflag]
    bpt = L.TILE_VALUES // L.GLOBAL_BLOCK
    starts = ends - np.diff(np.r_[0, ends])
    chunk_blocks = np.flatnonzero(present_all.any(1))
    present = present_all[chunk_blocks]
    ho_blocks = np.flatnonzero(has_out)
    chunk_size = 8 * t // nflag
    cb = chunk_size * _tile_of(chunk_blocks, bpt, ntiles, weights=present.sum(1))
    hb = _tile_of(ho_blocks, bpt, ntiles)
    sizes = ends - starts
    if np.any(cb + hb > sizes):
        raise CorruptStreamError("block stream tile is smaller than its flagged chunks")
    counts = _gather(payload, starts + cb, hb).astype(np.int64) + 1
    ho_tile = ho_blocks // bpt
    kt = _tile_sums(counts, ho_tile, ntiles)
    if np.any(cb + hb + kt > sizes):
        raise CorruptStreamError("block stream tile is smaller than its outlier index")
    index = _gather(payload, starts + cb + hb, kt)
    nbytes = (index >> 6).astype(np.int64) + 1
    pos = (index & 63).astype(np.int64)
    oblk = np.repeat(ho_blocks, counts)
    vt = _tile_sums(nbytes, oblk // bpt, ntiles)
    if np.any(cb + hb + kt + vt != sizes):
        raise CorruptStreamError("block stream tile sizes disagree with its tile table")
    first = np.r_[True, oblk[1:] != oblk[:-1]]
    if np.any(~first & (np.diff(pos, prepend=-1) <= 0)):
        raise CorruptStreamError("block stream outlier positions are not increasing within a block")

    u2 = np.zeros((nb, L.GLOBAL_BLOCK), dtype=np.uint32)
    if chunk_blocks.size:
        full = np.zeros((chunk_blocks.size, nflag, chunk_size), _U8)
        full[present] = _gather(payload, starts, cb).reshape(-1, chunk_size)
        u2[chunk_blocks] = unpack_bits(full.reshape(chunk_blocks.size, 8 * t), L.GLOBAL_BLOCK, t, hdr.bitshuffle)
    if index.size:
        vals = _gather(payload, starts + cb + hb + kt, vt)
        off = np.cumsum(nbytes) - nbytes
        u = np.zeros(index.size, dtype=np.uint32)
        for j in range(4):
            has = j < nbytes
            u[has] |= vals[off[has] + j].astype(np.uint32) << np.uint32(8 * j)
        u2.reshape(-1)[oblk * L.GLOBAL_BLOCK + pos] = u
    return unzigzag(u2.reshape(-1)[:n])


# --------------------------------------------------------- per-block policy
def encode_block(v: np.ndarray, bitshuffle: bool) -> bytes:
    n = v.size
    ntiles = L.n_tiles(n)
    u2 = _padded(zigzag(v), L.PERBLOCK_BLOCK)
    widths = bit_length(np.bitwise_or.reduce(u2, axis=1)) if u2.size else np.zeros(0, _U8)
    sizes = 4 * widths.astype(np.int64)
    off = np.cumsum(sizes) - sizes
    payload = np.empty(int(sizes.sum()), dtype=_U8)
    for w in np.unique(widths[widths > 0]).tolist():
        sel = np.flatnonzero(widths == w)
        payload[off[sel][:, None] + np.arange(4 * w)] = pack_bits(u2[sel], w, bitshuffle)
    bpt = L.TILE_VALUES // L.PERBLOCK_BLOCK
    ends = np.cumsum(_tile_of(np.arange(widths.size), bpt, ntiles, weights=sizes))
    hdr = L.Header(L.POLICIES["block"], bitshuffle, 0, n, ntiles, int(payload.size))
    return _stream(hdr, ends, widths, payload)


def decode_block(buf: memoryview, hdr: L.Header) -> np.ndarray:
    n = hdr.n
    ends = L.tile_ends(buf, hdr)
    widths = np.frombuffer(buf, _U8, L.meta_size(hdr.policy, n), L.meta_offset(n))
    if np.any(widths > 32):
        raise CorruptStreamError(f"block stream width {int(widths.max())} exceeds 32 bits")
    sizes = 4 * widths.astype(np.int64)
    bpt = L.TILE_VALUES // L.PERBLOCK_BLOCK
    if not np.array_equal(np.cumsum(_tile_of(np.arange(widths.size), bpt, hdr.ntiles, weights=sizes)), ends):
        raise CorruptStreamError("block stream widths disagree with its tile table")
    payload = np.frombuffer(buf, _U8, hdr.payload, L.payload_offset(hdr.policy, n))
    off = np.cumsum(sizes) - sizes
    u2 = np.zeros((widths.size, L.PERBLOCK_BLOCK), dtype=np.uint32)
    for w in np.unique(widths[widths > 0]).tolist():
        sel = np.flatnonzero(widths == w)
        u2[sel] = unpack_bits(payload[off[sel][:, None] + np.arange(4 * w)], L.PERBLOCK_BLOCK, w, hdr.bitshuffle)
    return unzigzag(u2.reshape(-1)[:n])


# ------------------------------------------------------------------ entry
def encode(v: np.ndarray, policy: int, bitshuffle: bool) -> bytes:
    L.check_count(v.size)
    enc = encode_global if policy == L.POLICIES["global"] else encode_block
    return enc(np.ascontiguousarray(v, dtype=np.int32).reshape(-1), bitshuffle)


def decode(buf) -> np.ndarray:
    mv = memoryview(buf).cast("B")
    hdr = L.parse_header(mv)
    dec = decode_global if hdr.policy == L.POLICIES["global"] else decode_block
    return dec(mv, hdr)
