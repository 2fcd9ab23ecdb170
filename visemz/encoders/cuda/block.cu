// The shared block encoder on the GPU: sign-shift, truncation (global width with
// varied-length outliers, or a width per block), bit-flag zero-chunk scan,
// optional bitshuffle, and single-pass decoupled look-back compaction.
//
// These kernels write exactly the bytes of visemz/encoders/reference.py; the building blocks
// they share with the float codecs' kernels are in block.cuh.
#include "block.cuh"

#define NCAT 12
#define GB_PER_WARP 16   // global policy: 64-value blocks per warp (128 per tile)

// Magnitude category: the bit length up to 8, then 9 (9..16 bits), 10 (17..24), 11 (25..32).
__device__ __forceinline__ u32 category(u32 u) {
    u32 b = 32 - __clz(u);
    return b <= 8 ? b : (b <= 16 ? 9 : (b <= 24 ? 10 : 11));
}
__device__ __forceinline__ u32 outlier_bytes(u32 u) { return u < 256u ? 1 : (u < 65536u ? 2 : (u < 16777216u ? 3 : 4)); }
__device__ __forceinline__ u32 lanemask_lt() { u32 m; asm("mov.u32 %0, %%lanemask_lt;" : "=r"(m)); return m; }

// Exact block-stream size of each global width t = 1..8; smallest wins, ties to narrower.
// s: [0,12) values per category, [12,24) blocks by smallest non-zero category, [24,36) by
// largest, [36,44) non-zero bit-planes over all blocks when t = 1..8 bits are kept.
__device__ u32 choose_width(const u64* s, long long nb, int bitshuffle) {
    u64 best = ~0ull; u32 best_t = 1;
    for (u32 t = 1; t <= 8; ++t) {
        u64 chunk_bytes = 0, with_out = 0, outs = 0, vb = 0;
        if (bitshuffle) chunk_bytes = 8ull * s[3 * NCAT + t - 1];
        else for (u32 c = 1; c <= t; ++c) chunk_bytes += 8ull * t * s[NCAT + c];
        for (u32 c = t + 1; c < NCAT; ++c) {
            u64 bytes = c <= 8 ? 1 : c - 7;
            with_out += s[2 * NCAT + c]; outs += s[c]; vb += s[c] * bytes;
        }
        u64 meta = ((u64)nb * ((bitshuffle ? t : 1) + 1) + 7) / 8;
        u64 size = chunk_bytes + with_out + outs + vb + meta;
        if (size < best) { best = size; best_t = t; }
    }
    return best_t;
}

// ------------------------------------------------------------------ global policy
// Outliers of one 64-value block, from ballots alone (no scans): bit masks of the
// outlier positions and of the two bits of (bytes - 1) of each outlier.
struct Outliers {
    u32 ml, mh;            // outlier masks, values 0..31 and 32..63
    u32 b0l, b0h, b1l, b1h;  // bit 0 and bit 1 of (bytes - 1), per outlier
    __device__ __forceinline__ u32 count() const { return __popc(ml) + __popc(mh); }
    __device__ __forceinline__ u32 bytes() const {
        return count() + __popc(b0l) + __popc(b0h) + 2 * (__popc(b1l) + __popc(b1h));
    }
};

__device__ __forceinline__ Outliers find_outliers(u32 lo, u32 hi, u32 lim) {
    Outliers o;
    bool ol = lo >= lim, oh = hi >= lim;
    u32 el = ol ? outlier_bytes(lo) - 1 : 0, eh = oh ? outlier_bytes(hi) - 1 : 0;
    o.ml = __ballot_sync(FULL, ol); o.mh = __ballot_sync(FULL, oh);
    o.b0l = __ballot_sync(FULL, el & 1); o.b0h = __ballot_sync(FULL, eh & 1);
    o.b1l = __ballot_sync(FULL, el >> 1); o.b1h = __ballot_sync(FULL, eh >> 1);
    return o;
}

// stats: [0,12) values per category, [12,24) blocks by smallest non-zero category
// (0: all zero), [24,36) blocks by largest category, [36,44) non-zero bit-planes when
// values of up to t = 1..8 bits are kept.
extern "C" __global__ void __launch_bounds__(256) global_stats(const int* __restrict__ v, long long n, u64* stats) {
    const u32 lane = threadIdx.x & 31;
    const long long nb = (n + 63) / 64;
    u32 cnt[NCAT], bmin[NCAT], bmax[NCAT], planes[8];
#pragma unroll
    for (int c = 0; c < NCAT; ++c) cnt[c] = bmin[c] = bmax[c] = 0;
#pragma unroll
    for (int t = 0; t < 8; ++t) planes[t] = 0;
    long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    long long nwarps = ((long long)gridDim.x * blockDim.x) >> 5;
    for (long long b = warp; b < nb; b += nwarps) {
        long long i = b * 64 + lane;
        u32 lo = i < n ? zigzag(__ldcs(v + i)) : 0, hi = i + 32 < n ? zigzag(__ldcs(v + i + 32)) : 0;
        u32 cl = category(lo), ch = category(hi);
#pragma unroll
        for (u32 c = 1; c < NCAT; ++c) cnt[c] += (cl == c) + (ch == c);
        u32 mn = __reduce_min_sync(FULL, min(cl ? cl : 99u, ch ? ch : 99u));
        u32 mx = __reduce_max_sync(FULL, max(cl, ch));
        mn = mn == 99 ? 0 : mn;
#pragma unroll
        for (u32 c = 0; c < NCAT; ++c) { bmin[c] += (mn == c); bmax[c] += (mx == c); }
#pragma unroll
        for (u32 t = 1; t <= 8; ++t)
            planes[t - 1] += __popc(__reduce_or_sync(FULL, (cl <= t ? lo : 0u) | (ch <= t ? hi : 0u)));
    }
    // cnt[0] (zeros) is not needed by the width choice and stays 0.
#pragma unroll
    for (int c = 0; c < NCAT; ++c) {
        u32 total = __reduce_add_sync(FULL, cnt[c]);
        if (lane == 0) {
            if (total) atomicAdd(&stats[c], (u64)total);
            if (bmin[c]) atomicAdd(&stats[NCAT + c], (u64)bmin[c]);
            if (bmax[c]) atomicAdd(&stats[2 * NCAT + c], (u64)bmax[c]);
            if (c < 8 && planes[c]) atomicAdd(&stats[3 * NCAT + c], (u64)planes[c]);
        }
    }
}

// Pack a 64-value block's truncated values (lane holds values lane and lane+32) into
// buf (8t bytes): bit-planes of 8 bytes each, or t-bit values LSB first.
__device__ __forceinline__ void pack_chunk(u32* buf, u32 tl, u32 th, u32 t, u32 lane, int bitshuffle) {
    if (bitshuffle) {
        for (u32 p = 0; p < t; ++p) {
            u32 b0 = __ballot_sync(FULL, (tl >> p) & 1u), b1 = __ballot_sync(FULL, (th >> p) & 1u);
            if (lane == p) { buf[2 * p] = b0; buf[2 * p + 1] = b1; }
        }
    } else {
        if (lane < 17) buf[lane] = 0;
        __syncwarp();
        u32 bl = lane * t, bh = (32 + lane) * t;
        atomicOr(&buf[bl >> 5], tl << (bl & 31));
        if ((bl & 31) + t > 32) atomicOr(&buf[(bl >> 5) + 1], tl >> (32 - (bl & 31)));
        atomicOr(&buf[bh >> 5], th << (bh & 31));
        if ((bh & 31) + t > 32) atomicOr(&buf[(bh >> 5) + 1], th >> (32 - (bh & 31)));
    }
    __syncwarp();
}

extern "C" __global__ void __launch_bounds__(256, 2) global_encode(
    const int* __restrict__ v, long long n, const u64* __restrict__ stats, int bitshuffle, u8* __restrict__ out,
    u64* status, u32* tile_counter, u64* out_size) {
    __shared__ u32 s_tile, s_t;
    __shared__ u64 s_prefix;
    __shared__ u32 s_warp[WARPS][4], s_pre[WARPS][4], s_tot[4];
    __shared__ u32 s_buf[WARPS][17];
    const u32 lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const long long ntiles = n_tiles(n), nb = (n + 63) / 64;
    if (threadIdx.x == 0) { s_tile = atomicAdd(tile_counter, 1u); s_t = choose_width(stats, nb, bitshuffle); }
    __syncthreads();
    const u32 tile = s_tile, t = s_t, lim = 1u << t;
    // A block's chunks: its t bit-planes of 8 bytes (bitshuffle), or one chunk of 8t bytes.
    const u32 nflag = bitshuffle ? t : 1, csize = bitshuffle ? 8 : 8 * t;
    const long long meta_off = HEADER_SIZE + 4 * ntiles, meta_size = (nb * (nflag + 1) + 7) / 8;
    const long long pay_off = meta_off + meta_size;
    const long long first_block = (long long)tile * (WARPS * GB_PER_WARP) + w * GB_PER_WARP;

    u32 lo[GB_PER_WARP], hi[GB_PER_WARP];
#pragma unroll
    for (int j = 0; j < GB_PER_WARP; ++j) {
        long long i = (first_block + j) * 64 + lane;
        lo[j] = i < n ? zigzag(__ldcs(v + i)) : 0;
        hi[j] = i + 32 < n ? zigzag(__ldcs(v + i + 32)) : 0;
    }
    // Pass 1: per-block sizes; lane j keeps block j's numbers.
    u32 my_mask = 0, my_cnt = 0, my_vb = 0;
#pragma unroll
    for (int j = 0; j < GB_PER_WARP; ++j) {
        u32 tl = lo[j] < lim ? lo[j] : 0, th = hi[j] < lim ? hi[j] : 0;
        u32 planes = __reduce_or_sync(FULL, tl | th);  // bit p: plane p is non-zero
        Outliers o = find_outliers(lo[j], hi[j], lim);
        if (lane == (u32)j) { my_mask = bitshuffle ? planes : (planes != 0); my_cnt = o.count(); my_vb = o.bytes(); }
    }
    const u32 q[4] = {(u32)__popc(my_mask), my_cnt ? 1u : 0u, my_cnt, my_vb};
    u32 ex[4];
    tile_exclusive<4, 0, 4>(q, ex, s_warp, s_pre, s_tot);
    const u32 n_chunks = s_tot[0], n_ho = s_tot[1], n_out = s_tot[2], n_vb = s_tot[3];
    const u64 tile_size = (u64)csize * n_chunks + n_ho + n_out + n_vb;
    if (threadIdx.x == 0) {
        u64 prefix = look_back(status, tile, tile_size, out_size);
        s_prefix = prefix;
        u64 end = prefix + tile_size;
        *(u32*)(out + HEADER_SIZE + 4ull * tile) = (u32)end;
        if (tile == ntiles - 1) {
            write_header(out, 0, bitshuffle, t, n, (u32)end);
            atomicCAS(out_size, 0ull, (u64)(pay_off + end));
        }
    }
    __syncthreads();

    // Meta: per block nflag chunk flags and one outlier flag, bit-packed; a warp's 16 blocks
    // fill 2 * (nflag + 1) whole bytes.
    const u32 fbits = nflag + 1;
    if (lane < 5) s_buf[w][lane] = 0;
    __syncwarp();
    if (lane < GB_PER_WARP) {
        u32 val = my_mask | ((my_cnt != 0 ? 1u : 0u) << nflag), bit = lane * fbits;
        atomicOr(&s_buf[w][bit >> 5], val << (bit & 31));
        if ((bit & 31) + fbits > 32) atomicOr(&s_buf[w][(bit >> 5) + 1], val >> (32 - (bit & 31)));
    }
    __syncwarp();
    if (lane < 2 * fbits) {
        long long byte = first_block * fbits / 8 + lane;
        if (byte < meta_size) out[meta_off + byte] = ((const u8*)s_buf[w])[lane];
    }
    __syncwarp();
    u8* base = out + pay_off + s_prefix;
    u8* counts = base + (u64)csize * n_chunks;
    u8* index = counts + n_ho;
    u8* values = index + n_out;
    const u8* buf = (const u8*)s_buf[w];
    const u32 lt = lanemask_lt();
    // Pass 2: write chunks and outliers.
#pragma unroll
    for (int j = 0; j < GB_PER_WARP; ++j) {
        u32 mask = __shfl_sync(FULL, my_mask, j);
        if (mask) {
            u32 off = __shfl_sync(FULL, ex[0], j) * csize;
            pack_chunk(s_buf[w], lo[j] < lim ? lo[j] : 0, hi[j] < lim ? hi[j] : 0, t, lane, bitshuffle);
#pragma unroll
            for (u32 h = 0; h < 64; h += 32) {
                u32 b = lane + h, p = b >> 3;
                if (b < 8 * t) {
                    if (!bitshuffle) base[off + b] = buf[b];
                    else if ((mask >> p) & 1u) base[off + 8 * __popc(mask & ((1u << p) - 1u)) + (b & 7)] = buf[b];
                }
            }
            __syncwarp();
        }
        u32 cnt = __shfl_sync(FULL, my_cnt, j);
        if (cnt) {
            u32 ho_rank = __shfl_sync(FULL, ex[1], j), orank = __shfl_sync(FULL, ex[2], j);
            u32 voff = __shfl_sync(FULL, ex[3], j);
            if (lane == 0) counts[ho_rank] = (u8)(cnt - 1);
            Outliers o = find_outliers(lo[j], hi[j], lim);
            // bytes of the outliers before this lane's: count + bit-0 sum + 2 * bit-1 sum
            u32 before_l = __popc(o.ml & lt) + __popc(o.b0l & lt) + 2 * __popc(o.b1l & lt);
            u32 all_l = __popc(o.ml) + __popc(o.b0l) + 2 * __popc(o.b1l);
            u32 before_h = all_l + __popc(o.mh & lt) + __popc(o.b0h & lt) + 2 * __popc(o.b1h & lt);
            if (lo[j] >= lim) {
                u32 nbt = outlier_bytes(lo[j]);
                index[orank + __popc(o.ml & lt)] = (u8)(((nbt - 1) << 6) | lane);
                u8* dst = values + voff + before_l;
                for (u32 k = 0; k < nbt; ++k) dst[k] = (u8)(lo[j] >> (8 * k));
            }
            if (hi[j] >= lim) {
                u32 nbt = outlier_bytes(hi[j]);
                index[orank + __popc(o.ml) + __popc(o.mh & lt)] = (u8)(((nbt - 1) << 6) | (32 + lane));
                u8* dst = values + voff + before_h;
                for (u32 k = 0; k < nbt; ++k) dst[k] = (u8)(hi[j] >> (8 * k));
            }
        }
    }
}

extern "C" __global__ void __launch_bounds__(256) global_decode(
    const u8* __restrict__ in, long long n, u32 t, int bitshuffle, u32 payload, int* __restrict__ out, int* err) {
    __shared__ u32 s_warp[WARPS][4], s_pre[WARPS][4], s_tot[4];
    __shared__ u32 s_vals[WARPS][64];
    __shared__ u32 s_buf[WARPS][17];
    const u32 lane = threadIdx.x & 31, w = threadIdx.x >> 5, tile = blockIdx.x;
    const long long ntiles = n_tiles(n), nb = (n + 63) / 64;
    const u32 nflag = bitshuffle ? t : 1, csize = bitshuffle ? 8 : 8 * t, fbits = nflag + 1;
    const long long meta_off = HEADER_SIZE + 4 * ntiles, meta_size = (nb * fbits + 7) / 8;
    const u8* pay = in + meta_off + meta_size;
    const u32* table = (const u32*)(in + HEADER_SIZE);
    const u32 start = tile ? table[tile - 1] : 0, end = table[tile];
    if (start > end || end > payload || (tile == ntiles - 1 && end != payload)) { if (threadIdx.x == 0) atomicOr(err, 1); return; }
    const u32 size = end - start;
    const long long first_block = (long long)tile * (WARPS * GB_PER_WARP) + w * GB_PER_WARP;
    const long long blk = first_block + lane;
    u32 f = 0;
    if (lane < GB_PER_WARP) {
        long long bit = blk * fbits, byte = bit >> 3;
        u32 b0 = byte < meta_size ? in[meta_off + byte] : 0u, b1 = byte + 1 < meta_size ? in[meta_off + byte + 1] : 0u;
        f = ((b0 | b1 << 8) >> (bit & 7)) & ((1u << fbits) - 1u);
    }
    if (blk >= nb && f) atomicOr(err, 2);
    const u32 my_mask = f & ((1u << nflag) - 1u), my_ho = f >> nflag;
    // chunks, blocks with outliers, then (once the counts are read) outliers and value bytes
    u32 ex[4], q[4] = {(u32)__popc(my_mask), my_ho, 0, 0};
    tile_exclusive<4, 0, 2>(q, ex, s_warp, s_pre, s_tot);
    const u64 chunk_bytes = (u64)csize * s_tot[0];
    const u32 n_ho = s_tot[1];
    if (chunk_bytes + n_ho > size) { if (threadIdx.x == 0) atomicOr(err, 4); return; }
    const u8* base = pay + start;
    const u8* counts = base + chunk_bytes;
    const u32 my_cnt = my_ho ? counts[ex[1]] + 1u : 0u;
    q[2] = my_cnt;
    tile_exclusive<4, 2, 3>(q, ex, s_warp, s_pre, s_tot);
    const u32 n_out = s_tot[2];
    if (chunk_bytes + n_ho + n_out > size) { if (threadIdx.x == 0) atomicOr(err, 8); return; }
    const u8* index = counts + n_ho;
    // Value bytes per block come from its index bytes.
    u32 my_vb = 0;
    for (int j = 0; j < GB_PER_WARP; ++j) {
        u32 cnt = __shfl_sync(FULL, my_cnt, j), orank = __shfl_sync(FULL, ex[2], j);
        if (!cnt) continue;
        u32 s = (lane < cnt ? (index[orank + lane] >> 6) + 1u : 0u) + (lane + 32 < cnt ? (index[orank + lane + 32] >> 6) + 1u : 0u);
        s = __reduce_add_sync(FULL, s);
        if (lane == (u32)j) my_vb = s;
    }
    q[3] = my_vb;
    tile_exclusive<4, 3, 4>(q, ex, s_warp, s_pre, s_tot);
    if (chunk_bytes + n_ho + n_out + s_tot[3] != size) { if (threadIdx.x == 0) atomicOr(err, 16); return; }
    const u8* values = index + n_out;
    u8* buf = (u8*)s_buf[w];
    const u32 mask = (1u << t) - 1u;
    for (int j = 0; j < GB_PER_WARP; ++j) {
        long long b = first_block + j;
        if (b >= nb) break;
        u32 lo = 0, hi = 0;
        u32 cmask = __shfl_sync(FULL, my_mask, j);
        if (cmask) {
            u32 off = __shfl_sync(FULL, ex[0], j) * csize;
#pragma unroll
            for (u32 h = 0; h < 64; h += 32) {
                u32 b = lane + h, p = b >> 3;
                if (b < 8 * t) {
                    if (!bitshuffle) buf[b] = base[off + b];
                    else buf[b] = ((cmask >> p) & 1u) ? base[off + 8 * __popc(cmask & ((1u << p) - 1u)) + (b & 7)] : 0;
                }
            }
            __syncwarp();
            if (bitshuffle) {
                for (u32 p = 0; p < t; ++p) {
                    lo |= ((buf[8 * p + (lane >> 3)] >> (lane & 7)) & 1u) << p;
                    hi |= ((buf[8 * p + 4 + (lane >> 3)] >> (lane & 7)) & 1u) << p;
                }
            } else {  // t-bit values LSB first; a value may straddle two bytes
                u32 bl = lane * t, bh = (32 + lane) * t;
                lo = (((u32)buf[bl >> 3] | (u32)buf[(bl >> 3) + 1] << 8) >> (bl & 7)) & mask;
                hi = (((u32)buf[bh >> 3] | (u32)buf[(bh >> 3) + 1] << 8) >> (bh & 7)) & mask;
            }
            __syncwarp();
        }
        u32 cnt = __shfl_sync(FULL, my_cnt, j);
        if (cnt) {
            s_vals[w][lane] = lo; s_vals[w][lane + 32] = hi;
            __syncwarp();
            u32 orank = __shfl_sync(FULL, ex[2], j), voff = __shfl_sync(FULL, ex[3], j);
            u32 ia = lane < cnt ? index[orank + lane] : 0, ib = lane + 32 < cnt ? index[orank + lane + 32] : 0;
            u32 na = lane < cnt ? (ia >> 6) + 1u : 0u, nbb = lane + 32 < cnt ? (ib >> 6) + 1u : 0u;
            u32 sa = warp_incl_scan(na, lane), sb = warp_incl_scan(nbb, lane), tota = __shfl_sync(FULL, sa, 31);
            // positions must increase within a block (the reference checks the same)
            u32 pa = ia & 63u, pb = ib & 63u;
            u32 prev_a = __shfl_up_sync(FULL, pa, 1), prev_b = __shfl_up_sync(FULL, pb, 1);
            u32 last_a = __shfl_sync(FULL, pa, 31);
            if (lane < cnt && lane > 0 && pa <= prev_a) atomicOr(err, 32);
            if (lane + 32 < cnt && pb <= (lane == 0 ? last_a : prev_b)) atomicOr(err, 32);
            if (lane < cnt) {
                const u8* src = values + voff + sa - na;
                u32 u = 0;
                for (u32 k = 0; k < na; ++k) u |= (u32)src[k] << (8 * k);
                s_vals[w][pa] = u;
            }
            if (lane + 32 < cnt) {
                const u8* src = values + voff + tota + sb - nbb;
                u32 u = 0;
                for (u32 k = 0; k < nbb; ++k) u |= (u32)src[k] << (8 * k);
                s_vals[w][pb] = u;
            }
            __syncwarp();
            lo = s_vals[w][lane]; hi = s_vals[w][lane + 32];
            __syncwarp();
        }
        long long i = b * 64 + lane;
        if (i < n) out[i] = unzigzag(lo);
        if (i + 32 < n) out[i + 32] = unzigzag(hi);
    }
}

// ---------------------------------------------------------------- per-block policy
// Value loaders for pb_encode_values: each returns the sign-shifted symbol of value i and
// reports any bad input once per warp (report) after the tile is loaded.
struct IntSymbols {  // int32 symbols as they are (block_encode)
    const int* __restrict__ v;
    __device__ __forceinline__ u32 operator()(long long i) { return zigzag(__ldcs(v + i)); }
    __device__ __forceinline__ void report(u32) {}
};


extern "C" __global__ void __launch_bounds__(256, 2) block_encode(
    const int* __restrict__ v, long long n, int bitshuffle, u8* __restrict__ out, u64* status, u32* tile_counter,
    u64* out_size) {
    IntSymbols load{v};
    pb_encode_values(load, n, bitshuffle, out, status, tile_counter, out_size);
}

// Value stores for pb_decode_values: symbol q of value i -> the output.
struct IntStore {  // int32 symbols (block_decode)
    int* __restrict__ out;
    __device__ __forceinline__ void operator()(long long i, int q) { out[i] = q; }
};

extern "C" __global__ void __launch_bounds__(256) block_decode(
    const u8* __restrict__ in, long long n, int bitshuffle, u32 payload, int* __restrict__ out, int* err) {
    IntStore store{out};
    pb_decode_values(in, n, bitshuffle, payload, store, err);
}

// ------------------------------------------------------------ homomorphic addition
struct AddInto {  // a sum that leaves int32 by the CPU's rule |s| >= 2^31 - 1 becomes 0 and sets `over`
    bool over = false;
    __device__ __forceinline__ void operator()(u32& u, u32 v) {
        long long s = (long long)unzigzag(u) + (long long)unzigzag(v);
        if (s >= 2147483647ll || s <= -2147483647ll) { over = true; s = 0; }
        u = zigzag((int)s);
    }
};

// The exact length of an add input: `cap` itself when `words` is null (the host knows it), else the
// length its maker left in device memory, words[0], with words[1] the maker's report bits, which
// are carried into this sum's error word (so a ring's last sum reports every upstream failure).  A
// length over `cap` (a failed maker's ~0) gives -1, which pb_header_ok refuses (error bit 128)
// before anything past the buffer is read.
__device__ __forceinline__ long long add_input_length(long long cap, const u64* words, int* err) {
    if (words == nullptr) return cap;
    const u64 k = words[0];
    if (blockIdx.x == 0 && threadIdx.x == 0 && (words[1] & 0x7fffffffull)) atomicOr(err, (int)(words[1] & 0x7fffffffull));
    return k <= (u64)cap ? (long long)k : -1;
}

// out = a + b on the integer symbols, block by block: decode tile i of a into registers, decode
// b's tile onto it (AddInto: a sum that leaves int32 by the CPU's rule |s| >= 2^31 - 1 sets error
// bit 64; one tile in registers, 79 of them on sm_90 (nvrtc 13), so 3 CTAs per SM; the payloads are staged through one shared buffer, see pb_decode_tile), re-encode
// and place the tile by decoupled look-back.  One kernel; `out` must not
// overlap a or b (a tile's new offset can pass input bytes other CTAs still read), so the
// in-place form writes a scratch stream and copies it back (copy_sized).  On any error the
// CTA still publishes its tile (as zeros) so no successor waits forever; the host raises.
extern "C" __global__ void __launch_bounds__(256, 3) block_add(
    const u8* __restrict__ a, long long cap_a, const u64* words_a, const u8* __restrict__ b, long long cap_b,
    const u64* words_b, long long n, int bitshuffle, u8* __restrict__ out, u64* status, u32* tile_counter, u64* out_size,
    int* err) {
    __shared__ u32 s_tile;
    if (threadIdx.x == 0) s_tile = atomicAdd(tile_counter, 1u);
    __syncthreads();
    const u32 tile = s_tile;
    u32 pa = 0, pb = 0;
    const long long len_a = add_input_length(cap_a, words_a, err), len_b = add_input_length(cap_b, words_b, err);
    bool ok = pb_header_ok(a, len_a, n, bitshuffle, &pa) && pb_header_ok(b, len_b, n, bitshuffle, &pb);
    if (!ok && threadIdx.x == 0) atomicOr(err, 128);
    u32 ua[PB_PER_WARP];
    Assign assign;
    AddInto add_b;
    if (ok) ok = pb_decode_tile(a, n, bitshuffle, pa, tile, ua, err, assign);
    __syncthreads();  // the decoder's shared scan cells are reused for b
    if (ok) ok = pb_decode_tile(b, n, bitshuffle, pb, tile, ua, err, add_b);
    if (!ok) {
#pragma unroll
        for (int j = 0; j < PB_PER_WARP; ++j) ua[j] = 0;
    }
    if (add_b.over) atomicOr(err, 64);
    pb_encode_tile(ua, n, bitshuffle, out, status, out_size, tile);
}

// dst[0, *size) = src[0, *size): the in-place add's copy back, sized on the device (no host read).
extern "C" __global__ void copy_sized(const u8* __restrict__ src, u8* __restrict__ dst, const u64* size, long long cap) {
    const long long total = (long long)min((u64)cap, *size);
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (long long)gridDim.x * blockDim.x)
        dst[i] = src[i];
}
