// Conditional rANS on the GPU: interleaved lanes, one warp per group of up to 32 lanes.
//
// These kernels write exactly the bytes of visemz/encoders/rans_reference.py; the
// constants mirror visemz/encoders/rans_layout.py and cdf_tables.py, and
// docs/FORMAT.md section 6 describes the layout.  32-bit states in [L, 256 L) with
// L = 2^23, byte-wise renormalisation, 16-bit probabilities.  In a group, symbol i is
// step i / lanes of lane i % lanes; a group's stream holds every lane's initial state
// (u32 LE), then step by step, in lane order, the bytes each lane reads (high first).

#define PRECISION 16
#define TOTAL (1u << PRECISION)
#define SLOT_MASK (TOTAL - 1u)
#define RANS_L (1u << 23)
#define RANS_LOW (RANS_L >> 8)
#define X_MAX_SHIFT 15
#define LUT_BITS 8
#define STATE_BYTES 4
#define AHEAD 8  // decoder: steps whose table data a lane loads at once, before their dependent arithmetic
#define ENC_AHEAD 16  // encoder: steps whose codes a lane loads at once (the next 16 while coding these)
#define FULL 0xffffffffu

#define ERR_STATE 1u     // an initial state outside [L, 256 L)
#define ERR_OVERRUN 2u   // a group reads past its end
#define ERR_SHORT 4u     // a group ends before its last byte
#define ERR_FINAL 8u     // a lane does not return to the initial state L

typedef unsigned char u8;
typedef unsigned int u32;
typedef unsigned long long u64;

// Per symbol, what the encoder needs of its CDF entry (the escape's when the value is outside the
// table): code[i] = (start | freq << 16, the reciprocal of freq) (freq <= 2^16 - 1: every table has an
// escape of its own), and an escape flag; totals[0] += code length in 1/256 bit, totals[1] += escapes,
// totals[2] += indexes outside 0..n_tables-1 (such a symbol is never coded).  The reciprocal is ryg's
// (rans_byte.h): with s = ceil(log2 freq), rcp = ceil(2^(s+31) / freq) and q = umulhi(x, rcp) >> (s - 1)
// equals x / freq for every state x < 2^31; freq 1 uses rcp = 2^32 - 1 (see encode_step).
extern "C" __global__ void rans_prepare(const int* __restrict__ sym, const int* __restrict__ idx, long long n,
                                        const int* __restrict__ cdf_start, const int* __restrict__ offsets,
                                        const int* __restrict__ cost, const int* __restrict__ cdf, int n_tables,
                                        uint2* __restrict__ code, u8* __restrict__ esc, u64* totals) {
    u64 bits = 0, escapes = 0, bad = 0;
    long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        int t = idx[i];
        if (t < 0 || t >= n_tables) { ++bad; code[i] = make_uint2(0u, 0u); esc[i] = 0; continue; }
        int base = cdf_start[t];
        long long last = (long long)(cdf_start[t + 1] - base) - 2;  // the escape symbol
        long long v = (long long)sym[i] - offsets[t];
        bool e = v < 0 || v >= last;
        int en = base + (int)(e ? last : v);
        const u32 start = (u32)cdf[en], freq = (u32)cdf[en + 1] - start;
        u32 rcp = 0xffffffffu;
        if (freq > 1u) {
            const u32 s = 32u - __clz(freq - 1u);
            rcp = (u32)(((1ull << (s + 31u)) + freq - 1u) / freq);
        }
        code[i] = make_uint2(start | (freq << 16), rcp);
        esc[i] = e;
        bits += (u64)cost[en];
        escapes += e;
    }
    for (int d = 16; d > 0; d >>= 1) {
        bits += __shfl_down_sync(FULL, bits, d);
        escapes += __shfl_down_sync(FULL, escapes, d);
        bad += __shfl_down_sync(FULL, bad, d);
    }
    if ((threadIdx.x & 31) == 0) {
        if (bits) atomicAdd(&totals[0], bits);
        if (escapes) atomicAdd(&totals[1], escapes);
        if (bad) atomicAdd(&totals[2], bad);
    }
}

// Exclusive prefix and total of c in {0, 1, 2} over the warp, from two ballots.
__device__ __forceinline__ void warp_bytes(u32 c, u32 lane, u32* excl, u32* total) {
    u32 b1 = __ballot_sync(FULL, c >= 1u), b2 = __ballot_sync(FULL, c == 2u);
    u32 lt = (1u << lane) - 1u;
    *excl = __popc(b1 & lt) + __popc(b2 & lt);
    *total = __popc(b1) + __popc(b2);
}

// x -> ((x / freq) << 16) + x % freq + start, by the reciprocal (rans_prepare): x < freq << 15 < 2^31
// after renormalisation.  freq 1: q = x - 1, and x + (start + 2^16 - 1) + q (2^16 - 1) = (x << 16) + start.
__device__ __forceinline__ u32 encode_step(u32 x, u32 start, u32 freq, u32 rcp) {
    const u32 q = freq > 1u ? __umulhi(x, rcp) >> (31u - __clz(freq - 1u)) : x - 1u;
    const u32 bias = freq > 1u ? start : start + TOTAL - 1u;
    return x + bias + q * (TOTAL - freq);  // mod 2^32; the exact value is a state, below 2^31
}

// The codes of steps j0, j0 - 1, ... j0 - ENC_AHEAD + 1 of lane k (freq 0: padding, the identity).
__device__ __forceinline__ void load_codes(const uint2* __restrict__ code, long long base, long long len, int lanes,
                                           u32 k, bool lane_on, int j0, uint2* dst) {
#pragma unroll
    for (int q = 0; q < ENC_AHEAD; ++q) {
        const long long li = (long long)(j0 - q) * lanes + k;
        dst[q] = make_uint2(0u, 0u);
        if (j0 - q >= 0 && lane_on && li < len) dst[q] = code[base + li];
    }
}

// One block of 32 threads per group.  Group g's scratch region is [g * stride, (g + 1) * stride),
// stride = 4 lanes + 2 group_symbols; its stream is written backwards and ends at the region's
// end; sizes[g] gets its length.  Each lane loads the codes of ENC_AHEAD steps at once, the next
// ENC_AHEAD's before coding these (they do not depend on the state), so their memory latency overlaps
// the coding; the state's own chain is renormalisation, two ballots and a multiply-high.
extern "C" __global__ void rans_encode(const uint2* __restrict__ code, long long n, int lanes, long long group_symbols,
                                       int steps, u8* __restrict__ scratch, long long stride,
                                       u32* __restrict__ sizes) {
    const u32 k = threadIdx.x;
    const long long base = (long long)blockIdx.x * group_symbols;
    const long long len = min(group_symbols, n - base);
    const bool lane_on = (int)k < lanes;
    u8* out = scratch + (long long)blockIdx.x * stride;
    long long pos = stride;
    u32 x = RANS_L;
    uint2 next[ENC_AHEAD];
    load_codes(code, base, len, lanes, k, lane_on, steps - 1, next);
    for (int j0 = steps - 1; j0 >= 0; j0 -= ENC_AHEAD) {
        uint2 cur[ENC_AHEAD];
#pragma unroll
        for (int q = 0; q < ENC_AHEAD; ++q) cur[q] = next[q];
        if (j0 - ENC_AHEAD >= 0) load_codes(code, base, len, lanes, k, lane_on, j0 - ENC_AHEAD, next);
#pragma unroll
        for (int q = 0; q < ENC_AHEAD; ++q) {
            if (j0 - q < 0) break;  // the same for every lane
            const u32 freq = cur[q].x >> 16;
            const u32 x_max = freq << X_MAX_SHIFT;
            const u32 c = freq ? (u32)(x >= x_max) + (u32)((x >> 8) >= x_max) : 0u;
            u32 excl, total;
            warp_bytes(c, k, &excl, &total);
            pos -= total;
            if (c == 2u) { out[pos + excl] = (u8)(x >> 8); out[pos + excl + 1] = (u8)x; }
            else if (c == 1u) out[pos + excl] = (u8)x;
            if (freq) x = encode_step(x >> (8u * c), cur[q].x & 0xffffu, freq, cur[q].y);
        }
    }
    pos -= STATE_BYTES * lanes;
    if (lane_on)
        for (int b = 0; b < STATE_BYTES; ++b) out[pos + STATE_BYTES * k + b] = (u8)(x >> (8 * b));
    if (k == 0) sizes[blockIdx.x] = (u32)(stride - pos);
}

// Copies each group's stream (the tail of its scratch region) to out at the sum of the earlier groups' sizes:
// ends[g] when given (the host's scan, for streams of many groups), else the sum each block adds up itself
// (a Kodak image's few groups: no scan launch, no host work; the work grows with the square of the groups).
extern "C" __global__ void rans_gather(const u8* __restrict__ scratch, long long stride, const u32* __restrict__ sizes,
                                       const long long* __restrict__ ends, u8* __restrict__ out) {
    __shared__ unsigned long long dst;
    const long long size = sizes[blockIdx.x];
    if (ends != nullptr) {
        if (threadIdx.x == 0) dst = (unsigned long long)(ends[blockIdx.x] - size);
    } else {
        if (threadIdx.x == 0) dst = 0;
        __syncthreads();
        unsigned long long part = 0;
        for (unsigned g = threadIdx.x; g < blockIdx.x; g += blockDim.x) part += sizes[g];
        if (part) atomicAdd(&dst, part);
    }
    __syncthreads();
    const u8* src = scratch + (long long)blockIdx.x * stride + stride - size;
    for (long long i = threadIdx.x; i < size; i += blockDim.x) out[dst + i] = src[i];
}

// The decoder's table indexes made safe to read tables with (a bad one, outside 0..n_tables-1, becomes 0) and
// the bad ones counted into *bad: one launch instead of a comparison, a select and a count.
extern "C" __global__ void rans_safe_indexes(const int* __restrict__ idx, long long n, int n_tables,
                                             int* __restrict__ safe, unsigned long long* bad) {
    unsigned long long count = 0;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        const int t = idx[i];
        const bool out = (unsigned)t >= (unsigned)n_tables;  // a negative index is >= 2^31 as unsigned
        safe[i] = out ? 0 : t;
        count += out;
    }
    for (int d = 16; d > 0; d >>= 1) count += __shfl_down_sync(FULL, count, d);
    if ((threadIdx.x & 31) == 0 && count) atomicAdd(bad, count);
}

// One block of 32 threads per group: each symbol's CDF entry into entry_out; error bits
// (ERR_*) into err.  idx must hold valid table indexes (the host checks them).
extern "C" __global__ void rans_decode(const u8* __restrict__ buf, const long long* __restrict__ starts,
                                       const long long* __restrict__ sizes, const int* __restrict__ idx, long long n,
                                       int lanes, long long group_symbols, int steps, const int* __restrict__ cdf,
                                       const int* __restrict__ cdf_start, const int* __restrict__ lut,
                                       int* __restrict__ entry_out, u32* err) {
    const u32 k = threadIdx.x;
    const long long base = (long long)blockIdx.x * group_symbols;
    const long long len = min(group_symbols, n - base);
    const bool lane_on = (int)k < lanes;
    long long pos = starts[blockIdx.x];
    const long long end = pos + sizes[blockIdx.x];
    u32 x = RANS_L;
    if (lane_on) {
        const u8* s = buf + pos + STATE_BYTES * k;
        x = (u32)s[0] | ((u32)s[1] << 8) | ((u32)s[2] << 16) | ((u32)s[3] << 24);
    }
    if (__any_sync(FULL, x < RANS_L || x >= (RANS_L << 8))) {
        if (k == 0) atomicOr(err, ERR_STATE);
        return;
    }
    pos += STATE_BYTES * lanes;
    for (int j0 = 0; j0 < steps; j0 += AHEAD) {
        int table[AHEAD], first[AHEAD];  // the next AHEAD steps' tables and their CDFs' positions
#pragma unroll
        for (int q = 0; q < AHEAD; ++q) {
            const long long li = (long long)(j0 + q) * lanes + k;
            table[q] = -1;  // padding: the identity symbol
            first[q] = 0;
            if (j0 + q < steps && lane_on && li < len) {
                table[q] = idx[base + li];
                first[q] = cdf_start[table[q]];
            }
        }
#pragma unroll
        for (int q = 0; q < AHEAD; ++q) {
            if (j0 + q >= steps) break;  // the same for every lane
            const u32 slot = x & SLOT_MASK;
            u32 lo = 0, f = TOTAL;
            if (table[q] >= 0) {
                const int b = first[q];
                int s = lut[(table[q] << LUT_BITS) + (slot >> (PRECISION - LUT_BITS))];
                while ((u32)cdf[b + s + 1] <= slot) ++s;  // stops: the table's last entry is 2^16
                lo = (u32)cdf[b + s];
                f = (u32)cdf[b + s + 1] - lo;
                entry_out[base + (long long)(j0 + q) * lanes + k] = b + s;
            }
            x = f * (x >> PRECISION) + slot - lo;
            const u32 c = (u32)(x < RANS_L) + (u32)(x < RANS_LOW);
            u32 excl, total;
            warp_bytes(c, k, &excl, &total);
            if (pos + total > end) {  // the same for every lane of the warp
                if (k == 0) atomicOr(err, ERR_OVERRUN);
                return;
            }
            if (c >= 1u) x = (x << 8) | buf[pos + excl];
            if (c == 2u) x = (x << 8) | buf[pos + excl + 1];
            pos += total;
        }
    }
    if (k == 0 && pos != end) atomicOr(err, ERR_SHORT);
    if (lane_on && x != RANS_L) atomicOr(err, ERR_FINAL);
}

// CDF entries -> values; esc[i] flags the escape symbol; count[0] += escapes.
extern "C" __global__ void rans_values(const int* __restrict__ entry, const int* __restrict__ idx, long long n,
                                       const int* __restrict__ cdf_start, const int* __restrict__ offsets,
                                       int* __restrict__ out, u8* __restrict__ esc, u64* count) {
    u64 escapes = 0;
    long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const int t = idx[i];
        const int s = entry[i] - cdf_start[t];
        const bool e = entry[i] == cdf_start[t + 1] - 2;
        out[i] = offsets[t] + s;
        esc[i] = e;
        escapes += e;
    }
    for (int d = 16; d > 0; d >>= 1) escapes += __shfl_down_sync(FULL, escapes, d);
    if ((threadIdx.x & 31) == 0 && escapes) atomicAdd(count, escapes);
}

// The conditional coder's table indexes from float64 scales (encoders/scale_indexes.py): idx[i] = the number
// of thresholds (the scale table but its last entry, ascending) below s[i], CompressAI's build_indexes;
// near[i] = whether s (1 - tol) and s (1 + tol), given as lo_f = 1 - tol and hi_f = 1 + tol, get different
// indexes (the position is listed); counts[0] += non-finite scales, counts[1] += listed positions.  One pass
// instead of three searchsorted calls, a comparison and a finiteness check, each its own launch.
__device__ __forceinline__ int count_below(const double* __restrict__ thr, int m, double v) {
    int lo = 0, hi = m;
    while (lo < hi) {
        const int mid = (lo + hi) >> 1;
        if (thr[mid] < v) lo = mid + 1; else hi = mid;
    }
    return lo;
}

extern "C" __global__ void scale_index(const double* __restrict__ s, long long n, const double* __restrict__ thr, int m,
                                       double lo_f, double hi_f, int* __restrict__ idx, u8* __restrict__ near,
                                       u64* counts) {
    u64 nonfinite = 0, listed = 0;
    long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const double v = s[i];
        idx[i] = count_below(thr, m, v);
        const bool nr = count_below(thr, m, v * lo_f) != count_below(thr, m, v * hi_f);
        near[i] = nr;
        listed += nr;
        nonfinite += !isfinite(v);
    }
    for (int d = 16; d > 0; d >>= 1) {
        nonfinite += __shfl_down_sync(FULL, nonfinite, d);
        listed += __shfl_down_sync(FULL, listed, d);
    }
    if ((threadIdx.x & 31) == 0) {
        if (nonfinite) atomicAdd(&counts[0], nonfinite);
        if (listed) atomicAdd(&counts[1], listed);
    }
}
