// The block encoder's device-side building blocks, shared by its kernels (block.cu) and by the
// float codecs' kernels (visemz/floats/cuda/floats.cu), which include this file.
//
// The bytes are those of visemz/encoders/reference.py; the layout constants mirror
// visemz/encoders/layout.py and docs/FORMAT.md.  One thread block of 256 threads (8 warps)
// handles one tile of 8192 values; every value a warp needs stays in its registers from load
// to store.  Tiles find their output offsets by single-pass decoupled look-back.
#pragma once

#define FULL 0xffffffffu
#define TILE 8192
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

__device__ __forceinline__ u32 warp_incl_scan(u32 x, u32 lane) {
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
        u32 y = __shfl_up_sync(FULL, x, d);
        if (lane >= (u32)d) x += y;
    }
    return x;
}

__device__ __forceinline__ long long n_tiles(long long n) { return (n + TILE - 1) / TILE; }

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

// Tile-wide exclusive prefix sums of per-lane quantities q[Q0..Q1): a scan in each warp, the
// warps' totals through shared memory (tile_scan), then ex[k] = the sum of q[k] over the tile's
// earlier lanes, and s_tot[k] = the tile's total.  Every thread of the block calls it (it holds
// two barriers); entries of q and ex outside [Q0, Q1) are left alone.
template <int S, int Q0, int Q1>
__device__ __forceinline__ void tile_exclusive(const u32 (&q)[S], u32 (&ex)[S], u32 (*s_warp)[S], u32 (*s_pre)[S], u32* s_tot) {
    const u32 lane = threadIdx.x & 31, w = threadIdx.x >> 5;
#pragma unroll
    for (int k = Q0; k < Q1; ++k) {
        const u32 inc = warp_incl_scan(q[k], lane);
        ex[k] = inc - q[k];
        if (lane == 31) s_warp[w][k] = inc;
    }
    __syncthreads();
    tile_scan<S>(s_warp, s_pre, s_tot, Q0, Q1);
    __syncthreads();
#pragma unroll
    for (int k = Q0; k < Q1; ++k) ex[k] += s_pre[w][k];
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
    const u32 q[1] = {my_w};
    u32 ex[1];
    tile_exclusive<1, 0, 1>(q, ex, s_warp, s_pre, s_tot);
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
    if (first_block + lane < nb) out[meta_off + first_block + lane] = (u8)my_w;
    u8* base = out + pay_off + s_prefix;
#pragma unroll
    for (int j = 0; j < PB_PER_WARP; ++j) {
        u32 width = __shfl_sync(FULL, my_w, j);
        if (!width) continue;
        u32 off = 4 * __shfl_sync(FULL, ex[0], j);
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
// `put` hands over each decoded value: Assign stores it; block_add's AddInto adds it to the
// symbol already there (it decodes b onto a's tile instead of holding two tiles).
//
// The tile's payload bytes are contiguous, so the thread block first copies them into shared
// memory with aligned 16-byte loads, all independent (a handful per thread), and the warps then
// read their words from there.  Reading each block's words from global memory inside the
// per-block loop made every warp wait for 32 dependent load round trips per tile (the loads sit
// behind the width shuffles and branches, so the compiler cannot batch them), which is what
// bounded decoding by latency rather than bandwidth.  The words are not 4-byte aligned in
// general (the width bytes before the payload have any length), so a word is a funnel shift of
// two aligned shared-memory words.
struct Assign {
    __device__ __forceinline__ void operator()(u32& u, u32 v) { u = v; }
};

// A tile's payload is at most TILE words (256 blocks of up to 32); the staging buffer adds one
// 16-byte chunk for the alignment of its start and one for the word after the last that the
// funnel shift reads.  It is declared in this plain function, not in the template below, so a
// kernel that decodes with two kinds of `put` (block_add) still has one buffer, not two.
#define PAY_STAGE_CHUNKS (TILE / 4 + 2)
__device__ __forceinline__ uint4* payload_stage() {
    __shared__ uint4 s_pay[PAY_STAGE_CHUNKS];
    return s_pay;
}

// 16 bytes global -> shared memory.  On sm_80 and later through cp.async, which needs no
// registers: a thread's copies are all in flight at once, and block_add, which holds one tile in
// registers while it stages the second, does not spill.  copies_done() waits for this thread's
// copies; a barrier after it makes them visible to the thread block.
__device__ __forceinline__ void copy16_async(uint4* smem, const void* gmem) {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"((u32)__cvta_generic_to_shared(smem)), "l"(gmem) : "memory");
#else
    *smem = __ldg((const uint4*)gmem);
#endif
}
__device__ __forceinline__ void copies_done() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_all;\n" ::: "memory");
#endif
}

// The stream's last, partial 16-byte chunk, byte by byte: nothing past `stop` is read.
__device__ __forceinline__ uint4 last_chunk(u64 at, u64 stop) {
    u64 w0 = 0, w1 = 0;
#pragma unroll
    for (u32 k = 0; k < 16; ++k) {  // unrolled: no local-memory array
        const u64 b = at + k < stop ? *(const u8*)(at + k) : 0;
        if (k < 8) w0 |= b << (8 * k);
        else w1 |= b << (8 * (k - 8));
    }
    return make_uint4((u32)w0, (u32)(w0 >> 32), (u32)w1, (u32)(w1 >> 32));
}

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
    const long long first_block = (long long)tile * (WARPS * PB_PER_WARP) + w * PB_PER_WARP;
    u32 my_w = first_block + lane < nb ? in[meta_off + first_block + lane] : 0;  // issued before the table read's wait
    const u32 start = tile ? table[tile - 1] : 0, end = table[tile];
    if (start > end || end > payload || (tile == ntiles - 1 && end != payload)) { if (threadIdx.x == 0) atomicOr(err, 1); return false; }
    // Stage [start, end) of the payload; a tile claiming more than TILE words is refused below
    // (error bit 4, its widths cannot add up to it) and stages nothing.
    const u64 g0 = (u64)(pay + start);
    const u64 lo = g0 & ~(u64)15, hi = ((u64)(pay + end) + 15) & ~(u64)15;
    const u64 stop = (u64)(pay + payload);  // the stream's end (pb_header_ok): nothing past it is read
    const u32 chunks = end - start <= 4u * TILE ? (u32)((hi - lo) >> 4) : 0u;
    uint4* s_pay = payload_stage();
    const bool partial = chunks && lo + 16ull * chunks > stop;  // the stream's last chunk runs past its end
    const u32 full = chunks - (partial ? 1u : 0u);
    for (u32 c = threadIdx.x; c < full; c += WARPS * 32) copy16_async(&s_pay[c], (const void*)(lo + 16ull * c));
    if (partial && threadIdx.x == 0) s_pay[full] = last_chunk(lo + 16ull * full, stop);
    copies_done();
    if (my_w > 32) { atomicOr(err, 2); my_w = 32; }
    const u32 q[1] = {my_w};
    u32 ex[1];
    tile_exclusive<1, 0, 1>(q, ex, s_warp, s_pre, s_tot);  // its barriers also publish the staged payload
    if (4ull * s_tot[0] != end - start) { if (threadIdx.x == 0) atomicOr(err, 4); return false; }
    const u32* staged = (const u32*)s_pay;
    const u32 head = (u32)(g0 - lo), shift = 8 * (head & 3);  // every word of the tile has the same misalignment
#pragma unroll
    for (int j = 0; j < PB_PER_WARP; ++j) {
        u32 width = __shfl_sync(FULL, my_w, j);  // 0 for blocks past the end
        u32 val = 0;
        if (width) {
            u32 off = 4 * __shfl_sync(FULL, ex[0], j);
            u32 word = 0;
            if (lane < width) {
                const u32 k = (head + off + 4 * lane) >> 2;  // k + 1 < 4 * PAY_STAGE_CHUNKS
                word = __funnelshift_r(staged[k], staged[k + 1], shift);
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

// Whether an input of block_add or eb_decode_* is the stream its caller expects (per-block policy, n values,
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

