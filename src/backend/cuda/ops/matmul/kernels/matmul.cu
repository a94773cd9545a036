// out = x · wᵀ (see src/backend/cpu/ops/matmul.rs and canon.rs).
// Quantized weights: activations are quantized canonically per row
// (quant_act32 / quant_actk), then each output is the canonical block-term
// sum: term of block b goes to lane b % 8 (sequential within a lane, in
// increasing b), then the 8-lane tree. One group of 8 threads computes one
// output: thread l of the group owns lane l.
// Float weights: one warp per output; thread l owns lane l of dot32.


// Activation quantization of one block of `len` values (canon::quantize_block
// with the activation integer range ACT_QMAX).
__device__ __forceinline__ float quant_block(const float* x, int len, short* q) {
    float amax = 0.0f;
    for (int i = 0; i < len; i++) amax = q_max(amax, fabsf(x[i]));
    float d = q_div(amax, ACT_QMAX);
    float id = (d == 0.0f) ? 0.0f : q_div(1.0f, d);
    for (int i = 0; i < len; i++) {
        float r = q_round_away(q_mul(x[i], id));
        short v;
        if (q_isnan(r)) {
            v = 0;
        } else {
            r = fminf(fmaxf(r, -ACT_QMAX), ACT_QMAX);
            v = (short)(int)r;
        }
        q[i] = v;
    }
    return d;
}

// A block's 32 activations in canon_chunk's layout: value v is p[(v / 8) *
// cs + v % 8].
struct CanonQ {
    const short* p;
    int cs;
    __device__ __forceinline__ int operator[](int v) const { return p[(v >> 3) * cs + (v & 7)]; }
};
__device__ __forceinline__ CanonQ canon_block(const short* row, int nb, int b) {
    return CanonQ{row + canon_chunk(nb, b, 0), 8 * canon_tile_blocks(nb, b)};
}

// The activations' integer block sums behind quant_act32's float ones
// s: (n, nb) floats.
__device__ __forceinline__ int* exact_isums(float* s, int n, int nb) {
    return (int*)(s + (long long)n * nb);
}

// One warp per (row, 32-block), lane i owning value i; the same bits as
// quant_block (the maximum and the integer sum do not depend on order).
// x: (n, k); qs: (n, k) in canon_chunk's layout; d: (n, k/32); s: (2, n,
// k/32): the block's d times its integer sum (the Q4_1 / Q5_1 minimum's
// term), then the integer sum itself as int bits (mv_exact32*'s offset of
// Q4_0 / Q5_0, exact_isums).
extern "C" __global__ void quant_act32(const float* __restrict__ x, int n, int k,
                                       short* __restrict__ qs, float* __restrict__ d,
                                       float* __restrict__ s) {
    GRID_DEP();
    long long t = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int i = threadIdx.x & 31;
    int nb = k / 32;
    if (t >= (long long)n * nb) return;  // whole warps exit together
    int row = (int)(t / nb), b = (int)(t % nb);
    float v = x[(long long)row * k + 32 * b + i];
    float amax = q_max(0.0f, fabsf(v));  // a NaN counts as 0, as in quant_block
    for (int o = 16; o >= 1; o >>= 1) amax = q_max(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    float db = q_div(amax, ACT_QMAX);
    float id = (db == 0.0f) ? 0.0f : q_div(1.0f, db);
    float r = q_round_away(q_mul(v, id));
    short q;
    if (q_isnan(r)) {
        q = 0;
    } else {
        r = fminf(fmaxf(r, -ACT_QMAX), ACT_QMAX);
        q = (short)(int)r;
    }
    qs[(long long)row * k + canon_chunk(nb, b, i >> 3) + (i & 7)] = q;
    int sum = q;
    for (int o = 16; o >= 1; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (i == 0) {
        d[t] = db;
        s[t] = q_mul(db, __int2float_rn(sum));
        exact_isums(s, n, nb)[t] = sum;
    }
}

// One thread per (row, 256-superblock). bsum: (n, k/256, 16).
extern "C" __global__ void quant_actk(const float* __restrict__ x, int n, int k,
                                      short* __restrict__ qs, float* __restrict__ d,
                                      int* __restrict__ bsum) {
    GRID_DEP();
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

// Exact integer dot of one 32-block with quantized activations.
__device__ __forceinline__ int block_isum(int ty, const u8* blk, CanonQ qa) {
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
                                  const float* __restrict__ as, int n, int ra, int add,
                                  float* __restrict__ out) {
    GRID_DEP();
    int g = threadIdx.x >> 3, l = threadIdx.x & 7;
    int rw = 32 / ra;
    int j = blockIdx.x * rw + g / ra;
    int i = blockIdx.y * ra + g % ra;
    bool ok = j < m && i < n;
    int nb = k / 32;
    int ts = gr_type_size(ty);
    float lane = 0.0f;
    if (ok) {
        const u8* wr = w + (long long)j * nb * ts;
        const short* qa = qs + (long long)i * k;
        const float* dr = ad + (long long)i * nb;
        const float* sr = as + (long long)i * nb;
        for (int b = l; b < nb; b += 8) {
            const u8* blk = wr + (long long)b * ts;
            int isum = block_isum(ty, blk, canon_block(qa, nb, b));
            float dw = q_f16_at(blk);
            float t = q_mul(q_mul(dw, dr[b]), __int2float_rn(isum));
            if (ty == TY_Q4_1 || ty == TY_Q5_1) t = q_add(t, q_mul(q_f16_at(blk + 2), sr[b]));
            lane = q_add(lane, t);
        }
    }
    float r = q_group_tree8(lane);
    if (ok && l == 0) mm_store(out + (long long)i * m + j, r, add != 0);
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
                                 const int* __restrict__ bsum, int n, int ra, int add,
                                 float* __restrict__ out) {
    GRID_DEP();
    int g = threadIdx.x >> 3, l = threadIdx.x & 7;
    int rw = 32 / ra;
    int j = blockIdx.x * rw + g / ra;
    int i = blockIdx.y * ra + g % ra;
    bool ok = j < m && i < n;
    int nb = k / 256;
    int ts = gr_type_size(ty);
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
    if (ok && l == 0) mm_store(out + (long long)i * m + j, r, add != 0);
}

// Float weights: one warp per output (i, j); 8 warps per block.
extern "C" __global__ void mm_float(const u8* __restrict__ w, int m, int k, int ty,
                                    const float* __restrict__ x, int n, int add,
                                    float* __restrict__ out) {
    GRID_DEP();
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
    if (ok && l == 0) mm_store(out + (long long)i * m + j, r, add != 0);
}

// Decode-shaped canonical matmul for 32-block weights (Q4_0, Q4_1, Q5_0,
// Q5_1, Q8_0), bitwise equal to mm_q32: one warp per MV_EXACT_WR weight
// rows and up to MV_EXACT_ROWS activation rows. Lane l decodes blocks l,
// l + 32, ... of each of its weight rows in registers (coalesced: the warp
// streams 32 consecutive blocks, and their activations' chunks as 512
// contiguous bytes, canon_chunk), takes the exact integer dot with the
// 16-bit activations (__dp2a; integer sums do not depend on order) and the
// block's canonical term. The 16-bit activations are twice the int8 ones
// of the fast kernel, so a warp serves MV_EXACT_WR weight rows with each
// activation load. The terms are then folded in the canonical order, per
// weight row: canonical lane c = b % 8 adds its blocks' terms in increasing
// b, so in each group of 32 blocks warp lane c < 8 adds its own term and
// those of lanes c + 8, c + 16, c + 24 (shuffled to it), skipping blocks
// past the row. The 8-lane tree of lanes 0..7 finishes. MV_EXACT_WR comes
// from the host (the prelude of ops/kernels.rs), which sizes the grid by it.
#define MV_EXACT_ROWS 8

// Adds this group's term t (lane l's block i0 + l) to acc in the canonical
// order (see above). FULL: the whole group is inside the row (no checks).
template <bool FULL>
__device__ __forceinline__ float mv_exact_fold(float a, float t, int i0, int nb, int l) {
    float t1 = __shfl_down_sync(0xffffffffu, t, 8);
    float t2 = __shfl_down_sync(0xffffffffu, t, 16);
    float t3 = __shfl_down_sync(0xffffffffu, t, 24);
    if (l < 8) {
        if (FULL || i0 + l < nb) a = q_add(a, t);
        if (FULL || i0 + l + 8 < nb) a = q_add(a, t1);
        if (FULL || i0 + l + 16 < nb) a = q_add(a, t2);
        if (FULL || i0 + l + 24 < nb) a = q_add(a, t3);
    }
    return a;
}

// Moves the activations (quant_act32's qs, ad, as and its integer sums si)
// and the output to this CTA's group of NR activation rows (grid x);
// returns how many rows it has.
template <int NR>
__device__ __forceinline__ int exact_act_group(int k, int m, int n_all,
                                               const short* __restrict__& qs,
                                               const float* __restrict__& ad,
                                               const float* __restrict__& as,
                                               const int* __restrict__& si,
                                               float* __restrict__& out) {
    int g0 = blockIdx.x * NR;
    int nb = k / 32;
    si = (const int*)(as + (long long)n_all * nb) + (long long)g0 * nb;  // exact_isums
    qs += (long long)g0 * k;
    ad += (long long)g0 * nb;
    as += (long long)g0 * nb;
    out += (long long)g0 * m;
    return min(NR, n_all - g0);
}

// A block's canonical term: the exact integer dot of its decoded weights
// w[8] with its 32 16-bit activations v (__dp2a; integers, so any order
// gives the same bits), times the scales as the cpu multiplies them, plus
// the minimum's term for Q4_1 / Q5_1 (mw, asr). w holds Q4_0 / Q5_0 values
// without their offset (decode_unit's RAW); the dot starts at -ioff, the
// offset times the activations' integer sum, so it ends at the same integer
// as the offset values' dot.
template <int TY>
__device__ __forceinline__ float exact_term(const int4* v, const int* w, float dw, float adr,
                                            float mw, float asr, int ioff) {
    // Two independent chains (integers: the same sum in any order).
    int is[2] = {-ioff, 0};
#pragma unroll
    for (int h = 0; h < 4; h++) {  // words 2h, 2h + 1 of the block
        int& c = is[h & 1];
        c = __dp2a_lo(v[h].x, w[2 * h], c);
        c = __dp2a_hi(v[h].y, w[2 * h], c);
        c = __dp2a_lo(v[h].z, w[2 * h + 1], c);
        c = __dp2a_hi(v[h].w, w[2 * h + 1], c);
    }
    float t = q_mul(q_mul(dw, adr), __int2float_rn(is[0] + is[1]));
    if (TY == TY_Q4_1 || TY == TY_Q5_1) t = q_add(t, q_mul(mw, asr));
    return t;
}

// The terms of a group's blocks (lane l's block b; ok: b is inside the
// row) with the n activation rows, folded into acc. dec(q, w, dw, mw)
// gives weight row q's decoded block (decode_unit's RAW values).
template <int TY, int NR, bool FULL, class Dec>
__device__ __forceinline__ void mv_exact_terms(int i0, int b, bool ok, Dec dec, int nw, int nb,
                                               const short* __restrict__ qs,
                                               const float* __restrict__ ad,
                                               const float* __restrict__ as,
                                               const int* __restrict__ si, int k, int n, int l,
                                               float (*acc)[NR]) {
    // Q4_0 / Q5_0 values stay unsigned (decode_unit's RAW): the offset is
    // taken once per block and activation row, from si.
    constexpr int OFF = TY == TY_Q4_0 ? 8 : TY == TY_Q5_0 ? 16 : 0;
#pragma unroll
    for (int r = 0; r < NR; r++) {
        if (r >= n) break;
        int4 v[4];
        float adr = 0.0f, asr = 0.0f;
        int ioff = 0;
        if (ok) {
            const short* qr = qs + (long long)r * k;
#pragma unroll
            for (int h = 0; h < 4; h++)  // activations 8h .. 8h + 7 (canon_chunk)
                v[h] = *(const int4*)(qr + canon_chunk(nb, b, h));
            adr = ad[(long long)r * nb + b];
            if (TY == TY_Q4_1 || TY == TY_Q5_1) asr = as[(long long)r * nb + b];
            if (OFF) ioff = OFF * si[(long long)r * nb + b];
        }
#pragma unroll
        for (int q = 0; q < MV_EXACT_WR; q++) {
            float t = 0.0f;
            if (ok && (FULL || q < nw)) {
                int w[8];
                float dw, mw;
                dec(q, w, dw, mw);
                t = exact_term<TY>(v, w, dw, adr, mw, asr, ioff);
            }
            acc[q][r] = mv_exact_fold<FULL>(acc[q][r], t, i0, nb, l);
        }
    }
}

// One group of 32 blocks from i0 (see mv_exact_rows). FULL: all of it
// is inside the row and all MV_EXACT_WR weight rows inside the matrix, so
// nothing is checked (the same loads, terms and additions).
template <int TY, int NR, bool FULL>
__device__ __forceinline__ void mv_exact_group(int i0, const u8* __restrict__ wr,
                                               long long row_bytes, int nw, int nb,
                                               const short* __restrict__ qs,
                                               const float* __restrict__ ad,
                                               const float* __restrict__ as,
                                               const int* __restrict__ si, int k, int n, int l,
                                               unsigned long long pol, float (*acc)[NR]) {
    int b = i0 + l;
    bool ok = FULL || b < nb;
    int w[MV_EXACT_WR][8];
    float dw[MV_EXACT_WR], mw[MV_EXACT_WR], a1;
#pragma unroll
    for (int q = 0; q < MV_EXACT_WR; q++) {
        dw[q] = mw[q] = 0.0f;
        if (ok && (FULL || q < nw))
            decode_unit<TY, MV_L2_POL, true>(wr + q * row_bytes, b, w[q], dw[q], a1, mw[q], pol);
    }
    auto dec = [&](int q, int* wq, float& d, float& m) {
#pragma unroll
        for (int e = 0; e < 8; e++) wq[e] = w[q][e];
        d = dw[q];
        m = mw[q];
    };
    mv_exact_terms<TY, NR, FULL>(i0, b, ok, dec, nw, nb, qs, ad, as, si, k, n, l, acc);
}

// MV_EXACT_PIPE (tuning knob): 1: Q4_0's whole groups keep the next
// group's raw weight words in flight while the current one is computed
// (mv_exact_q4_0_pipe); 0: one group's loads at a time. Loads only: the
// same bits. Measured on an H100 (2026-11-27, 8B Q4_0 tg128 /
// tg128@d512, MV_EXACT_R1_MINB 4): 0: 311.0 / 293.3, 1: 309.5 / 295.1
// tok/s; it pays with the registers of MV_EXACT_R1_MINB 3 (320.2 / 303.2).
// On an H200 with the activations in tiles (2026-11-27): 1: 415.2 / 386.1,
// 0: 382.8 / 358.0.
#ifndef MV_EXACT_PIPE
#define MV_EXACT_PIPE 1
#endif

// The whole groups of a warp's MV_EXACT_WR Q4_0 rows (all inside the
// matrix) for one activation row, software-pipelined: group i0 + 32's
// words are loaded before group i0's terms, which decode each row's block
// just before its dot (fewer registers live). Returns where the groups left
// for mv_exact_group begin.
__device__ __forceinline__ int mv_exact_q4_0_pipe(const u8* __restrict__ wr, long long row_bytes,
                                                  int nb, const short* __restrict__ qs,
                                                  const float* __restrict__ ad,
                                                  const float* __restrict__ as,
                                                  const int* __restrict__ si, int k, int n,
                                                  int l, unsigned long long pol,
                                                  float (*acc)[1]) {
    constexpr int G = 32, WR = MV_EXACT_WR;
    const int lb = l;  // lane's block in a group
    if (G > nb) return 0;
    u32 cur[WR][5];
    int sh[WR];
    auto load = [&](int i, u32 (*v)[5], int* s5) {
#pragma unroll
        for (int q = 0; q < WR; q++)
            s5[q] = ld_words<5, MV_L2_POL>(wr + q * row_bytes + (long long)(i + lb) * 18, v[q],
                                           pol);
    };
    auto dec = [&](int q, int* w, float& d, float& m) {
        d = q4_0_words(cur[q], sh[q], w, true);
        m = 0.0f;
    };
    load(0, cur, sh);
    int i0 = 0;
    for (; i0 + 2 * G <= nb; i0 += G) {
        u32 nxt[WR][5];
        int shn[WR];
        load(i0 + G, nxt, shn);
        mv_exact_terms<TY_Q4_0, 1, true>(i0, i0 + lb, true, dec, WR, nb, qs, ad, as, si, k, n, l,
                                         acc);
#pragma unroll
        for (int q = 0; q < WR; q++) {
            sh[q] = shn[q];
#pragma unroll
            for (int e = 0; e < 5; e++) cur[q][e] = nxt[q][e];
        }
    }
    mv_exact_terms<TY_Q4_0, 1, true>(i0, i0 + lb, true, dec, WR, nb, qs, ad, as, si, k, n, l,
                                     acc);
    return i0 + G;
}

// wr: the warp's first weight row; row_bytes apart; nw (1..MV_EXACT_WR) of
// them are inside the matrix; n (<= NR) activation rows. Whole groups of a warp with all its rows run unchecked, the rest checked.
template <int TY, int NR>
__device__ __forceinline__ void mv_exact_rows(const u8* __restrict__ wr, long long row_bytes,
                                              int nw, int nb, const short* __restrict__ qs,
                                              const float* __restrict__ ad,
                                              const float* __restrict__ as,
                                              const int* __restrict__ si, int k, int n, int l,
                                              float (*acc)[NR]) {
    // The weights' L2 policy (MV_L2_POL, dequant.cuh; loads only).
    unsigned long long pol = MV_L2_POL ? l2_evict_first() : 0ull;
    int i0 = 0;
    if (MV_EXACT_PIPE && TY == TY_Q4_0 && NR == 1 && nw == MV_EXACT_WR)
        i0 = mv_exact_q4_0_pipe(wr, row_bytes, nb, qs, ad, as, si, k, n, l, pol,
                                (float(*)[1])acc);
    if (nw == MV_EXACT_WR)
        for (; i0 + 32 <= nb; i0 += 32)
            mv_exact_group<TY, NR, true>(i0, wr, row_bytes, nw, nb, qs, ad, as, si, k, n, l, pol,
                                         acc);
    for (; i0 < nb; i0 += 32)
        mv_exact_group<TY, NR, false>(i0, wr, row_bytes, nw, nb, qs, ad, as, si, k, n, l, pol,
                                      acc);
}

// Grid: (ceil(n / NR), job CTAs of 8 * MV_EXACT_WR weight rows); block
// 256 threads (8 warps). qs, ad, as: quant_act32's outputs. NR =
// MV_EXACT_ROWS (mv_exact32) or 1 (mv_exact32_r1, batch-1 decode: fewer
// registers); one row's terms and their fold are the same in both, so are
// its bits.
template <int NR>
__device__ __forceinline__ void mv_exact32_body(MmJobs jobs, int k, int ty,
                                                const short* __restrict__ qs,
                                                const float* __restrict__ ad,
                                                const float* __restrict__ as, int n_all) {
    MmJob jb = mm_job(jobs, blockIdx.y);
    int m = jb.m;
    float* __restrict__ out = jb.out;
    int warp = threadIdx.x >> 5;
    int row0 = (jb.by * (blockDim.x >> 5) + warp) * MV_EXACT_WR;
    int l = threadIdx.x & 31;
    if (row0 >= m) return;
    int nw = min(MV_EXACT_WR, m - row0);
    const int* si;
    int n = exact_act_group<NR>(k, m, n_all, qs, ad, as, si, out);
    int nb = k / 32;
    long long row_bytes = (long long)nb * gr_type_size(ty);
    const u8* wr = jb.w + row0 * row_bytes;
    float acc[MV_EXACT_WR][NR];
#pragma unroll
    for (int q = 0; q < MV_EXACT_WR; q++)
#pragma unroll
        for (int r = 0; r < NR; r++) acc[q][r] = 0.0f;
    switch (ty) {
        case TY_Q4_0: mv_exact_rows<TY_Q4_0, NR>(wr, row_bytes, nw, nb, qs, ad, as, si, k, n, l, acc); break;
        case TY_Q4_1: mv_exact_rows<TY_Q4_1, NR>(wr, row_bytes, nw, nb, qs, ad, as, si, k, n, l, acc); break;
        case TY_Q5_0: mv_exact_rows<TY_Q5_0, NR>(wr, row_bytes, nw, nb, qs, ad, as, si, k, n, l, acc); break;
        case TY_Q5_1: mv_exact_rows<TY_Q5_1, NR>(wr, row_bytes, nw, nb, qs, ad, as, si, k, n, l, acc); break;
        default: mv_exact_rows<TY_Q8_0, NR>(wr, row_bytes, nw, nb, qs, ad, as, si, k, n, l, acc); break;
    }
#pragma unroll
    for (int q = 0; q < MV_EXACT_WR; q++) {
        if (q >= nw) break;
#pragma unroll
        for (int r = 0; r < NR; r++) {
            if (r >= n) break;
            float v = q_group_tree8(acc[q][r]);
            if (l == 0) mm_store(out + (long long)r * m + row0 + q, v, jb.add);
        }
    }
}
// MV_EXACT_R1_MINB (tuning knob): CTAs per SM to fit (registers capped) of
// the one-row kernels; 0 leaves the compiler's choice. Measured on an H100
// (2026-11-22, exact tg128, 8B Q4_0 / Q8_0): 0: 250.2 / 210.6, 4: 253.5 /
// 210.8, 6: 200.5 / 169.3 (spills), 8: 155.3 / 112.2 tok/s. With the
// software-pipelined Q4_0 loop (MV_EXACT_PIPE, 2026-11-27, 8B Q4_0 tg128 /
// tg128@d512): 4 (64 registers, 16 bytes spilled): 309.5 / 295.1, 3: 320.2
// / 303.2 tok/s. With the activations in tiles (H200, 2026-11-27): 3:
// 415.2 / 386.1, 2: 417.0 / 388.1 (1B: 1,308.3 / 1,203.4 against 1,315.4 /
// 1,191.7), 4: 405.8 / 381.3. The arithmetic is the same.
#ifndef MV_EXACT_R1_MINB
#define MV_EXACT_R1_MINB 3
#endif
#if MV_EXACT_R1_MINB > 0
#define MV_EXACT_R1_BOUNDS __launch_bounds__(256, MV_EXACT_R1_MINB)
#else
#define MV_EXACT_R1_BOUNDS
#endif
#define MV_EXACT_ENTRY(NAME, BOUNDS, NR)                                                     \
    extern "C" __global__ void BOUNDS NAME(MmJobs jobs, int k, int ty,                       \
                                           const short* __restrict__ qs,                     \
                                           const float* __restrict__ ad,                     \
                                           const float* __restrict__ as, int n_all) {        \
        GRID_DEP();                                                                          \
        mv_exact32_body<NR>(jobs, k, ty, qs, ad, as, n_all);                                 \
    }
MV_EXACT_ENTRY(mv_exact32, , MV_EXACT_ROWS)
MV_EXACT_ENTRY(mv_exact32_r1, MV_EXACT_R1_BOUNDS, 1)
