// out = x · wᵀ (see src/backend/cpu/ops/matmul.rs and canon.rs).
// Quantized weights: activations are quantized canonically per row
// (quant_act32 / quant_actk), then each output is the canonical block-term
// sum: term of block b goes to lane b % 8 (sequential within a lane, in
// increasing b), then the 8-lane tree. One group of 8 threads computes one
// output: thread l of the group owns lane l.
// Float weights: one warp per output; thread l owns lane l of dot32.

#define TY_Q4_0 0
#define TY_Q4_1 1
#define TY_Q5_0 2
#define TY_Q5_1 3
#define TY_Q8_0 4
#define TY_Q4_K 10
#define TY_Q5_K 11
#define TY_Q6_K 12
#define TY_F32 20
#define TY_F16 21
#define TY_BF16 22

// Activation quantization of one block of `len` values (canon::quantize_block
// with the activation integer range QUIRE_ACT_QMAX).
__device__ __forceinline__ float quant_block(const float* x, int len, short* q) {
    float amax = 0.0f;
    for (int i = 0; i < len; i++) amax = q_max(amax, fabsf(x[i]));
    float d = q_div(amax, QUIRE_ACT_QMAX);
    float id = (d == 0.0f) ? 0.0f : q_div(1.0f, d);
    for (int i = 0; i < len; i++) {
        float r = q_round_away(q_mul(x[i], id));
        short v;
        if (q_isnan(r)) {
            v = 0;
        } else {
            r = fminf(fmaxf(r, -QUIRE_ACT_QMAX), QUIRE_ACT_QMAX);
            v = (short)(int)r;
        }
        q[i] = v;
    }
    return d;
}

// One thread per (row, 32-block). x: (n, k); qs: (n, k); d, s: (n, k/32).
extern "C" __global__ void quant_act32(const float* __restrict__ x, int n, int k,
                                       short* __restrict__ qs, float* __restrict__ d,
                                       float* __restrict__ s) {
    long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    int nb = k / 32;
    if (t >= (long long)n * nb) return;
    int row = (int)(t / nb), b = (int)(t % nb);
    const float* xb = x + (long long)row * k + 32 * b;
    short* q = qs + (long long)row * k + 32 * b;
    float db = quant_block(xb, 32, q);
    int sum = 0;
    for (int i = 0; i < 32; i++) sum += q[i];
    d[t] = db;
    s[t] = q_mul(db, __int2float_rn(sum));
}

// One thread per (row, 256-superblock). bsum: (n, k/256, 16).
extern "C" __global__ void quant_actk(const float* __restrict__ x, int n, int k,
                                      short* __restrict__ qs, float* __restrict__ d,
                                      int* __restrict__ bsum) {
    long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    int nb = k / 256;
    if (t >= (long long)n * nb) return;
    int row = (int)(t / nb), b = (int)(t % nb);
    const float* xb = x + (long long)row * k + 256 * b;
    short* q = qs + (long long)row * k + 256 * b;
    d[t] = quant_block(xb, 256, q);
    for (int g = 0; g < 16; g++) {
        int sg = 0;
        for (int i = 0; i < 16; i++) sg += q[16 * g + i];
        bsum[t * 16 + g] = sg;
    }
}

__device__ __forceinline__ int type_size(int ty) {
    switch (ty) {
        case TY_Q4_0: return 18;
        case TY_Q4_1: return 20;
        case TY_Q5_0: return 22;
        case TY_Q5_1: return 24;
        case TY_Q8_0: return 34;
        case TY_Q4_K: return 144;
        case TY_Q5_K: return 176;
        default: return 210;  // Q6_K
    }
}

// Exact integer dot of one 32-block with quantized activations.
__device__ __forceinline__ int block_isum(int ty, const u8* blk, const short* qa) {
    int isum = 0;
    if (ty == TY_Q8_0) {
        for (int i = 0; i < 32; i++) isum += (int)(signed char)blk[2 + i] * (int)qa[i];
        return isum;
    }
    if (ty == TY_Q4_0 || ty == TY_Q4_1) {
        const u8* qs = blk + (ty == TY_Q4_0 ? 2 : 4);
        int off = ty == TY_Q4_0 ? 8 : 0;
        for (int j = 0; j < 16; j++) {
            int lo = (int)(qs[j] & 0xF) - off;
            int hi = (int)(qs[j] >> 4) - off;
            isum += lo * (int)qa[j] + hi * (int)qa[j + 16];
        }
        return isum;
    }
    // Q5_0 / Q5_1
    const u8* hb = blk + (ty == TY_Q5_0 ? 2 : 4);
    u32 qh = (u32)hb[0] | ((u32)hb[1] << 8) | ((u32)hb[2] << 16) | ((u32)hb[3] << 24);
    const u8* qs = hb + 4;
    int off = ty == TY_Q5_0 ? 16 : 0;
    for (int j = 0; j < 16; j++) {
        u32 h0 = ((qh >> j) << 4) & 0x10;
        u32 h1 = (qh >> (j + 12)) & 0x10;
        int lo = (int)((qs[j] & 0xF) | h0) - off;
        int hi = (int)((qs[j] >> 4) | h1) - off;
        isum += lo * (int)qa[j] + hi * (int)qa[j + 16];
    }
    return isum;
}

// Grid: x = ceil(m / rw) weight-row groups, y = ceil(n / ra) activation-row
// groups; block = 256 threads = 32 groups of 8 with rw * ra == 32.
extern "C" __global__ void mm_q32(const u8* __restrict__ w, int m, int k, int ty,
                                  const short* __restrict__ qs, const float* __restrict__ ad,
                                  const float* __restrict__ as, int n, int ra,
                                  float* __restrict__ out) {
    int g = threadIdx.x >> 3, l = threadIdx.x & 7;
    int rw = 32 / ra;
    int j = blockIdx.x * rw + g / ra;
    int i = blockIdx.y * ra + g % ra;
    bool ok = j < m && i < n;
    int nb = k / 32;
    int ts = type_size(ty);
    float lane = 0.0f;
    if (ok) {
        const u8* wr = w + (long long)j * nb * ts;
        const short* qa = qs + (long long)i * k;
        const float* dr = ad + (long long)i * nb;
        const float* sr = as + (long long)i * nb;
        for (int b = l; b < nb; b += 8) {
            const u8* blk = wr + (long long)b * ts;
            int isum = block_isum(ty, blk, qa + 32 * b);
            float dw = q_f16_at(blk);
            float t = q_mul(q_mul(dw, dr[b]), __int2float_rn(isum));
            if (ty == TY_Q4_1 || ty == TY_Q5_1) t = q_add(t, q_mul(q_f16_at(blk + 2), sr[b]));
            lane = q_add(lane, t);
        }
    }
    float r = q_group_tree8(lane);
    if (ok && l == 0) out[(long long)i * m + j] = r;
}

__device__ __forceinline__ void k_scale_min(int j, const u8* s, int* sc, int* mn) {
    if (j < 4) {
        *sc = s[j] & 63;
        *mn = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
        *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

// Term of one K-quant superblock (canon.rs).
__device__ float qk_term(int ty, const u8* blk, const short* qa, const int* bsum, float da) {
    if (ty == TY_Q6_K) {
        const u8* ql = blk;
        const u8* qh = blk + 128;
        i64 acc = 0;
        // y[128h + 32c + l] for c in 0..4: groups of 16 are g = 8h + 2c + (l >= 16).
        for (int h = 0; h < 2; h++) {
            for (int c = 0; c < 4; c++) {
                int ig0 = 0, ig1 = 0;
                for (int l = 0; l < 32; l++) {
                    int v;
                    u8 a = ql[64 * h + l + (c & 1) * 32];
                    u8 hb = qh[32 * h + l];
                    int lo = (c < 2) ? (a & 0xF) : (a >> 4);
                    int hi = (hb >> (2 * c)) & 3;
                    v = (lo | (hi << 4)) - 32;
                    int p = v * (int)qa[128 * h + 32 * c + l];
                    if (l < 16) ig0 += p; else ig1 += p;
                }
                int g = 8 * h + 2 * c;
                acc += (i64)(signed char)blk[192 + g] * ig0;
                acc += (i64)(signed char)blk[192 + g + 1] * ig1;
            }
        }
        return q_mul(q_mul(q_f16_at(blk + 208), da), __ll2float_rn(acc));
    }
    const u8* sc = blk + 4;
    i64 am = 0, bm = 0;
    for (int j = 0; j < 8; j++) {
        int s, mn;
        k_scale_min(j, sc, &s, &mn);
        int c = j >> 1, hi = j & 1;  // sub-block j = 64c + 32hi
        int ij = 0;
        if (ty == TY_Q4_K) {
            const u8* q = blk + 16 + 32 * c;
            for (int l = 0; l < 32; l++) {
                int u = hi ? (q[l] >> 4) : (q[l] & 0xF);
                ij += u * (int)qa[32 * j + l];
            }
        } else {
            const u8* qh = blk + 16;
            const u8* q = blk + 48 + 32 * c;
            for (int l = 0; l < 32; l++) {
                int u = hi ? (q[l] >> 4) : (q[l] & 0xF);
                u |= ((qh[l] >> (2 * c + hi)) & 1) << 4;
                ij += u * (int)qa[32 * j + l];
            }
        }
        am += (i64)s * ij;
        bm += (i64)mn * (i64)(bsum[2 * j] + bsum[2 * j + 1]);
    }
    float d = q_f16_at(blk), dmin = q_f16_at(blk + 2);
    return q_sub(q_mul(q_mul(d, da), __ll2float_rn(am)), q_mul(q_mul(dmin, da), __ll2float_rn(bm)));
}

extern "C" __global__ void mm_qk(const u8* __restrict__ w, int m, int k, int ty,
                                 const short* __restrict__ qs, const float* __restrict__ ad,
                                 const int* __restrict__ bsum, int n, int ra,
                                 float* __restrict__ out) {
    int g = threadIdx.x >> 3, l = threadIdx.x & 7;
    int rw = 32 / ra;
    int j = blockIdx.x * rw + g / ra;
    int i = blockIdx.y * ra + g % ra;
    bool ok = j < m && i < n;
    int nb = k / 256;
    int ts = type_size(ty);
    float lane = 0.0f;
    if (ok) {
        const u8* wr = w + (long long)j * nb * ts;
        for (int b = l; b < nb; b += 8) {
            float t = qk_term(ty, wr + (long long)b * ts, qs + (long long)i * k + 256 * b,
                              bsum + ((long long)i * nb + b) * 16, ad[(long long)i * nb + b]);
            lane = q_add(lane, t);
        }
    }
    float r = q_group_tree8(lane);
    if (ok && l == 0) out[(long long)i * m + j] = r;
}

// Float weights: one warp per output (i, j); 8 warps per block.
extern "C" __global__ void mm_float(const u8* __restrict__ w, int m, int k, int ty,
                                    const float* __restrict__ x, int n,
                                    float* __restrict__ out) {
    long long o = (long long)blockIdx.x * 8 + (threadIdx.x >> 5);
    int l = threadIdx.x & 31;
    bool ok = o < (long long)n * m;
    float lane = 0.0f;
    int i = 0, j = 0;
    if (ok) {
        i = (int)(o / m);
        j = (int)(o % m);
        const float* xr = x + (long long)i * k;
        if (ty == TY_F32) {
            const float* wr = (const float*)(w + (long long)j * k * 4);
            for (int e = l; e < k; e += 32) lane = q_add(lane, q_mul(xr[e], wr[e]));
        } else {
            const u16* wr = (const u16*)(w + (long long)j * k * 2);
            bool f16 = ty == TY_F16;
            for (int e = l; e < k; e += 32) {
                float wv = f16 ? q_f16(wr[e]) : q_bf16(wr[e]);
                lane = q_add(lane, q_mul(xr[e], wv));
            }
        }
    }
    float r = q_warp_tree32(lane);
    if (ok && l == 0) out[(long long)i * m + j] = r;
}

// ---------------------------------------------------------------------------
// Fast and deterministic modes (not the canonical arithmetic: FMA, f32
// activations, warp-shuffle trees). Every output row is still computed in
// one fixed order that does not depend on the batch, so these are
// batch-invariant (deterministic mode); only `fast` adds cuBLAS GEMMs.

// Weights (m, k) dequantized to f16 (round to nearest even) for a
// tensor-core GEMM. One thread per element.
extern "C" __global__ void dequant_f16(const u8* __restrict__ w, int m, int k,
                                       long long row_bytes, int ty, u16* __restrict__ out) {
    long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (long long)m * k) return;
    int r = (int)(t / k), e = (int)(t % k);
    out[t] = q_to_f16(q_dequant(w + (long long)r * row_bytes, e, ty));
}

// f32 -> f16 bits, round to nearest even.
extern "C" __global__ void to_f16(const float* __restrict__ x, long long len,
                                  u16* __restrict__ out) {
    long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= len) return;
    out[t] = q_to_f16(x[t]);
}

#define MV_ROWS 8

// Dot products of one 32-element Q4_0 / Q8_0 block with up to MV_ROWS
// activation rows (x: (n, k), block b), accumulated into acc.
__device__ __forceinline__ void mv_block32(const u8* __restrict__ blk, int ty, const float* __restrict__ x,
                                           int k, int b, int n, float* acc) {
    // The scale is folded into the weights (not applied to the block sum),
    // so an intermediate overflows only when the true products do.
    float d = q_f16_at(blk);
    float wv[32];
    if (ty == 0) {
#pragma unroll
        for (int i = 0; i < 8; i++) {
            u16 two = *(const u16*)(blk + 2 + 2 * i);
            wv[2 * i] = d * (float)((int)(two & 0xF) - 8);
            wv[2 * i + 16] = d * (float)((int)((two >> 4) & 0xF) - 8);
            wv[2 * i + 1] = d * (float)((int)((two >> 8) & 0xF) - 8);
            wv[2 * i + 17] = d * (float)((int)(two >> 12) - 8);
        }
    } else {
#pragma unroll
        for (int i = 0; i < 16; i++) {
            u16 two = *(const u16*)(blk + 2 + 2 * i);
            wv[2 * i] = d * (float)(signed char)(two & 0xFF);
            wv[2 * i + 1] = d * (float)(signed char)(two >> 8);
        }
    }
#pragma unroll
    for (int r = 0; r < MV_ROWS; r++) {
        // Static indexing keeps acc in registers.
        if (r >= n) break;
        const float4* xr = (const float4*)(x + (long long)r * k + 32 * b);
        float s = 0.0f;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            float4 v = xr[i];
            s += wv[4 * i] * v.x + wv[4 * i + 1] * v.y + wv[4 * i + 2] * v.z + wv[4 * i + 3] * v.w;
        }
        acc[r] += s;
    }
}

// out (n, m) = x (n, k) · wᵀ, k a multiple of 32: one warp per output row
// and group of MV_ROWS activation rows (blockIdx.y); lane l takes blocks
// l, l + 32, ... of the row (coalesced: the warp reads 32 consecutive
// blocks), then a fixed xor-shuffle tree. Weights are read once per group.
// Q4_0 and Q8_0 decode their blocks directly; other types dequantize
// element by element (q_dequant).
extern "C" __global__ void mv_fast(const u8* __restrict__ w, int m, int k, long long row_bytes,
                                   int ty, const float* __restrict__ x, int n_all,
                                   float* __restrict__ out) {
    int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    int l = threadIdx.x & 31;
    if (row >= m) return;
    int g0 = blockIdx.y * MV_ROWS;
    int n = min(MV_ROWS, n_all - g0);
    x += (long long)g0 * k;
    out += (long long)g0 * m;
    const u8* wr = w + (long long)row * row_bytes;
    float acc[MV_ROWS];
#pragma unroll
    for (int r = 0; r < MV_ROWS; r++) acc[r] = 0.0f;
    if (ty == 0 || ty == 4) {
        int bsz = ty == 0 ? 18 : 34;
        int nb = k / 32;
        for (int b = l; b < nb; b += 32) mv_block32(wr + (long long)b * bsz, ty, x, k, b, n, acc);
    } else {
        // 32-element chunks, lane-strided like the blocks above.
        for (int c = l; c < k / 32; c += 32) {
            float wv[32];
#pragma unroll 4
            for (int i = 0; i < 32; i++) wv[i] = q_dequant(wr, 32 * c + i, ty);
#pragma unroll
            for (int r = 0; r < MV_ROWS; r++) {
                if (r >= n) break;
                const float* xr = x + (long long)r * k + 32 * c;
                float s = 0.0f;
#pragma unroll
                for (int i = 0; i < 32; i++) s += wv[i] * xr[i];
                acc[r] += s;
            }
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
