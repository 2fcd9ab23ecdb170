// The shared block encoder on the GPU: sign-shift, truncation (global width with
// varied-length outliers, or a width per block), bit-flag zero-chunk scan,
// optional bitshuffle, and single-pass decoupled look-back compaction.
//
// These kernels write exactly the bytes of visemz/encoders/reference.py; the
// layout constants mirror visemz/encoders/layout.py and docs/FORMAT.md.
// One thread block of 256 threads (8 warps) handles one tile of 8192 values;
// every value a warp needs stays in its registers from load to store.

#define FULL 0xffffffffu
#define TILE 8192
#define NCAT 12
#define GB_PER_WARP 16   // global policy: 64-value blocks per warp (128 per tile)
#define PB_PER_WARP 32   // per-block policy: 32-value blocks per warp (256 per tile)
#define WARPS 8
#define HEADER_SIZE 24
#define ST_AGG (1ull << 62)
#define ST_PRE (2ull << 62)
#define ST_MASK ((1ull << 62) - 1)

typedef unsigned char u8;
typedef unsigned int u32;
typedef unsigned long long u64;

__device__ __forceinline__ u32 zigzag(int v) { return ((u32)v << 1) ^ (u32)(v >> 31); }
__device__ __forceinline__ int unzigzag(u32 u) { return (int)((u >> 1) ^ (0u - (u & 1u))); }

// Magnitude category: the bit length up to 8, then 9 (9..16 bits), 10 (17..24), 11 (25..32).
__device__ __forceinline__ u32 category(u32 u) {
    u32 b = 32 - __clz(u);
    return b <= 8 ? b : (b <= 16 ? 9 : (b <= 24 ? 10 : 11));
}
__device__ __forceinline__ u32 outlier_bytes(u32 u) { return u < 256u ? 1 : (u < 65536u ? 2 : (u < 16777216u ? 3 : 4)); }
__device__ __forceinline__ u32 lanemask_lt() { u32 m; asm("mov.u32 %0, %%lanemask_lt;" : "=r"(m)); return m; }

__device__ __forceinline__ u32 warp_incl_scan(u32 x, u32 lane) {
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
        u32 y = __shfl_up_sync(FULL, x, d);
        if (lane >= (u32)d) x += y;
    }
    return x;
}

__device__ __forceinline__ long long n_tiles(long long n) { return (n + TILE - 1) / TILE; }

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

// Decoupled look-back (Merrill & Garland): publish this tile's aggregate, add predecessors'
// aggregates until one publishes an inclusive prefix, publish ours. Returns the exclusive prefix.
// A predecessor that never publishes means a bug; after ~2^24 polls we mark the result
// invalid (out_size = ~0) and finish, so the host raises instead of hanging.
__device__ u64 look_back(u64* status, u32 tile, u64 agg, u64* out_size) {
    if (tile == 0) { atomicExch(&status[0], ST_PRE | agg); return 0; }
    atomicExch(&status[tile], ST_AGG | agg);
    u64 excl = 0;
    long long p = (long long)tile - 1;
    u32 spins = 0;
    while (true) {
        u64 s = *(volatile u64*)&status[p];
        if (s == 0) {  // predecessor has not published yet
            if (++spins > (1u << 24)) { atomicExch(out_size, ~0ull); break; }
            continue;
        }
        excl += s & ST_MASK;
        if (s & ST_PRE) break;
        --p;
    }
    __threadfence();
    atomicExch(&status[tile], ST_PRE | (excl + agg));
    return excl;
}

__device__ void write_header(u8* out, u32 policy, u32 bitshuffle, u32 width, long long n, u32 payload) {
    const u8 magic[4] = {'V', 'Z', 'B', 'K'};
    for (int i = 0; i < 4; ++i) out[i] = magic[i];
    out[4] = 1; out[5] = (u8)policy; out[6] = (u8)(bitshuffle ? 1 : 0); out[7] = (u8)width;
    for (int i = 0; i < 8; ++i) out[8 + i] = (u8)((unsigned long long)n >> (8 * i));
    u32 nt = (u32)n_tiles(n);
    for (int i = 0; i < 4; ++i) { out[16 + i] = (u8)(nt >> (8 * i)); out[20 + i] = (u8)(payload >> (8 * i)); }
}

// Block-wide exclusive prefix of per-warp totals, for quantities [q0, q1) of a [WARPS][S] table;
// s_tot gets the tile totals.  Callers __syncthreads() before and after.
template <int S>
__device__ void tile_scan(u32 (*s_warp)[S], u32 (*s_pre)[S], u32* s_tot, int q0, int q1) {
    int q = q0 + (int)threadIdx.x;
    if (q < q1) {
        u32 acc = 0;
        for (int w = 0; w < WARPS; ++w) { s_pre[w][q] = acc; acc += s_warp[w][q]; }
        s_tot[q] = acc;
    }
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
    u32 q[4] = {(u32)__popc(my_mask), my_cnt ? 1u : 0u, my_cnt, my_vb};
    u32 ex[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        u32 inc = warp_incl_scan(q[k], lane);
        ex[k] = inc - q[k];
        if (lane == 31) s_warp[w][k] = inc;
    }
    __syncthreads();
    tile_scan<4>(s_warp, s_pre, s_tot, 0, 4);
    __syncthreads();
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
#pragma unroll
    for (int k = 0; k < 4; ++k) ex[k] += s_pre[w][k];

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
    u32 ex[4], q[2] = {(u32)__popc(my_mask), my_ho};
#pragma unroll
    for (int k = 0; k < 2; ++k) {
        u32 inc = warp_incl_scan(q[k], lane);
        ex[k] = inc - q[k];
        if (lane == 31) s_warp[w][k] = inc;
    }
    __syncthreads();
    tile_scan<4>(s_warp, s_pre, s_tot, 0, 2);
    __syncthreads();
    const u64 chunk_bytes = (u64)csize * s_tot[0];
    const u32 n_ho = s_tot[1];
    ex[0] += s_pre[w][0]; ex[1] += s_pre[w][1];
    if (chunk_bytes + n_ho > size) { if (threadIdx.x == 0) atomicOr(err, 4); return; }
    const u8* base = pay + start;
    const u8* counts = base + chunk_bytes;
    u32 my_cnt = my_ho ? counts[ex[1]] + 1u : 0u;
    {
        u32 inc = warp_incl_scan(my_cnt, lane);
        ex[2] = inc - my_cnt;
        if (lane == 31) s_warp[w][2] = inc;
    }
    __syncthreads();
    tile_scan<4>(s_warp, s_pre, s_tot, 2, 3);
    __syncthreads();
    const u32 n_out = s_tot[2];
    ex[2] += s_pre[w][2];
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
    {
        u32 inc = warp_incl_scan(my_vb, lane);
        ex[3] = inc - my_vb;
        if (lane == 31) s_warp[w][3] = inc;
    }
    __syncthreads();
    tile_scan<4>(s_warp, s_pre, s_tot, 3, 4);
    __syncthreads();
    if (chunk_bytes + n_ho + n_out + s_tot[3] != size) { if (threadIdx.x == 0) atomicOr(err, 16); return; }
    ex[3] += s_pre[w][3];
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
// Bit-planes of a warp's 32 values and back are the same 32x32 bit-matrix transpose (lane r's
// bit c <-> lane c's bit r).  Narrow blocks take one ballot (encode) or shuffle (decode) per
// plane; wider ones this five-step butterfly, whose 5 dependent shuffles beat `width` of them.
// Bits at or above a block's width are 0 in every lane, so both give the same words.
#define TRANSPOSE_MIN_WIDTH 6
__device__ __forceinline__ u32 transpose32(u32 x, u32 lane) {
#pragma unroll
    for (u32 k = 16; k; k >>= 1) {
        // m: the bit columns c with (c & k) == 0; the lower lane of a pair keeps them, the upper the rest
        const u32 m = k == 16 ? 0x0000FFFFu : k == 8 ? 0x00FF00FFu : k == 4 ? 0x0F0F0F0Fu : k == 2 ? 0x33333333u : 0x55555555u;
        const u32 y = __shfl_xor_sync(FULL, x, k);
        x = (lane & k) ? (x & ~m) | ((y >> k) & m) : (x & m) | ((y << k) & ~m);
    }
    return x;
}

// Encode one tile whose values are in registers: lane `lane` of warp w holds, in u[j], the
// sign-shifted value lane of block (tile * 256 + w * 32 + j).  Widths, tile scan, look-back,
// then the width bytes and the bit-planes.  Shared by block_encode and block_add.
__device__ __forceinline__ void pb_encode_tile(const u32 (&u)[PB_PER_WARP], long long n, int bitshuffle, u8* __restrict__ out,
                                               u64* status, u64* out_size, u32 tile) {
    __shared__ u64 s_prefix;
    __shared__ u32 s_warp[WARPS][1], s_pre[WARPS][1], s_tot[1];
    __shared__ u32 s_buf[WARPS][33];
    const u32 lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const long long ntiles = n_tiles(n), nb = (n + 31) / 32;
    const long long meta_off = HEADER_SIZE + 4 * ntiles, pay_off = meta_off + nb;
    const long long first_block = (long long)tile * (WARPS * PB_PER_WARP) + w * PB_PER_WARP;
    u32 my_w = 0;
#pragma unroll
    for (int j = 0; j < PB_PER_WARP; ++j) {
        u32 width = 32 - __clz(__reduce_or_sync(FULL, u[j]));
        if (lane == (u32)j) my_w = width;
    }
    u32 inc = warp_incl_scan(my_w, lane);
    u32 ex = inc - my_w;
    if (lane == 31) s_warp[w][0] = inc;
    __syncthreads();
    tile_scan<1>(s_warp, s_pre, s_tot, 0, 1);
    __syncthreads();
    const u64 tile_size = 4ull * s_tot[0];
    if (threadIdx.x == 0) {
        u64 prefix = look_back(status, tile, tile_size, out_size);
        s_prefix = prefix;
        u64 end = prefix + tile_size;
        *(u32*)(out + HEADER_SIZE + 4ull * tile) = (u32)end;
        if (tile == ntiles - 1) {
            write_header(out, 1, bitshuffle, 0, n, (u32)end);
            atomicCAS(out_size, 0ull, (u64)(pay_off + end));
        }
    }
    __syncthreads();
    ex += s_pre[w][0];
    if (first_block + lane < nb) out[meta_off + first_block + lane] = (u8)my_w;
    u8* base = out + pay_off + s_prefix;
#pragma unroll
    for (int j = 0; j < PB_PER_WARP; ++j) {
        u32 width = __shfl_sync(FULL, my_w, j);
        if (!width) continue;
        u32 off = 4 * __shfl_sync(FULL, ex, j);
        u32 word = 0;
        if (bitshuffle && width > TRANSPOSE_MIN_WIDTH) {
            word = transpose32(u[j], lane);
        } else if (bitshuffle) {
            for (u32 p = 0; p < width; ++p) {
                u32 b = __ballot_sync(FULL, (u[j] >> p) & 1u);
                if (lane == p) word = b;
            }
        } else {
            s_buf[w][lane] = 0;
            __syncwarp();
            u32 bit = lane * width, k = bit >> 5, sh = bit & 31;
            atomicOr(&s_buf[w][k], u[j] << sh);
            if (sh + width > 32) atomicOr(&s_buf[w][k + 1], u[j] >> (32 - sh));
            __syncwarp();
            word = s_buf[w][lane];
            __syncwarp();
        }
        if (lane < width) {
            u8* dst = base + off + 4 * lane;
            dst[0] = (u8)word; dst[1] = (u8)(word >> 8); dst[2] = (u8)(word >> 16); dst[3] = (u8)(word >> 24);
        }
    }
}

// Decode one tile into registers (same layout as pb_encode_tile's u: sign-shifted values,
// 0 past n).  Returns false, uniformly over the thread block, when the tile's table entry or
// its widths disagree with the payload; `err` gets the same bits block_decode reports.
// How pb_decode_tile hands over each decoded value: Assign stores it; AddInto adds it to the
// symbol already there (block_add decodes b onto a's tile instead of holding two tiles).
struct Assign {
    __device__ __forceinline__ void operator()(u32& u, u32 v) { u = v; }
};
struct AddInto {  // a sum that leaves int32 by the CPU's rule |s| >= 2^31 - 1 becomes 0 and sets `over`
    bool over = false;
    __device__ __forceinline__ void operator()(u32& u, u32 v) {
        long long s = (long long)unzigzag(u) + (long long)unzigzag(v);
        if (s >= 2147483647ll || s <= -2147483647ll) { over = true; s = 0; }
        u = zigzag((int)s);
    }
};

template <class Put>
__device__ __forceinline__ bool pb_decode_tile(const u8* __restrict__ in, long long n, int bitshuffle, u32 payload, u32 tile,
                                               u32 (&u)[PB_PER_WARP], int* err, Put& put) {
    __shared__ u32 s_warp[WARPS][1], s_pre[WARPS][1], s_tot[1];
    __shared__ u32 s_buf[WARPS][33];
    const u32 lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const long long ntiles = n_tiles(n), nb = (n + 31) / 32;
    const long long meta_off = HEADER_SIZE + 4 * ntiles;
    const u8* pay = in + meta_off + nb;
    const u32* table = (const u32*)(in + HEADER_SIZE);
    const u32 start = tile ? table[tile - 1] : 0, end = table[tile];
    if (start > end || end > payload || (tile == ntiles - 1 && end != payload)) { if (threadIdx.x == 0) atomicOr(err, 1); return false; }
    const long long first_block = (long long)tile * (WARPS * PB_PER_WARP) + w * PB_PER_WARP;
    u32 my_w = first_block + lane < nb ? in[meta_off + first_block + lane] : 0;
    if (my_w > 32) { atomicOr(err, 2); my_w = 32; }
    u32 inc = warp_incl_scan(my_w, lane);
    u32 ex = inc - my_w;
    if (lane == 31) s_warp[w][0] = inc;
    __syncthreads();
    tile_scan<1>(s_warp, s_pre, s_tot, 0, 1);
    __syncthreads();
    if (4ull * s_tot[0] != end - start) { if (threadIdx.x == 0) atomicOr(err, 4); return false; }
    ex += s_pre[w][0];
    const u8* base = pay + start;
#pragma unroll
    for (int j = 0; j < PB_PER_WARP; ++j) {
        u32 width = __shfl_sync(FULL, my_w, j);  // 0 for blocks past the end
        u32 val = 0;
        if (width) {
            u32 off = 4 * __shfl_sync(FULL, ex, j);
            u32 word = 0;
            if (lane < width) {
                const u8* src = base + off + 4 * lane;
                word = (u32)src[0] | (u32)src[1] << 8 | (u32)src[2] << 16 | (u32)src[3] << 24;
            }
            if (bitshuffle && width > TRANSPOSE_MIN_WIDTH) {
                val = transpose32(word, lane);
            } else if (bitshuffle) {
                for (u32 p = 0; p < width; ++p) val |= ((__shfl_sync(FULL, word, p) >> lane) & 1u) << p;
            } else {
                s_buf[w][lane] = word;
                s_buf[w][32] = 0;
                __syncwarp();
                u32 bit = lane * width, k = bit >> 5, sh = bit & 31;
                val = s_buf[w][k] >> sh;
                if (sh + width > 32) val |= s_buf[w][k + 1] << (32 - sh);
                if (width < 32) val &= (1u << width) - 1u;
                __syncwarp();
            }
        }
        put(u[j], (first_block + j) * 32 + lane < n ? val : 0u);
    }
    return true;
}

// Value loaders for pb_encode_values: each returns the sign-shifted symbol of value i and
// reports any bad input once per warp (report) after the tile is loaded.
struct IntSymbols {  // int32 symbols as they are (block_encode)
    const int* __restrict__ v;
    __device__ __forceinline__ u32 operator()(long long i) { return zigzag(__ldcs(v + i)); }
    __device__ __forceinline__ void report(u32) {}
};

// One tile of block_encode: load the tile's values through `load`, then pb_encode_tile.
template <class Load>
__device__ __forceinline__ void pb_encode_values(Load& load, long long n, int bitshuffle, u8* __restrict__ out, u64* status,
                                                 u32* tile_counter, u64* out_size) {
    __shared__ u32 s_tile;
    const u32 lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    if (threadIdx.x == 0) s_tile = atomicAdd(tile_counter, 1u);
    __syncthreads();
    const u32 tile = s_tile;
    const long long first_block = (long long)tile * (WARPS * PB_PER_WARP) + w * PB_PER_WARP;
    u32 u[PB_PER_WARP];
#pragma unroll
    for (int j = 0; j < PB_PER_WARP; ++j) {
        long long i = (first_block + j) * 32 + lane;
        u[j] = i < n ? load(i) : 0;
    }
    load.report(lane);
    pb_encode_tile(u, n, bitshuffle, out, status, out_size, tile);
}

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

// One tile of block_decode: pb_decode_tile, then each value through `store`.
template <class Store>
__device__ __forceinline__ void pb_decode_values(const u8* __restrict__ in, long long n, int bitshuffle, u32 payload,
                                                 Store& store, int* err) {
    const u32 lane = threadIdx.x & 31, w = threadIdx.x >> 5, tile = blockIdx.x;
    u32 u[PB_PER_WARP];
    Assign put;
    if (!pb_decode_tile(in, n, bitshuffle, payload, tile, u, err, put)) return;
    const long long first_block = (long long)tile * (WARPS * PB_PER_WARP) + w * PB_PER_WARP;
#pragma unroll
    for (int j = 0; j < PB_PER_WARP; ++j) {
        long long i = (first_block + j) * 32 + lane;
        if (i < n) store(i, unzigzag(u[j]));
    }
}

extern "C" __global__ void __launch_bounds__(256) block_decode(
    const u8* __restrict__ in, long long n, int bitshuffle, u32 payload, int* __restrict__ out, int* err) {
    IntStore store{out};
    pb_decode_values(in, n, bitshuffle, payload, store, err);
}

// ------------------------------------------------------------ homomorphic addition
// Whether an input of block_add is the stream its caller expects (per-block policy, n values,
// this bitshuffle flag, exactly `cap` bytes); sets *payload.  Every thread reads the same 24
// bytes, so the answer is uniform over the thread block.
__device__ __forceinline__ bool pb_header_ok(const u8* in, long long cap, long long n, int bitshuffle, u32* payload) {
    const long long ntiles = n_tiles(n), nb = (n + 31) / 32;
    if (cap < HEADER_SIZE) return false;
    u64 hn = 0;
    for (int i = 0; i < 8; ++i) hn |= (u64)in[8 + i] << (8 * i);
    *payload = *(const u32*)(in + 20);
    return in[0] == 'V' && in[1] == 'Z' && in[2] == 'B' && in[3] == 'K' && in[4] == 1 && in[5] == 1 &&
           in[6] == (bitshuffle ? 1 : 0) && in[7] == 0 && hn == (u64)n && *(const u32*)(in + 16) == (u32)ntiles &&
           HEADER_SIZE + 4 * ntiles + nb + (long long)*payload == cap;
}

// out = a + b on the integer symbols, block by block: decode tile i of a into registers, decode
// b's tile onto it (AddInto: a sum that leaves int32 by the CPU's rule |s| >= 2^31 - 1 sets error
// bit 64; one tile in registers, 72 rather than 106 of them on sm_90, so 3 CTAs per SM), re-encode
// and place the tile by decoupled look-back.  One kernel; `out` must not
// overlap a or b (a tile's new offset can pass input bytes other CTAs still read), so the
// in-place form writes a scratch stream and copies it back (copy_sized).  On any error the
// CTA still publishes its tile (as zeros) so no successor waits forever; the host raises.
extern "C" __global__ void __launch_bounds__(256, 3) block_add(
    const u8* __restrict__ a, long long cap_a, const u8* __restrict__ b, long long cap_b, long long n, int bitshuffle,
    u8* __restrict__ out, u64* status, u32* tile_counter, u64* out_size, int* err) {
    __shared__ u32 s_tile;
    if (threadIdx.x == 0) s_tile = atomicAdd(tile_counter, 1u);
    __syncthreads();
    const u32 tile = s_tile;
    u32 pa = 0, pb = 0;
    bool ok = pb_header_ok(a, cap_a, n, bitshuffle, &pa) && pb_header_ok(b, cap_b, n, bitshuffle, &pb);
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

// ============================================================ collectives' float codecs
// visemz/collectives/gpu.py: the error-bounded codec fused with the per-block encoder, and the
// lossless exponent coder, on fp32, fp16 and bf16 bit patterns.  Bytes equal codecs.py's.

// A float format by its bit pattern: `value` widens it exactly to float; `from_double` narrows a
// float64 the way codecs._from_float64 does (NumPy astype: round to nearest even; bf16 through
// float32, then the same integer rounding the NumPy code applies to the float32 bits).
struct F32 {
    typedef u32 bits;
    enum { EBITS = 8, MBITS = 23 };
    __device__ static __forceinline__ float value(u32 b) { return __uint_as_float(b); }
    __device__ static __forceinline__ u32 from_double(double v) { return __float_as_uint(__double2float_rn(v)); }
};
struct F16 {
    typedef unsigned short bits;
    enum { EBITS = 5, MBITS = 10 };
    __device__ static __forceinline__ float value(unsigned short b) {
        float f;
        asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(b));
        return f;
    }
    __device__ static __forceinline__ unsigned short from_double(double v) {  // one rounding, like NumPy's
        unsigned short h;
        asm("cvt.rn.f16.f64 %0, %1;" : "=h"(h) : "d"(v));
        return h;
    }
};
struct BF16 {
    typedef unsigned short bits;
    enum { EBITS = 8, MBITS = 7 };
    __device__ static __forceinline__ float value(unsigned short b) { return __uint_as_float((u32)b << 16); }
    __device__ static __forceinline__ unsigned short from_double(double v) {
        u32 f = __float_as_uint(__double2float_rn(v));
        return (unsigned short)((f + 0x7FFFu + ((f >> 16) & 1u)) >> 16);
    }
};
struct F64 {  // the exact reconstruction 2 eb q (decode only)
    typedef unsigned long long bits;
    __device__ static __forceinline__ u64 from_double(double v) { return (u64)__double_as_longlong(v); }
};

// ------------------------------------------------------------ error-bounded, fused
// q = rint(float64(x) / (2 eb)): IEEE division and round-half-even, NumPy's quantize_values.
// A NaN or Inf sets bit 1 of err[0], |q| >= 2^31 - 1 sets bit 2 and raises err[1] to the largest
// such |x| (float32 bits: their order is the values' order); the value is coded as 0, so the
// stream stays well formed and the host raises when it reads the stream size.
template <class F>
struct Quantise {
    const typename F::bits* __restrict__ x;
    double two_eb;
    u64* err;
    u32 flags, worst;
    __device__ Quantise(const typename F::bits* x_, double two_eb_, u64* err_) : x(x_), two_eb(two_eb_), err(err_), flags(0), worst(0) {}
    __device__ __forceinline__ u32 operator()(long long i) {
        const float f = F::value(__ldcs(x + i));
        const u32 mag = __float_as_uint(f) & 0x7fffffffu;
        if (mag >= 0x7f800000u) { flags |= 1u; return 0; }
        const double q = rint(__ddiv_rn((double)f, two_eb));
        if (fabs(q) >= 2147483647.0) { flags |= 2u; worst = max(worst, mag); return 0; }
        return zigzag((int)q);
    }
    __device__ __forceinline__ void report(u32 lane) {
        const u32 f = __reduce_or_sync(FULL, flags), m = __reduce_max_sync(FULL, worst);
        if (lane == 0 && f) {
            atomicOr(&err[0], (u64)f);
            if (m) atomicMax(&err[1], (u64)m);
        }
    }
};

// Symbol q of value i -> 2 eb q in the output format (NumPy: q.astype(float64) * (2 eb)).
template <class F>
struct Dequantise {
    typename F::bits* __restrict__ out;
    double two_eb;
    __device__ __forceinline__ void operator()(long long i, int q) { out[i] = F::from_double(__dmul_rn((double)q, two_eb)); }
};

// Decode-dequantise of a per-block bitshuffled stream of `cap` bytes, its header checked on the
// device (error bit 128, as block_add); err gets block_decode's bits otherwise.
template <class F>
__device__ __forceinline__ void eb_decode_stream(const u8* __restrict__ in, long long cap, long long n, double two_eb,
                                                 typename F::bits* __restrict__ out, int* err) {
    u32 payload = 0;
    const bool ok = pb_header_ok(in, cap, n, 1, &payload);
    __syncthreads();  // uniform from here on; without this barrier ptxas (sm_90) spilled the tile's registers
    if (!ok) { if (threadIdx.x == 0) atomicOr(err, 128); return; }
    Dequantise<F> store{out, two_eb};
    pb_decode_values(in, n, 1, payload, store, err);
}

// ------------------------------------------------------------ lossless exponent coding
// One thread codes a group of 8 values: 3 bytes of 3-bit codes and R = 1 + MBITS bytes of
// sign+mantissa (8 values x R bits), both LSB first as NumPy's packbits(bitorder="little").
// A CTA takes a tile of 256 groups; escapes (code 7) are compacted in index order by a CTA scan
// and decoupled look-back across tiles.
#define LL_GROUP 8
#define LL_TILE (256 * LL_GROUP)

template <class F>
__device__ __forceinline__ u32 exponent_of(typename F::bits b) { return ((u32)b >> F::MBITS) & ((1u << F::EBITS) - 1u); }

// Exponent histogram: per-CTA shared counters (one atomic per distinct exponent in a warp), then global.
template <class F>
__device__ __forceinline__ void ll_histogram(const typename F::bits* __restrict__ x, long long n, u64* counts) {
    __shared__ u32 s_cnt[256];
    const u32 lane = threadIdx.x & 31;
    s_cnt[threadIdx.x] = 0;
    __syncthreads();
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long base = (long long)blockIdx.x * blockDim.x + (threadIdx.x & ~31u); base < n; base += stride) {
        const long long i = base + lane;
        const u32 e = i < n ? exponent_of<F>(__ldcs(x + i)) : 256u;  // 256: past the end
        const u32 same = __match_any_sync(FULL, e);
        if (e < 256u && lane == (u32)__ffs(same) - 1u) atomicAdd(&s_cnt[e], (u32)__popc(same));
    }
    __syncthreads();
    if (s_cnt[threadIdx.x]) atomicAdd(&counts[threadIdx.x], (u64)s_cnt[threadIdx.x]);
}

// The code of exponent e: its rank among the 7 table exponents (bytes of `top`), else 7.
__device__ __forceinline__ u32 code_of(u32 e, u64 top) {
    u32 c = 7;
#pragma unroll
    for (u32 k = 0; k < 7; ++k) if (((top >> (8 * k)) & 255u) == e && c == 7) c = k;
    return c;
}

// esc_total gets the number of escapes (the last tile's inclusive prefix), or ~0 if the look-back gave up.
template <class F>
__device__ __forceinline__ void ll_encode_tile(const typename F::bits* __restrict__ x, long long n, u64 top, u8* __restrict__ codes,
                                               u8* __restrict__ rest, int* __restrict__ esc_pos, u8* __restrict__ esc_exp,
                                               u64* status, u32* tile_counter, u64* esc_total) {
    typedef typename F::bits B;
    constexpr u32 R = 1 + F::MBITS, NW = (R + 3) / 4;  // rest bits per value; u32 words of a group's rest
    __shared__ B s_x[LL_TILE];
    __shared__ u32 s_tile;
    __shared__ u64 s_prefix;
    __shared__ u32 s_warp[WARPS][1], s_pre[WARPS][1], s_tot[1];
    const u32 lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    if (threadIdx.x == 0) s_tile = atomicAdd(tile_counter, 1u);
    __syncthreads();
    const u32 tile = s_tile;
    const long long base = (long long)tile * LL_TILE;
#pragma unroll
    for (int k = 0; k < LL_GROUP; ++k) {  // coalesced loads; each thread then takes 8 consecutive values
        const long long i = base + k * 256 + threadIdx.x;
        s_x[k * 256 + threadIdx.x] = i < n ? __ldcs(x + i) : (B)0;
    }
    __syncthreads();
    const long long first = base + LL_GROUP * threadIdx.x, g = first / LL_GROUP;
    const int m = (int)max(0ll, min((long long)LL_GROUP, n - first));  // values of this group inside n
    u32 cword = 0, esc = 0, acc[NW];
#pragma unroll
    for (u32 k = 0; k < NW; ++k) acc[k] = 0;
#pragma unroll
    for (int k = 0; k < LL_GROUP; ++k) {
        if (k >= m) break;  // padding: code 0, rest 0, no escape
        const u32 b = (u32)s_x[LL_GROUP * threadIdx.x + k];
        const u32 c = code_of(exponent_of<F>((B)b), top);
        const u32 r = ((b >> (F::MBITS + F::EBITS)) << F::MBITS) | (b & ((1u << F::MBITS) - 1u));
        cword |= c << (3 * k);
        esc |= (c == 7u ? 1u : 0u) << k;
        const u32 bit = k * R, wd = bit >> 5, sh = bit & 31;
        acc[wd] |= r << sh;
        if (sh + R > 32) acc[wd + 1] |= r >> (32 - sh);
    }
    if (m > 0) {
        const long long code_bytes = (3 * n + 7) / 8, rest_bytes = (R * n + 7) / 8;
#pragma unroll
        for (u32 k = 0; k < 3; ++k) if (3 * g + k < code_bytes) codes[3 * g + k] = (u8)(cword >> (8 * k));
#pragma unroll
        for (u32 k = 0; k < R; ++k) if ((long long)R * g + k < rest_bytes) rest[(long long)R * g + k] = (u8)(acc[k >> 2] >> (8 * (k & 3)));
    }
    // Escapes in index order: thread order is index order within the tile.
    const u32 cnt = __popc(esc), inc = warp_incl_scan(cnt, lane);
    if (lane == 31) s_warp[w][0] = inc;
    __syncthreads();
    tile_scan<1>(s_warp, s_pre, s_tot, 0, 1);
    __syncthreads();
    if (threadIdx.x == 0) {
        const u64 total = s_tot[0];
        s_prefix = look_back(status, tile, total, esc_total);
        if ((long long)tile == (n + LL_TILE - 1) / LL_TILE - 1) atomicCAS(esc_total, 0ull, s_prefix + total);
    }
    __syncthreads();
    u64 at = s_prefix + s_pre[w][0] + inc - cnt;
    for (int k = 0; k < LL_GROUP; ++k) {
        if (!((esc >> k) & 1u)) continue;
        esc_pos[at] = (int)(first + k);
        esc_exp[at] = (u8)exponent_of<F>(s_x[LL_GROUP * threadIdx.x + k]);
        ++at;
    }
}

// Codes and rest -> bit patterns, with the exponent field of escapes left 0 (ll_escapes fills it).
// cells[0] counts code-7 values; cells[1] gets bit 2 for a table exponent wider than EBITS.
template <class F>
__device__ __forceinline__ void ll_decode_tile(const u8* __restrict__ codes, const u8* __restrict__ rest, long long n, u64 top,
                                               typename F::bits* __restrict__ out, u64* cells) {
    typedef typename F::bits B;
    constexpr u32 R = 1 + F::MBITS, NW = (R + 3) / 4;
    __shared__ B s_y[LL_TILE];
    const u32 lane = threadIdx.x & 31;
    const long long base = (long long)blockIdx.x * LL_TILE;
    const long long first = base + LL_GROUP * threadIdx.x, g = first / LL_GROUP;
    const int m = (int)max(0ll, min((long long)LL_GROUP, n - first));
    u32 n_esc = 0, bad = 0;
    if (m > 0) {
        const long long code_bytes = (3 * n + 7) / 8, rest_bytes = (R * n + 7) / 8;
        u32 cword = 0, acc[NW];
#pragma unroll
        for (u32 k = 0; k < NW; ++k) acc[k] = 0;
#pragma unroll
        for (u32 k = 0; k < 3; ++k) if (3 * g + k < code_bytes) cword |= (u32)codes[3 * g + k] << (8 * k);
#pragma unroll
        for (u32 k = 0; k < R; ++k) if ((long long)R * g + k < rest_bytes) acc[k >> 2] |= (u32)rest[(long long)R * g + k] << (8 * (k & 3));
#pragma unroll
        for (int k = 0; k < LL_GROUP; ++k) {
            if (k >= m) break;
            const u32 c = (cword >> (3 * k)) & 7u;
            const u32 bit = k * R, wd = bit >> 5, sh = bit & 31;
            u32 r = acc[wd] >> sh;
            if (sh + R > 32) r |= acc[wd + 1] << (32 - sh);
            r &= (1u << R) - 1u;
            const u32 e = c < 7u ? (u32)((top >> (8 * c)) & 255u) : 0u;
            n_esc += c == 7u;
            bad |= e >> F::EBITS;
            s_y[LL_GROUP * threadIdx.x + k] = (B)(((r >> F::MBITS) << (F::EBITS + F::MBITS)) | (e << F::MBITS) | (r & ((1u << F::MBITS) - 1u)));
        }
    }
    const u32 total = __reduce_add_sync(FULL, n_esc), any_bad = __reduce_or_sync(FULL, bad);
    if (lane == 0) {
        if (total) atomicAdd(&cells[0], (u64)total);
        if (any_bad) atomicOr(&cells[1], 2ull);
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < LL_GROUP; ++k) {  // coalesced stores
        const long long i = base + k * 256 + threadIdx.x;
        if (i < n) out[i] = s_y[k * 256 + threadIdx.x];
    }
}

// Escape k (position pos[k], exponent exps[k]) -> its exponent field.  Positions must increase,
// lie inside n and carry code 7; with ll_decode_tile's count that makes the list exactly the
// code-7 positions (the NumPy decoder's check).  cells[1]: bit 1 list mismatch, bit 2 wide exponent.
template <class F>
__device__ __forceinline__ void ll_escapes(const long long* __restrict__ pos, const u8* __restrict__ exps, long long n_esc,
                                           const u8* __restrict__ codes, long long n, typename F::bits* __restrict__ out, u64* cells) {
    const long long code_bytes = (3 * n + 7) / 8;
    for (long long k = (long long)blockIdx.x * blockDim.x + threadIdx.x; k < n_esc; k += (long long)gridDim.x * blockDim.x) {
        const long long p = pos[k];
        bool ok = p >= 0 && p < n && (k == 0 || p > pos[k - 1]);
        if (ok) {
            const long long bit = 3 * p, byte = bit >> 3;
            const u32 two = (u32)codes[byte] | (byte + 1 < code_bytes ? (u32)codes[byte + 1] << 8 : 0u);
            ok = ((two >> (bit & 7)) & 7u) == 7u;
        }
        const u32 e = exps[k];
        if (!ok) atomicOr(&cells[1], 1ull);
        else if (e >> F::EBITS) atomicOr(&cells[1], 2ull);
        else out[p] = (typename F::bits)(out[p] | (e << F::MBITS));
    }
}

// extern "C" entry points per format (cupy looks kernels up by name).
#define EB_DECODE_KERNEL(F, sfx)                                                                                          \
    extern "C" __global__ void __launch_bounds__(256) eb_decode_##sfx(const u8* __restrict__ in, long long cap, long long n, \
                                                                       double two_eb, F::bits* __restrict__ out, int* err) { \
        eb_decode_stream<F>(in, cap, n, two_eb, out, err);                                                                \
    }
#define FLOAT_KERNELS(F, sfx)                                                                                             \
    extern "C" __global__ void __launch_bounds__(256, 2) eb_encode_##sfx(const F::bits* __restrict__ x, long long n,       \
        double two_eb, u8* __restrict__ out, u64* status, u32* tile_counter, u64* cells) {                               \
        Quantise<F> load(x, two_eb, cells + 1);                                                                           \
        pb_encode_values(load, n, 1, out, status, tile_counter, cells);                                                   \
    }                                                                                                                     \
    EB_DECODE_KERNEL(F, sfx)                                                                                              \
    extern "C" __global__ void __launch_bounds__(256) ll_histogram_##sfx(const F::bits* __restrict__ x, long long n, u64* counts) { \
        ll_histogram<F>(x, n, counts);                                                                                    \
    }                                                                                                                     \
    extern "C" __global__ void __launch_bounds__(256) ll_encode_##sfx(const F::bits* __restrict__ x, long long n, u64 top,  \
        u8* __restrict__ codes, u8* __restrict__ rest, int* __restrict__ esc_pos, u8* __restrict__ esc_exp, u64* status,  \
        u32* tile_counter, u64* esc_total) {                                                                              \
        ll_encode_tile<F>(x, n, top, codes, rest, esc_pos, esc_exp, status, tile_counter, esc_total);                     \
    }                                                                                                                     \
    extern "C" __global__ void __launch_bounds__(256) ll_decode_##sfx(const u8* __restrict__ codes, const u8* __restrict__ rest, \
        long long n, u64 top, F::bits* __restrict__ out, u64* cells) {                                                    \
        ll_decode_tile<F>(codes, rest, n, top, out, cells);                                                               \
    }                                                                                                                     \
    extern "C" __global__ void __launch_bounds__(256) ll_escapes_##sfx(const long long* __restrict__ pos,                  \
        const u8* __restrict__ exps, long long n_esc, const u8* __restrict__ codes, long long n, F::bits* __restrict__ out, \
        u64* cells) {                                                                                                     \
        ll_escapes<F>(pos, exps, n_esc, codes, n, out, cells);                                                            \
    }

FLOAT_KERNELS(F32, f32)
FLOAT_KERNELS(F16, f16)
FLOAT_KERNELS(BF16, bf16)
EB_DECODE_KERNEL(F64, f64)
