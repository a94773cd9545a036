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

// Lane l's units l, l + 32, ..., MV_UNITS per iteration with their loads
// in flight together. Each lane adds its units in increasing order,
// whatever MV_UNITS is. 1 measured fastest on an H100 (8B Q4_0 tg128: 271
// tok/s vs 253 / 246 / 259 with 2 / 3 / 4; fewer registers, more warps).
#ifndef MV_UNITS
#define MV_UNITS 1
#endif
template <int TY>
__device__ __forceinline__ void mv_q8_row(const u8* __restrict__ wr, int units,
                                          const signed char* __restrict__ xq,
                                          const float2* __restrict__ xds, int k, int n, int l,
                                          float* acc) {
    int u = l;
    for (; u + 32 * (MV_UNITS - 1) < units; u += 32 * MV_UNITS) {
        int w[MV_UNITS][8];
        float a0[MV_UNITS], a1[MV_UNITS], b[MV_UNITS];
#pragma unroll
        for (int i = 0; i < MV_UNITS; i++) decode_unit<TY>(wr, u + 32 * i, w[i], a0[i], a1[i], b[i]);
#pragma unroll
        for (int i = 0; i < MV_UNITS; i++)
            mv_q8_dot(w[i], a0[i], a1[i], b[i], u + 32 * i, xq, xds, k, n, acc);
    }
    for (; u < units; u += 32) {
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
// Batched decode (fast mode, a few to 64 activation rows): quantized weights
// dequantized tile by tile into shared memory as f16 and multiplied on
// tensor cores with f16 activations, f32 accumulation (the arithmetic of
// the cuBLAS path, without dequantizing the whole matrix to memory first).
//
// A CTA of 8 warps owns TT_ROWS = 128 weight rows (warp w: rows 16w..16w+15)
// and TT_TOK = 64 activation rows (8 tiles of 8), and a range of k (split-K:
// grid z; partial sums then added in split order by split_sum). The k range
// runs in chunks of TT_KC values: each thread decodes one 32-value unit
// (decode_unit) to f16, the activation chunk is copied with 16-byte loads,
// and every warp runs m16n8k16 MMAs on ldmatrix fragments. Weights are read
// from memory once per 64 activation rows; activations once per 128 weight
// rows (from L2).
//
// Shared rows are TT_KC + 8 halves (144 bytes): the 8 row addresses of an
// ldmatrix phase start 4 banks apart, so they never conflict.

#define TT_ROWS 128
#define TT_TOK 64
#define TT_KC 64
#define TT_KU (TT_KC / 32)       // units per chunk
#define TT_XP (TT_KC / 8)        // 16-byte activation pieces per row
#define TT_LD (TT_KC + 8)

// f16x2 arithmetic through PTX (no header).
__device__ __forceinline__ u32 h2_sub(u32 a, u32 b) {
    u32 r;
    asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
}
__device__ __forceinline__ u32 h2_fma(u32 a, u32 b, u32 c) {
    u32 r;
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
    return r;
}

// Bytes 0, 1 (lo) or 2, 3 (hi) of x as the f16 pair 1024 + byte: the byte
// placed in the mantissa of 1024 (one byte permute per two values; exact).
__device__ __forceinline__ u32 h2_bytes01(u32 x) { return __byte_perm(x, 0x64646464u, 0x4140); }
__device__ __forceinline__ u32 h2_bytes23(u32 x) { return __byte_perm(x, 0x64646464u, 0x4342); }

// Unit u of weight row `row` (or zeros when `valid` is false) as 32 f16
// values A * q + B into dst (16-byte aligned shared memory). The integer q
// is made exactly in f16 (1024 + biased byte, minus the bias), then one f16
// FMA with A and B rounded to f16 (exact for the 32-block types' f16
// scales; the K-quants' products d * sc round once more: fast mode only).
template <int TY>
__device__ __forceinline__ void tile_unit_f16(const u8* __restrict__ row, int u, bool valid,
                                              u16* dst) {
    u32 h[16];
    if (!valid) {
#pragma unroll
        for (int i = 0; i < 16; i++) h[i] = 0;
    } else if (TY == TY_Q4_0) {
        // Nibbles straight from the block: q - 8 = (1024 + q) - 1032.
        const u8* blk = row + (long long)u * 18;
        u32 v[5];
        int sh = ld_words<5>(blk, v);
        u32 sc = __funnelshift_rc(v[0], v[1], sh) & 0xFFFFu;
        u32 d = sc | (sc << 16);
        const u32 bias = 0x64086408u;  // 1032, 1032
#pragma unroll
        for (int i = 0; i < 4; i++) {
            u32 q = __funnelshift_rc(v[i], v[i + 1], sh + 16);
            u32 lo = q & 0x0F0F0F0Fu, hi = (q >> 4) & 0x0F0F0F0Fu;
            h[2 * i] = h2_fma(h2_sub(h2_bytes01(lo), bias), d, 0);
            h[2 * i + 1] = h2_fma(h2_sub(h2_bytes23(lo), bias), d, 0);
            h[8 + 2 * i] = h2_fma(h2_sub(h2_bytes01(hi), bias), d, 0);
            h[8 + 2 * i + 1] = h2_fma(h2_sub(h2_bytes23(hi), bias), d, 0);
        }
    } else {
        int w[8];
        float a0, a1, b;
        decode_unit<TY>(row, u, w, a0, a1, b);
        u32 ha0 = pack_f16x2(a0, a0), ha1 = pack_f16x2(a1, a1), hb = pack_f16x2(b, b);
        const u32 bias = 0x64806480u;  // 1152 = 1024 + 128, the signed bytes' bias
#pragma unroll
        for (int i = 0; i < 8; i++) {
            u32 x = (u32)w[i] ^ 0x80808080u;
            u32 ha = i < 4 ? ha0 : ha1;
            h[2 * i] = h2_fma(h2_sub(h2_bytes01(x), bias), ha, hb);
            h[2 * i + 1] = h2_fma(h2_sub(h2_bytes23(x), bias), ha, hb);
        }
    }
    uint4* d = (uint4*)dst;
#pragma unroll
    for (int i = 0; i < 4; i++) d[i] = make_uint4(h[4 * i], h[4 * i + 1], h[4 * i + 2], h[4 * i + 3]);
}

// acc += the chunk's products: warp w's 16 weight rows x the activation
// tiles below n, four k16 steps of m16n8k16 on ldmatrix fragments.
__device__ __forceinline__ void tile_mma(u16 (*sw)[TT_LD], u16 (*sx)[TT_LD], int n,
                                         float (*acc)[4]) {
    int wid = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int ntiles = (n + 7) / 8;
#pragma unroll
    for (int ks = 0; ks < TT_KC / 16; ks++) {
        u32 a[4];
        ldsm_x4(a, &sw[16 * wid + (lane & 15)][16 * ks + 8 * (lane >> 4)]);
#pragma unroll
        for (int jp = 0; jp < TT_TOK / 16; jp++) {
            if (2 * jp >= ntiles) break;
            u32 b[4];
            int q = lane >> 3;
            ldsm_x4(b, &sx[16 * jp + 8 * (q >> 1) + (lane & 7)][16 * ks + 8 * (q & 1)]);
            mma_f16_16816(a, b[0], b[1], acc[2 * jp]);
            if (2 * jp + 1 < ntiles) mma_f16_16816(a, b[2], b[3], acc[2 * jp + 1]);
        }
    }
}

// 32-value block types with 4-byte aligned rows: a TT_STAGES-deep pipeline
// of cp.async copies (no registers held): the raw weight bytes of a chunk
// (TT_ROWS rows x 2 blocks, contiguous per row; 4-byte copies, coalesced
// along the flattened rows) and its activations (16-byte copies) land in
// stage c % TT_STAGES while earlier chunks are decoded and multiplied.
#define TT_STAGES 3
#define TT_RAW_WORDS (TT_ROWS * 17)  // TT_KU blocks of up to 34 bytes per row

__device__ __forceinline__ void cp_async_wait_stages() {
    asm volatile("cp.async.wait_group %0;" ::"n"(TT_STAGES - 2));
}

// Queues the chunk's activations (TT_TOK rows x TT_KC halves) into sx:
// 16-byte copies, zeros past n rows or the split's end.
__device__ __forceinline__ void tile_issue_x(const u16* __restrict__ x16, int k, int n, int u0,
                                             int ub, u16 (*sx)[TT_LD]) {
#pragma unroll
    for (int s = 0; s < TT_TOK * TT_XP / 256; s++) {
        int i = threadIdx.x + 256 * s;
        int tk = i / TT_XP, kk = 32 * u0 + 8 * (i % TT_XP);
        bool ok = tk < n && kk < 32 * ub;
        cp_async16(&sx[tk][8 * (i % TT_XP)], ok ? (const void*)(x16 + (long long)tk * k + kk) : x16,
                   ok ? 16 : 0);
    }
}

// Any quantized type: each thread decodes its unit straight from global
// memory (the K-quant types' 256-value superblocks do not split into 64-value
// chunks of whole blocks, and rows whose bytes are not 4-byte aligned).
template <int TY>
__device__ __forceinline__ void mm_tile_body(const u8* __restrict__ w, int m, int k,
                                             long long row_bytes, const u16* __restrict__ x16,
                                             int n, int ua, int ub, u16 (*sw)[TT_LD],
                                             u16 (*sx)[TT_LD], float (*acc)[4]) {
    int tid = threadIdx.x;
    int row0 = blockIdx.y * TT_ROWS;
    // This thread's staging unit: row tid / 2, unit tid % 2 of the chunk.
    int sr = tid >> 1, su = tid & 1;
    const u8* wrow = w + (long long)min(row0 + sr, m - 1) * row_bytes;
    for (int u0 = ua; u0 < ub; u0 += TT_KU) {
#pragma unroll
        for (int j = su; j < TT_KU; j += 2)
            tile_unit_f16<TY>(wrow, u0 + j, row0 + sr < m && u0 + j < ub, &sw[sr][32 * j]);
        tile_issue_x(x16, k, n, u0, ub, sx);
        cp_async_commit();
        asm volatile("cp.async.wait_group 0;");
        __syncthreads();
        tile_mma(sw, sx, n, acc);
        __syncthreads();
    }
}

// Queues chunk u0's copies into (raw, sx); bytes past the row, the split or
// n rows are zero-filled (source size 0, or 2 for a split that ends after
// one block mid-word: BS is even).
template <int TY>
__device__ __forceinline__ void tile_issue32(const u8* __restrict__ w, int m, long long row_bytes,
                                             const u16* __restrict__ x16, int k, int n, int u0,
                                             int ub, u32* raw, u16 (*sx)[TT_LD]) {
    constexpr int BS = gr_type_size(TY), WPR = TT_KU * BS / 4;  // words per row per chunk
    int row0 = blockIdx.y * TT_ROWS;
    int valid = min(TT_KU, ub - u0) * BS;
#pragma unroll
    for (int p = 0; p < (TT_ROWS * WPR + 255) / 256; p++) {
        int i = threadIdx.x + 256 * p;
        if (i >= TT_ROWS * WPR) break;
        int r = i / WPR, c = i % WPR;
        const u8* src = w;
        int bytes = 0;
        if (row0 + r < m && 4 * c < valid) {
            src = w + (long long)(row0 + r) * row_bytes + (long long)u0 * BS + 4 * c;
            bytes = min(4, valid - 4 * c);
        }
        cp_async4(raw + i, src, bytes);
    }
    tile_issue_x(x16, k, n, u0, ub, sx);
}

template <int TY>
__device__ __forceinline__ void mm_tile_body32(const u8* __restrict__ w, int m, int k,
                                               long long row_bytes,
                                               const u16* __restrict__ x16, int n, int ua,
                                               int ub, u16 (*sw)[TT_LD], u8* stages,
                                               float (*acc)[4]) {
    constexpr int WPR = TT_KU * gr_type_size(TY) / 4;
    const int STAGE = TT_RAW_WORDS * 4 + TT_TOK * TT_LD * 2;  // bytes per stage
    int tid = threadIdx.x;
    int row0 = blockIdx.y * TT_ROWS;
    int sr = tid >> 1, su = tid & 1;
    int nch = (ub - ua + TT_KU - 1) / TT_KU;
#pragma unroll
    for (int c = 0; c < TT_STAGES - 1; c++) {
        if (c < nch) {
            u8* st = stages + c * STAGE;
            tile_issue32<TY>(w, m, row_bytes, x16, k, n, ua + TT_KU * c, ub, (u32*)st,
                             (u16 (*)[TT_LD])(st + TT_RAW_WORDS * 4));
        }
        cp_async_commit();
    }
    for (int c = 0; c < nch; c++) {
        int u0 = ua + TT_KU * c;
        u8* st = stages + (c % TT_STAGES) * STAGE;
        cp_async_wait_stages();
        // Every thread's copies of chunk c landed, and the MMAs of chunk
        // c - 1 are done with sw and with the stage the next issue reuses.
        __syncthreads();
#pragma unroll
        for (int j = su; j < TT_KU; j += 2)
            tile_unit_f16<TY>(st + 4 * sr * WPR, j, row0 + sr < m && u0 + j < ub, &sw[sr][32 * j]);
        __syncthreads();
        if (c + TT_STAGES - 1 < nch) {
            u8* nx = stages + ((c + TT_STAGES - 1) % TT_STAGES) * STAGE;
            tile_issue32<TY>(w, m, row_bytes, x16, k, n, u0 + TT_KU * (TT_STAGES - 1), ub, (u32*)nx,
                             (u16 (*)[TT_LD])(nx + TT_RAW_WORDS * 4));
        }
        cp_async_commit();
        tile_mma(sw, (u16 (*)[TT_LD])(st + TT_RAW_WORDS * 4), n, acc);
    }
}

// out (n, m) (+ blockIdx.z * part_stride: split z's partial sums) =
// x16 (n, k) · wᵀ over units [z * upc, min((z + 1) * upc, k / 32)).
// Grid: (ceil(n / TT_TOK), ceil(m / TT_ROWS), splits); block 256 threads;
// upc a multiple of TT_KC / 32. Dynamic shared memory: TT_SMEM bytes (sw,
// then TT_STAGES stages of raw weights and activations).
#define TT_SMEM (TT_ROWS * TT_LD * 2 + TT_STAGES * (TT_RAW_WORDS * 4 + TT_TOK * TT_LD * 2))
extern "C" __global__ void __launch_bounds__(256, 2) mm_f16_tile(
    const u8* __restrict__ w, int m, int k, long long row_bytes, int ty,
    const u16* __restrict__ x16, int n_all, int upc, long long part_stride,
    float* __restrict__ out) {
    extern __shared__ __align__(16) u8 tt_smem[];
    u16 (*sw)[TT_LD] = (u16 (*)[TT_LD])tt_smem;
    u8* stages = tt_smem + TT_ROWS * TT_LD * 2;
    u16 (*sx)[TT_LD] = (u16 (*)[TT_LD])(stages + TT_RAW_WORDS * 4);
    int g0 = blockIdx.x * TT_TOK;
    int n = min(TT_TOK, n_all - g0);
    x16 += (long long)g0 * k;
    out += blockIdx.z * part_stride + (long long)g0 * m;
    int ua = blockIdx.z * upc, ub = min(ua + upc, k / 32);
    float acc[TT_TOK / 8][4];
#pragma unroll
    for (int j = 0; j < TT_TOK / 8; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[j][e] = 0.0f;
#define TT_BODY(T)                                                                  \
    if (T <= TY_Q8_0 && row_bytes % 4 == 0)                                         \
        mm_tile_body32<T <= TY_Q8_0 ? T : TY_Q8_0>(w, m, k, row_bytes, x16, n, ua, ub, sw, \
                                                    stages, acc);                   \
    else                                                                            \
        mm_tile_body<T>(w, m, k, row_bytes, x16, n, ua, ub, sw, sx, acc);
    QTYPE_DISPATCH(ty, TT_BODY)
#undef TT_BODY
    int wid = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int g = lane >> 2, t = lane & 3;
    int ra = blockIdx.y * TT_ROWS + 16 * wid + g, rb = ra + 8;
#pragma unroll
    for (int j = 0; j < TT_TOK / 8; j++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int tk = 8 * j + 2 * t + (e & 1);
            int row = e < 2 ? ra : rb;
            if (tk < n && row < m) out[(long long)tk * m + row] = acc[j][e];
        }
    }
}

// out[i] = sum over s = 0..splits-1, in that order, of part[s * len + i].
extern "C" __global__ void split_sum(const float* __restrict__ part, int splits, long long len,
                                     float* __restrict__ out) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= len) return;
    float v = part[i];
    for (int s = 1; s < splits; s++) v += part[s * len + i];
    out[i] = v;
}
