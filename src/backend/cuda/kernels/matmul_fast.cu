// Decode-shaped matmul for the `deterministic` and `fast` modes (not the
// canonical arithmetic; see matmul.cu for `exact`).
//
// Activations are quantized per row to int8 in blocks of 32 (quant_q8:
// scale d = amax / 127, round to nearest), and each weight "unit" of 32
// values is decoded in registers to 8 packed int8x4 words and dotted with
// __dp4a. One warp computes one weight row for up to MV_ROWS activation
// rows (weights are read once per step for all of them); lane l takes units
// l, l + 32, ... (the warp streams 32 consecutive units per iteration), then
// a fixed xor-shuffle tree. The arithmetic of one output depends only on its
// own activation row, so the kernels are batch-invariant.
//
// Unit of type:   Q4_0/Q4_1/Q5_0/Q5_1/Q8_0: one 32-block;
//                 Q4_K/Q5_K/Q6_K: one 32-value sub-block of a 256-superblock.
// Value of a unit: sum_i d_a * (A_i * isum_i) + B * s_a, where isum_0/1 are
// the integer dots of the unit's first/second 16 values, A_i the weight
// scales, B the weight minimum (Q4_1, Q5_1, Q4_K, Q5_K) and s_a = d_a * sum(q_a).

#define MV_ROWS 8

// x: (n, k) -> xq: (n, k) int8, xds: (n, k/32) float2 {d, d * sum(q)}.
// One warp per 32-block. A NaN anywhere in the block makes d NaN, so NaN
// propagates to every output of the row (like a float dot product).
extern "C" __global__ void quant_q8(const float* __restrict__ x, long long nblocks,
                                    signed char* __restrict__ xq, float2* __restrict__ xds) {
    long long blk = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    int l = threadIdx.x & 31;
    if (blk >= nblocks) return;
    float v = x[blk * 32 + l];
    float amax = fabsf(v);
    bool nan = v != v;
#pragma unroll
    for (int s = 16; s >= 1; s >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, s));
    nan = __any_sync(0xffffffffu, nan);
    float d = amax / 127.0f;
    int q = (d == 0.0f || nan) ? 0 : __float2int_rn(v / d);
    q = max(-127, min(127, q));
    int sum = q;
#pragma unroll
    for (int s = 16; s >= 1; s >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, s);
    xq[blk * 32 + l] = (signed char)q;
    if (l == 0) {
        if (nan) d = __int_as_float(0x7fc00000);
        xds[blk] = make_float2(d, d * (float)sum);
    }
}

// Adds unit u's dot products with activation rows 0..n-1 to acc.
__device__ __forceinline__ void mv_q8_dot(const int* w, float a0, float a1, float b, int u,
                                          const signed char* __restrict__ xq,
                                          const float2* __restrict__ xds, int k, int n,
                                          float* acc) {
    int nb = k / 32;
#pragma unroll
    for (int r = 0; r < MV_ROWS; r++) {
        if (r >= n) break;
        const int4* xa = (const int4*)(xq + (long long)r * k + 32 * u);
        int4 x0 = xa[0], x1 = xa[1];
        int i0 = __dp4a(w[0], x0.x, 0);
        i0 = __dp4a(w[1], x0.y, i0);
        i0 = __dp4a(w[2], x0.z, i0);
        i0 = __dp4a(w[3], x0.w, i0);
        int i1 = __dp4a(w[4], x1.x, 0);
        i1 = __dp4a(w[5], x1.y, i1);
        i1 = __dp4a(w[6], x1.z, i1);
        i1 = __dp4a(w[7], x1.w, i1);
        float2 ds = xds[(long long)r * nb + u];
        float t = fmaf(a0, (float)i0, a1 * (float)i1);
        acc[r] = fmaf(ds.x, t, fmaf(b, ds.y, acc[r]));
    }
}

// Lane l's units l, l + 32, ..., two per iteration so the loads of both
// are in flight together (decode is latency-bound on short rows).
template <int TY>
__device__ __forceinline__ void mv_q8_row(const u8* __restrict__ wr, int units,
                                          const signed char* __restrict__ xq,
                                          const float2* __restrict__ xds, int k, int n, int l,
                                          float* acc) {
    int u = l;
    for (; u + 32 < units; u += 64) {
        int w0[8], w1[8];
        float a00, a01, b0, a10, a11, b1;
        decode_unit<TY>(wr, u, w0, a00, a01, b0);
        decode_unit<TY>(wr, u + 32, w1, a10, a11, b1);
        mv_q8_dot(w0, a00, a01, b0, u, xq, xds, k, n, acc);
        mv_q8_dot(w1, a10, a11, b1, u + 32, xq, xds, k, n, acc);
    }
    if (u < units) {
        int w0[8];
        float a00, a01, b0;
        decode_unit<TY>(wr, u, w0, a00, a01, b0);
        mv_q8_dot(w0, a00, a01, b0, u, xq, xds, k, n, acc);
    }
}

// out (n, m) = x (n, k) · wᵀ with x given as quant_q8's (xq, xds).
// Block: 256 threads = 8 warps = 8 weight rows; grid (ceil(n/MV_ROWS), ceil(m/8)):
// the groups of activation rows that share a weight tile are neighbours.
extern "C" __global__ void mv_q8(const u8* __restrict__ w, int m, int k, long long row_bytes,
                                 int ty, const signed char* __restrict__ xq,
                                 const float2* __restrict__ xds, int n_all,
                                 float* __restrict__ out) {
    int row = blockIdx.y * (blockDim.x >> 5) + (threadIdx.x >> 5);
    int l = threadIdx.x & 31;
    if (row >= m) return;
    int g0 = blockIdx.x * MV_ROWS;
    int n = min(MV_ROWS, n_all - g0);
    xq += (long long)g0 * k;
    xds += (long long)g0 * (k / 32);
    out += (long long)g0 * m;
    const u8* wr = w + (long long)row * row_bytes;
    int units = k / 32;
    float acc[MV_ROWS];
#pragma unroll
    for (int r = 0; r < MV_ROWS; r++) acc[r] = 0.0f;
    // (Staging each warp's run of weights in shared memory with 16-byte
    // loads measured slower on an H100: 0.83 vs 1.05 TB/s.)
#define MV_Q8_ROW(T) mv_q8_row<T>(wr, units, xq, xds, k, n, l, acc)
    QTYPE_DISPATCH(ty, MV_Q8_ROW)
#undef MV_Q8_ROW
#pragma unroll
    for (int r = 0; r < MV_ROWS; r++) {
        if (r >= n) break;
        float v = acc[r];
#pragma unroll
        for (int st = 16; st >= 1; st >>= 1) v += __shfl_xor_sync(0xffffffffu, v, st, 32);
        if (l == 0) out[(long long)r * m + row] = v;
    }
}

// Float weights (F32, F16, BF16), f32 activations: one warp per weight row
// for up to MV_ROWS activation rows; lane l takes 8-value chunks l, l + 32,
// ... (16-byte loads of f16/bf16 weights). k is a multiple of 32.
__device__ __forceinline__ void unpack8(const u8* __restrict__ wr, int ty, int c, float* v) {
    if (ty == TY_F32) {
        const float4* p = (const float4*)(wr + (long long)c * 32);
        float4 a = p[0], b = p[1];
        v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
        v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
        return;
    }
    uint4 q = *(const uint4*)(wr + (long long)c * 16);
    u32 h[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        if (ty == TY_F16) {
            v[2 * i] = q_f16((u16)(h[i] & 0xFFFF));
            v[2 * i + 1] = q_f16((u16)(h[i] >> 16));
        } else {
            v[2 * i] = __uint_as_float(h[i] << 16);
            v[2 * i + 1] = __uint_as_float(h[i] & 0xFFFF0000u);
        }
    }
}

extern "C" __global__ void mv_float(const u8* __restrict__ w, int m, int k, int ty,
                                    const float* __restrict__ x, int n_all,
                                    float* __restrict__ out) {
    int row = blockIdx.y * (blockDim.x >> 5) + (threadIdx.x >> 5);
    int l = threadIdx.x & 31;
    if (row >= m) return;
    int g0 = blockIdx.x * MV_ROWS;
    int n = min(MV_ROWS, n_all - g0);
    x += (long long)g0 * k;
    out += (long long)g0 * m;
    const u8* wr = w + (long long)row * k * (ty == TY_F32 ? 4 : 2);
    float acc[MV_ROWS];
#pragma unroll
    for (int r = 0; r < MV_ROWS; r++) acc[r] = 0.0f;
    for (int c = l; c < k / 8; c += 32) {
        float v[8];
        unpack8(wr, ty, c, v);
#pragma unroll
        for (int r = 0; r < MV_ROWS; r++) {
            if (r >= n) break;
            const float4* xr = (const float4*)(x + (long long)r * k + 8 * c);
            float4 a = xr[0], b = xr[1];
            float s = acc[r];
            s = fmaf(v[0], a.x, s);
            s = fmaf(v[1], a.y, s);
            s = fmaf(v[2], a.z, s);
            s = fmaf(v[3], a.w, s);
            s = fmaf(v[4], b.x, s);
            s = fmaf(v[5], b.y, s);
            s = fmaf(v[6], b.z, s);
            s = fmaf(v[7], b.w, s);
            acc[r] = s;
        }
    }
#pragma unroll
    for (int r = 0; r < MV_ROWS; r++) {
        if (r >= n) break;
        float v = acc[r];
#pragma unroll
        for (int st = 16; st >= 1; st >>= 1) v += __shfl_xor_sync(0xffffffffu, v, st, 32);
        if (l == 0) out[(long long)r * m + row] = v;
    }
}

// Prefill GEMMs of `fast` mode go through cuBLAS in f16 with f32 accumulation:
// weights (m, k) dequantized to f16 (round to nearest even) for a
// tensor-core GEMM. Quantized types: one thread per 32-value unit, decoded
// in registers (decode_unit; value = A * q + B with the same roundings as
// q_dequant, no FMA) and written as four 16-byte stores. Float types: one
// thread per element.
template <int TY>
__device__ __forceinline__ void dequant_unit_f16(const u8* __restrict__ row, int u, uint4* dst) {
    int w[8];
    float a0, a1, b;
    decode_unit<TY>(row, u, w, a0, a1, b);
    u32 h[16];
#pragma unroll
    for (int i = 0; i < 8; i++) {
        float a = i < 4 ? a0 : a1;
#pragma unroll
        for (int e = 0; e < 4; e += 2) {
            float v0 = __fadd_rn(__fmul_rn(a, (float)(signed char)(w[i] >> (8 * e))), b);
            float v1 = __fadd_rn(__fmul_rn(a, (float)(signed char)(w[i] >> (8 * e + 8))), b);
            h[2 * i + e / 2] = (u32)q_to_f16(v0) | ((u32)q_to_f16(v1) << 16);
        }
    }
#pragma unroll
    for (int i = 0; i < 4; i++) dst[i] = make_uint4(h[4 * i], h[4 * i + 1], h[4 * i + 2], h[4 * i + 3]);
}

// Quantized types: block of 256 threads = 256 consecutive units, whose f16
// output is one contiguous 16 KiB run: staged in shared memory, then
// written with coalesced 16-byte stores.
extern "C" __global__ void dequant_f16(const u8* __restrict__ w, int m, int k,
                                       long long row_bytes, int ty, u16* __restrict__ out) {
    __shared__ uint4 st[256 * 4];
    long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (ty >= TY_F32) {
        if (t >= (long long)m * k) return;
        int r = (int)(t / k), e = (int)(t % k);
        out[t] = q_to_f16(q_dequant(w + (long long)r * row_bytes, e, ty));
        return;
    }
    int units = k / 32;
    long long total = (long long)m * units;
    if (t < total) {
        int r = (int)(t / units), u = (int)(t % units);
        const u8* row = w + (long long)r * row_bytes;
        uint4* dst = st + 4 * threadIdx.x;
#define DEQUANT_UNIT(T) dequant_unit_f16<T>(row, u, dst)
        QTYPE_DISPATCH(ty, DEQUANT_UNIT)
#undef DEQUANT_UNIT
    }
    __syncthreads();
    // Unit t's output starts at 32 * t halves = 4 * t uint4.
    long long base = (long long)blockIdx.x * blockDim.x;
    long long n_here = min((long long)blockDim.x, total - base);
    uint4* o4 = (uint4*)out + 4 * base;
    for (int i = threadIdx.x; i < 4 * n_here; i += blockDim.x) o4[i] = st[i];
}

// f32 -> f16 bits, round to nearest even.
extern "C" __global__ void to_f16(const float* __restrict__ x, long long len,
                                  u16* __restrict__ out) {
    long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= len) return;
    out[t] = q_to_f16(x[t]);
}

// ---------------------------------------------------------------------------
// Batched decode (fast mode, 8 < n): int8 tensor-core MMA on the same int8
// activations. A CTA of 4 warps owns a tile of 16 weight rows and up to 64
// activation rows (8 tiles of 8); warp w takes units w, w + 4, ... and
// issues two m16n8k16 s8 MMAs per unit and activation tile (the unit's two
// 16-value halves, so Q6_K's two scales apply exactly), then scales the
// int32 results into f32 accumulators. The 4 warps' sums are added in warp
// order through shared memory. Weights are read once per 64 activation rows.

// Words t and t + 4 of unit u (values 4t..4t+3 and 16+4t..16+4t+3) and the
// unit's scales: the whole unit is decoded by decode_unit (the one decoder
// of every int8 kernel) and the two words are picked with static indices,
// so they stay in registers. Four lanes decode the same unit; the
// redundant ALU work is the price of not keeping a second decoder.
template <int TY>
__device__ __forceinline__ void decode_pair(const u8* __restrict__ row, int u, int t, int& lo,
                                            int& hi, float& a0, float& a1, float& b) {
    int w[8];
    decode_unit<TY>(row, u, w, a0, a1, b);
    lo = w[0];
    hi = w[4];
#pragma unroll
    for (int i = 1; i < 4; i++) {
        if (i == t) {
            lo = w[i];
            hi = w[i + 4];
        }
    }
}

__device__ __forceinline__ void mma_s8_16816(int a0, int a1, int b0, int* c) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
        "{%7,%7,%7,%7};"
        : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
        : "r"(a0), "r"(a1), "r"(b0), "r"(0));
}

#define MMA_WARPS 4
#define MMA_TOK 64

template <int TY>
__device__ __forceinline__ void mm_q8_mma_body(const u8* __restrict__ w, int m, int k,
                                               long long row_bytes,
                                               const signed char* __restrict__ xq,
                                               const float2* __restrict__ xds, int n,
                                               float (*acc)[4]) {
    int wid = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int g = lane >> 2, t = lane & 3;
    int r0 = blockIdx.y * 16 + g, r1 = r0 + 8;
    const u8* w0 = w + (long long)min(r0, m - 1) * row_bytes;
    const u8* w1 = w + (long long)min(r1, m - 1) * row_bytes;
    int units = k / 32, nb = k / 32;
    int ntiles = (n + 7) / 8;
    for (int u = wid; u < units; u += MMA_WARPS) {
        int lo0, hi0, lo1, hi1;
        float a00, a01, b0, a10, a11, b1;
        decode_pair<TY>(w0, u, t, lo0, hi0, a00, a01, b0);
        decode_pair<TY>(w1, u, t, lo1, hi1, a10, a11, b1);
#pragma unroll
        for (int j = 0; j < MMA_TOK / 8; j++) {
            if (j >= ntiles) break;
            // B fragment: activation row 8j + g, values 4t.. and 16 + 4t...
            int tok = 8 * j + g;
            int xb0 = 0, xb1 = 0;
            if (tok < n) {
                const int* xr = (const int*)(xq + (long long)tok * k + 32 * u);
                xb0 = xr[t];
                xb1 = xr[t + 4];
            }
            int cl[4], ch[4];
            mma_s8_16816(lo0, lo1, xb0, cl);
            mma_s8_16816(hi0, hi1, xb1, ch);
            // C: c[0], c[1] row g, tokens 8j + 2t, +1; c[2], c[3] row g + 8.
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int tk = 8 * j + 2 * t + (e & 1);
                float2 ds = tk < n ? xds[(long long)tk * nb + u] : make_float2(0.0f, 0.0f);
                float aa = e < 2 ? a00 : a10, ab = e < 2 ? a01 : a11, bb = e < 2 ? b0 : b1;
                float v = fmaf(aa, (float)cl[e], ab * (float)ch[e]);
                acc[j][e] = fmaf(ds.x, v, fmaf(bb, ds.y, acc[j][e]));
            }
        }
    }
}

// Grid: (ceil(n / 64), ceil(m / 16)); block 128 threads. x rows 64*blockIdx.x...
extern "C" __global__ void mm_q8_mma(const u8* __restrict__ w, int m, int k, long long row_bytes,
                                     int ty, const signed char* __restrict__ xq,
                                     const float2* __restrict__ xds, int n_all,
                                     float* __restrict__ out) {
    __shared__ float red[MMA_WARPS][16][MMA_TOK + 1];
    int g0 = blockIdx.x * MMA_TOK;
    int n = min(MMA_TOK, n_all - g0);
    xq += (long long)g0 * k;
    xds += (long long)g0 * (k / 32);
    float acc[MMA_TOK / 8][4];
#pragma unroll
    for (int j = 0; j < MMA_TOK / 8; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[j][e] = 0.0f;
#define MMA_BODY(T) mm_q8_mma_body<T>(w, m, k, row_bytes, xq, xds, n, acc)
    QTYPE_DISPATCH(ty, MMA_BODY)
#undef MMA_BODY
    int wid = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int j = 0; j < MMA_TOK / 8; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) red[wid][g + 8 * (e >> 1)][8 * j + 2 * t + (e & 1)] = acc[j][e];
    __syncthreads();
    for (int i = threadIdx.x; i < 16 * MMA_TOK; i += blockDim.x) {
        int rr = i / MMA_TOK, tk = i % MMA_TOK;
        int row = blockIdx.y * 16 + rr;
        if (row >= m || tk >= n) continue;
        float v = red[0][rr][tk];
#pragma unroll
        for (int q = 1; q < MMA_WARPS; q++) v += red[q][rr][tk];
        out[(long long)(g0 + tk) * m + row] = v;
    }
}
