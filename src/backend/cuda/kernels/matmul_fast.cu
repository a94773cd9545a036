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
#define TT_LD (TT_KC + 8)

// Signed int8 byte e of word v as a float, exactly: the biased byte placed in
// the mantissa of 2^23 (full-rate ALU instead of an int-to-float convert).
__device__ __forceinline__ float s8_byte_f(u32 biased, int e) {
    return __uint_as_float(__byte_perm(biased, 0x4B000000u, e | 0x7540)) - 8388736.0f;
}

// Unit u of weight row `row` (or zeros when `valid` is false) as 32 f16
// values A * q + B into dst (16-byte aligned shared memory).
template <int TY>
__device__ __forceinline__ void tile_unit_f16(const u8* __restrict__ row, int u, bool valid,
                                              u16* dst) {
    u32 h[16];
    if (valid) {
        int w[8];
        float a0, a1, b;
        decode_unit<TY>(row, u, w, a0, a1, b);
#pragma unroll
        for (int i = 0; i < 8; i++) {
            float a = i < 4 ? a0 : a1;
            u32 x = (u32)w[i] ^ 0x80808080u;
            h[2 * i] = pack_f16x2(fmaf(a, s8_byte_f(x, 0), b), fmaf(a, s8_byte_f(x, 1), b));
            h[2 * i + 1] = pack_f16x2(fmaf(a, s8_byte_f(x, 2), b), fmaf(a, s8_byte_f(x, 3), b));
        }
    } else {
#pragma unroll
        for (int i = 0; i < 16; i++) h[i] = 0;
    }
    uint4* d = (uint4*)dst;
#pragma unroll
    for (int i = 0; i < 4; i++) d[i] = make_uint4(h[4 * i], h[4 * i + 1], h[4 * i + 2], h[4 * i + 3]);
}

// The chunk's activations (TT_TOK rows x TT_KC halves): thread tid takes
// 16-byte pieces tid and tid + 256 (zeros past n rows or the split's end).
__device__ __forceinline__ void tile_fetch_x(const u16* __restrict__ x16, int k, int n, int u0,
                                             int ub, uint4* xv) {
#pragma unroll
    for (int s = 0; s < 2; s++) {
        int i = threadIdx.x + 256 * s;
        int tk = i >> 3, kk = 32 * u0 + 8 * (i & 7);
        xv[s] = make_uint4(0, 0, 0, 0);
        if (tk < n && kk < 32 * ub) xv[s] = *(const uint4*)(x16 + (long long)tk * k + kk);
    }
}

__device__ __forceinline__ void tile_store_x(u16 (*sx)[TT_LD], const uint4* xv) {
#pragma unroll
    for (int s = 0; s < 2; s++) {
        int i = threadIdx.x + 256 * s;
        *(uint4*)&sx[i >> 3][8 * (i & 7)] = xv[s];
    }
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
    for (int u0 = ua; u0 < ub; u0 += TT_KC / 32) {
        tile_unit_f16<TY>(wrow, u0 + su, row0 + sr < m && u0 + su < ub, &sw[sr][32 * su]);
        uint4 xv[2];
        tile_fetch_x(x16, k, n, u0, ub, xv);
        tile_store_x(sx, xv);
        __syncthreads();
        tile_mma(sw, sx, n, acc);
        __syncthreads();
    }
}

// 32-value block types with 4-byte aligned rows: the chunk's raw weight
// bytes (TT_ROWS rows x 2 blocks, contiguous per row) are copied with
// coalesced 4-byte loads into shared memory and decoded from there; the
// next chunk's loads are issued before this chunk's MMAs, so they are in
// flight while the tensor cores work.
#define TILE_BS(TY) \
    ((TY) == TY_Q4_0 ? 18 : (TY) == TY_Q4_1 ? 20 : (TY) == TY_Q5_0 ? 22 : (TY) == TY_Q5_1 ? 24 : 34)

template <int TY, int NPRE>
__device__ __forceinline__ void tile_fetch_w32(const u8* __restrict__ w, int m, long long row_bytes,
                                               int u0, int ub, u32* pre) {
    const int BS = TILE_BS(TY), WPR = BS / 2;  // words per row per chunk
    int row0 = blockIdx.y * TT_ROWS;
    int valid = min(2, ub - u0) * BS;  // bytes of this chunk inside the split
#pragma unroll
    for (int p = 0; p < NPRE; p++) {
        int i = threadIdx.x + 256 * p;
        int r = i / WPR, c = i % WPR;
        u32 v = 0;
        if (i < TT_ROWS * WPR && row0 + r < m) {
            const u8* src = w + (long long)(row0 + r) * row_bytes + (long long)u0 * BS + 4 * c;
            // A split ending after one block ends mid-word (BS is even):
            // never read past the block.
            if (4 * c + 4 <= valid) v = *(const u32*)src;
            else if (4 * c + 2 <= valid) v = *(const u16*)src;
        }
        pre[p] = v;
    }
}

template <int TY>
__device__ __forceinline__ void mm_tile_body32(const u8* __restrict__ w, int m, int k,
                                               long long row_bytes,
                                               const u16* __restrict__ x16, int n, int ua,
                                               int ub, u16 (*sw)[TT_LD], u16 (*sx)[TT_LD],
                                               u32* raw, float (*acc)[4]) {
    const int BS = TILE_BS(TY), WPR = BS / 2;
    const int NPRE = (TT_ROWS * (TILE_BS(TY) / 2) + 255) / 256;
    int tid = threadIdx.x;
    int row0 = blockIdx.y * TT_ROWS;
    int sr = tid >> 1, su = tid & 1;
    u32 pre[NPRE];
    uint4 xv[2];
    tile_fetch_w32<TY, NPRE>(w, m, row_bytes, ua, ub, pre);
    tile_fetch_x(x16, k, n, ua, ub, xv);
    for (int u0 = ua; u0 < ub; u0 += TT_KC / 32) {
#pragma unroll
        for (int p = 0; p < NPRE; p++) {
            int i = tid + 256 * p;
            if (i < TT_ROWS * WPR) raw[i] = pre[p];
        }
        tile_store_x(sx, xv);
        __syncthreads();
        tile_unit_f16<TY>((const u8*)(raw + sr * WPR), su, row0 + sr < m && u0 + su < ub,
                          &sw[sr][32 * su]);
        __syncthreads();
        if (u0 + TT_KC / 32 < ub) {
            tile_fetch_w32<TY, NPRE>(w, m, row_bytes, u0 + TT_KC / 32, ub, pre);
            tile_fetch_x(x16, k, n, u0 + TT_KC / 32, ub, xv);
        }
        tile_mma(sw, sx, n, acc);
        __syncthreads();
    }
}

// out (n, m) (+ blockIdx.z * part_stride: split z's partial sums) =
// x16 (n, k) · wᵀ over units [z * upc, min((z + 1) * upc, k / 32)).
// Grid: (ceil(n / TT_TOK), ceil(m / TT_ROWS), splits); block 256 threads;
// upc a multiple of TT_KC / 32.
extern "C" __global__ void __launch_bounds__(256, 2) mm_f16_tile(
    const u8* __restrict__ w, int m, int k, long long row_bytes, int ty,
    const u16* __restrict__ x16, int n_all, int upc, long long part_stride,
    float* __restrict__ out) {
    __shared__ __align__(16) u16 sw[TT_ROWS][TT_LD];
    __shared__ __align__(16) u16 sx[TT_TOK][TT_LD];
    __shared__ u32 raw[TT_ROWS * 17];  // 2 blocks of up to 34 bytes per row
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
        mm_tile_body32<T <= TY_Q8_0 ? T : TY_Q8_0>(w, m, k, row_bytes, x16, n, ua, ub, sw, sx, \
                                                    raw, acc);                      \
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
