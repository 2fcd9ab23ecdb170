// The float codecs on the GPU (launched by visemz/floats/gpu.py): the
// error-bounded codec fused with the block encoder's per-block body, and the lossless exponent
// coder, on fp32, fp16 and bf16 bit patterns.  Bytes equal visemz/floats/error_bounded.py's and lossless.py's.
// Compiled with visemz/encoders/cuda on the include path (visemz.encoders.gpu.kernel).
#include "block.cuh"

// A float format by its bit pattern: `value` widens it exactly to float; `from_double` narrows a
// float64 the way dtypes.from_float64 does (clamped to the format's finite range, then NumPy astype:
// round to nearest even; bf16 through float32, then the same integer rounding the NumPy code applies
// to the float32 bits).  fmin/fmax keep a NaN's other operand, as NumPy's clip does not; no step is NaN.
__device__ __forceinline__ double clamp_finite(double v, double top) { return fmin(fmax(v, -top), top); }
struct F32 {
    typedef u32 bits;
    enum { EBITS = 8, MBITS = 23 };
    __device__ static __forceinline__ float value(u32 b) { return __uint_as_float(b); }
    __device__ static __forceinline__ u32 from_double(double v) {
        return __float_as_uint(__double2float_rn(clamp_finite(v, 3.4028234663852886e38)));
    }
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
        v = clamp_finite(v, 65504.0);
        asm("cvt.rn.f16.f64 %0, %1;" : "=h"(h) : "d"(v));
        return h;
    }
};
struct BF16 {
    typedef unsigned short bits;
    enum { EBITS = 8, MBITS = 7 };
    __device__ static __forceinline__ float value(unsigned short b) { return __uint_as_float((u32)b << 16); }
    __device__ static __forceinline__ unsigned short from_double(double v) {
        u32 f = __float_as_uint(__double2float_rn(clamp_finite(v, 3.3895313892515355e38)));
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
// such |x| (float32 bits: their order is the values' order); the value's step is taken as 0, so
// the stream stays well formed, and the host raises when it reads the stream size (so the bytes
// of a stream with any of these bits are never used).
//
// Prediction (prediction.Prediction; PRED is the header's predictor code): 0 none, the symbol is
// q_i; 1 1-D Lorenzo, q_i - q_{i-1}; 2 2-D Lorenzo over rows of `row` values,
// q[y][x] - q[y-1][x] - q[y][x-1] + q[y-1][x-1], zeros outside the array.  The residual is
// computed in 64 bits: one that leaves int32 (|r| >= 2^31 - 1) sets bit 4 and is coded as 0.
#define EB_NONFINITE 1u
#define EB_TOO_MANY_STEPS 2u
#define EB_RESIDUAL_RANGE 4u

// The step of one value's bit pattern (0 for a value without one, flagged as above).
template <class F>
__device__ __forceinline__ int eb_step(typename F::bits b, double two_eb, u32& flags, u32& worst) {
    const float f = F::value(b);
    const u32 mag = __float_as_uint(f) & 0x7fffffffu;
    if (mag >= 0x7f800000u) { flags |= EB_NONFINITE; return 0; }
    const double q = rint(__ddiv_rn((double)f, two_eb));
    if (fabs(q) >= 2147483647.0) { flags |= EB_TOO_MANY_STEPS; worst = max(worst, mag); return 0; }
    return (int)q;
}

// The step of value i - 1 for every lane, from the steps `v` of this warp's blocks (lane `lane`
// of block j holds value first + 32 j + lane): lane - 1's step, for lane 0 lane 31's of block
// j - 1, and for lane 0 of block 0 `before` (the step of the value before the warp's first).
__device__ __forceinline__ int previous_step(const u32 (&v)[PB_PER_WARP], int j, u32 before, u32 lane) {
    const int up = __shfl_up_sync(FULL, (int)v[j], 1);
    const int last = __shfl_sync(FULL, (int)(j > 0 ? v[j > 0 ? j - 1 : 0] : before), 31);
    return lane ? up : last;
}

// One tile of eb_encode_*: quantise, predict, then the block encoder's tile body.
//
// Every load is issued first, in a loop that does nothing else, so a thread has all 32 of its
// values (and for PRED 2 the 32 values a row above) in flight at once; quantising between loads,
// as a per-value functor did, made each warp wait for one memory round trip per block.  Steps
// are then computed in place, and the left neighbour's step comes from the neighbouring lane by
// shuffle instead of being loaded and quantised again; only the value before the warp's first
// (and, for PRED 2, the row above) is quantised twice, without flags: its own thread flags it.
template <class F, int PRED>
__device__ __forceinline__ void eb_encode_tile(const typename F::bits* __restrict__ x, long long n, double two_eb, long long row,
                                               u8* __restrict__ out, u64* status, u32* tile_counter, u64* cells) {
    typedef typename F::bits B;
    __shared__ u32 s_tile;
    const u32 lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    if (threadIdx.x == 0) s_tile = atomicAdd(tile_counter, 1u);
    __syncthreads();
    const u32 tile = s_tile;
    const long long first = ((long long)tile * (WARPS * PB_PER_WARP) + w * PB_PER_WARP) * 32;  // the warp's first value
    u32 u[PB_PER_WARP];                           // bit patterns, then steps, then symbols (0 past n throughout)
    u32 above[PRED == 2 ? PB_PER_WARP : 1];       // PRED 2: the same for the values a row above (0 where none)
    u32 before = 0, before_above = 0;             // the value before the warp's first, and the one above it
#pragma unroll
    for (int j = 0; j < PB_PER_WARP; ++j) {
        const long long i = first + 32 * j + lane;
        // PRED 2 reads rows above again (in this tile or the previous): keep x cached; else stream it
        u[j] = i < n ? (u32)(PRED == 2 ? __ldg(x + i) : __ldcs(x + i)) : 0u;
        if constexpr (PRED == 2) above[j] = i < n && i >= row ? (u32)__ldg(x + i - row) : 0u;
    }
    // Lane 31 loads the value before the warp's first (previous_step reads it there), and only while
    // that value exists: a warp past the end codes nothing but must not read beyond x.
    const bool has_before = PRED != 0 && lane == 31 && first > 0 && first <= n;
    if (has_before) before = (u32)__ldg(x + first - 1);
    if (PRED == 2 && has_before && first > row) before_above = (u32)__ldg(x + first - 1 - row);
    u32 flags = 0, worst = 0, quiet = 0, quiet_worst = 0;  // quiet: neighbours' flags, dropped
#pragma unroll
    for (int j = 0; j < PB_PER_WARP; ++j) {
        u[j] = (u32)eb_step<F>((B)u[j], two_eb, flags, worst);
        if constexpr (PRED == 2) above[j] = (u32)eb_step<F>((B)above[j], two_eb, quiet, quiet_worst);
    }
    if (PRED != 0) before = (u32)eb_step<F>((B)before, two_eb, quiet, quiet_worst);
    if (PRED == 2) before_above = (u32)eb_step<F>((B)before_above, two_eb, quiet, quiet_worst);
    // Residuals in place, last block first: block j - 1 still holds steps when block j needs them.
#pragma unroll
    for (int j = PB_PER_WARP - 1; j >= 0; --j) {
        const long long i = first + 32 * j + lane;
        long long r = (int)u[j];
        if constexpr (PRED != 0) {
            const int left = previous_step(u, j, before, lane);  // i = 0 takes before = 0
            if constexpr (PRED == 1) {
                r -= left;
            } else {
                const int above_left = previous_step(above, j, before_above, lane);
                if (i % row) r += above_left - (long long)left;  // not the first column
                r -= (int)above[j];
            }
            if (i >= n) r = 0;
            if (r >= 2147483647ll || r <= -2147483647ll) { flags |= EB_RESIDUAL_RANGE; r = 0; }
        }
        u[j] = zigzag((int)r);
    }
    const u32 f = __reduce_or_sync(FULL, flags), m = __reduce_max_sync(FULL, worst);
    if (lane == 0 && f) {
        atomicOr(&cells[1], (u64)f);
        if (m) atomicMax(&cells[2], (u64)m);
    }
    pb_encode_tile(u, n, 1, out, status, cells, tile);
}

// Symbol q of value i -> 2 eb q in the output format (NumPy: q.astype(float64) * (2 eb)).
template <class F>
struct Dequantise {
    typename F::bits* __restrict__ out;
    double two_eb;
    __device__ __forceinline__ void operator()(long long i, int q) { out[i] = F::from_double(__dmul_rn((double)q, two_eb)); }
};

// The integers of a predicted stream, widened for the prefix sums that undo the prediction.
struct Widen {
    long long* __restrict__ out;
    __device__ __forceinline__ void operator()(long long i, int r) { out[i] = r; }
};

// Decode a per-block bitshuffled stream of `cap` bytes through `store`, its header checked on the
// device (error bit 128, as block_add); err gets block_decode's bits otherwise.
template <class Store>
__device__ __forceinline__ void eb_decode_stream(const u8* __restrict__ in, long long cap, long long n, Store& store, int* err) {
    u32 payload = 0;
    const bool ok = pb_header_ok(in, cap, n, 1, &payload);
    __syncthreads();  // uniform from here on; without this barrier ptxas (sm_90) spilled the tile's registers
    if (!ok) { if (threadIdx.x == 0) atomicOr(err, 128); return; }
    pb_decode_values(in, n, 1, payload, store, err);
}

// Steps (the prefix sums of a predicted stream's residuals) -> 2 eb q in the output format; a
// step that leaves int32 by the CPU's rule (|q| >= 2^31 - 1) sets error bit 256 and is written as 0.
template <class F>
__device__ __forceinline__ void eb_dequantise(const long long* __restrict__ q, long long n, double two_eb,
                                              typename F::bits* __restrict__ out, int* err) {
    bool over = false;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        long long v = q[i];
        if (v >= 2147483647ll || v <= -2147483647ll) { over = true; v = 0; }
        out[i] = F::from_double(__dmul_rn((double)v, two_eb));
    }
    if (__any_sync(FULL, over) && (threadIdx.x & 31) == 0) atomicOr(err, 256);
}

// 1-D Lorenzo decoding in one pass (predictor 1; the steps are the prefix sums of the residuals):
// decode the tile's residuals into registers, add them up (the tile's aggregate), find the sum
// of all earlier tiles by decoupled look-back (tiles in start order, as the encoder's), then per
// block an inclusive warp scan in 64 bits on top of the running sum, and dequantise.  This
// replaces widening to int64, cupy's scan and a dequantising pass: about 2.4 GB of traffic for
// 64 Mi values against the stream read and the output written once.  Sums travel through the
// look-back's 62-bit status words modulo 2^62 and are sign-extended: exact while the true sums
// stay below 2^61, and the first step that leaves int32 is always computed exactly (every
// earlier step, hence its tile's prefix, is small), so an overflow is never missed.  cells[0]
// gets ~0 if the look-back gave up, cells[1] (as int) the decoder's error bits; a bad tile
// still publishes (a zero aggregate) so no successor waits forever.
template <class F>
__device__ __forceinline__ void eb_decode_lorenzo(const u8* __restrict__ in, long long cap, long long n, double two_eb,
                                                  typename F::bits* __restrict__ out, u64* status, u32* tile_counter,
                                                  u64* cells) {
    __shared__ u32 s_tile;
    __shared__ long long s_warp[WARPS], s_base;
    const u32 lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    int* err = (int*)(cells + 1);
    if (threadIdx.x == 0) s_tile = atomicAdd(tile_counter, 1u);
    __syncthreads();
    const u32 tile = s_tile;
    u32 payload = 0;
    bool ok = pb_header_ok(in, cap, n, 1, &payload);  // uniform over the thread block
    if (!ok && threadIdx.x == 0) atomicOr(err, 128);
    u32 u[PB_PER_WARP];
    Assign put;
    if (ok) ok = pb_decode_tile(in, n, 1, payload, tile, u, err, put);
    long long sum = 0;
#pragma unroll
    for (int j = 0; j < PB_PER_WARP; ++j) {
        if (!ok) u[j] = 0;
        sum += unzigzag(u[j]);
    }
#pragma unroll
    for (int d = 16; d; d >>= 1) sum += __shfl_xor_sync(FULL, sum, d);
    if (lane == 0) s_warp[w] = sum;
    __syncthreads();
    if (threadIdx.x == 0) {
        long long acc = 0;
        for (int k = 0; k < WARPS; ++k) {  // the warps' exclusive prefixes within the tile
            const long long v = s_warp[k];
            s_warp[k] = acc;
            acc += v;
        }
        const u64 before = look_back(status, tile, (u64)acc & ST_MASK, cells);
        s_base = (long long)(before << 2) >> 2;  // sign-extend the 62-bit sum
    }
    __syncthreads();
    long long carry = s_base + s_warp[w];
    const long long first = ((long long)tile * (WARPS * PB_PER_WARP) + w * PB_PER_WARP) * 32;
    bool over = false;
#pragma unroll
    for (int j = 0; j < PB_PER_WARP; ++j) {
        long long v = unzigzag(u[j]);  // 0 past n
#pragma unroll
        for (int d = 1; d < 32; d <<= 1) {
            const long long y = __shfl_up_sync(FULL, v, d);
            if (lane >= (u32)d) v += y;
        }
        long long q = carry + v;
        carry += __shfl_sync(FULL, v, 31);
        const long long i = first + 32 * j + lane;
        if (i < n) {
            if (q >= 2147483647ll || q <= -2147483647ll) { over = true; q = 0; }
            out[i] = F::from_double(__dmul_rn((double)q, two_eb));
        }
    }
    if (__any_sync(FULL, over) && lane == 0) atomicOr(err, 256);
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
    const u32 q[1] = {(u32)__popc(esc)};
    u32 ex[1];
    tile_exclusive<1, 0, 1>(q, ex, s_warp, s_pre, s_tot);
    if (threadIdx.x == 0) {
        const u64 total = s_tot[0];
        s_prefix = look_back(status, tile, total, esc_total);
        if ((long long)tile == (n + LL_TILE - 1) / LL_TILE - 1) atomicCAS(esc_total, 0ull, s_prefix + total);
    }
    __syncthreads();
    u64 at = s_prefix + ex[0];
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
        Dequantise<F> store{out, two_eb};                                                                                 \
        eb_decode_stream(in, cap, n, store, err);                                                                         \
    }                                                                                                                     \
    extern "C" __global__ void __launch_bounds__(256) eb_decode_lorenzo_##sfx(const u8* __restrict__ in, long long cap,  \
        long long n, double two_eb, F::bits* __restrict__ out, u64* status, u32* tile_counter, u64* cells) {             \
        eb_decode_lorenzo<F>(in, cap, n, two_eb, out, status, tile_counter, cells);                                       \
    }                                                                                                                     \
    extern "C" __global__ void __launch_bounds__(256) eb_dequantise_##sfx(const long long* __restrict__ q, long long n,   \
                                                                           double two_eb, F::bits* __restrict__ out, int* err) { \
        eb_dequantise<F>(q, n, two_eb, out, err);                                                                         \
    }
// One encoder per predictor (eb_encode_f32_lorenzo, ...): the 2-D one holds a second tile of
// steps, which would cost the others occupancy if they shared its register allocation.
#define EB_ENCODE_KERNEL(F, sfx, P, pname)                                                                                \
    extern "C" __global__ void __launch_bounds__(256, P == 2 ? 2 : 3) eb_encode_##sfx##_##pname(const F::bits* __restrict__ x,         \
        long long n, double two_eb, long long row, u8* __restrict__ out, u64* status, u32* tile_counter, u64* cells) {    \
        eb_encode_tile<F, P>(x, n, two_eb, row, out, status, tile_counter, cells);                                        \
    }
#define FLOAT_KERNELS(F, sfx)                                                                                             \
    EB_ENCODE_KERNEL(F, sfx, 0, none)                                                                                     \
    EB_ENCODE_KERNEL(F, sfx, 1, lorenzo)                                                                                  \
    EB_ENCODE_KERNEL(F, sfx, 2, lorenzo2d)                                                                                \
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

// A predicted stream's residuals as int64 (the prefix sums that undo the prediction run on them).
extern "C" __global__ void __launch_bounds__(256) eb_residuals(const u8* __restrict__ in, long long cap, long long n,
                                                               long long* __restrict__ out, int* err) {
    Widen store{out};
    eb_decode_stream(in, cap, n, store, err);
}
