// Prefill attention on tensor cores (fast mode only: its arithmetic differs
// from the split kernel's, so a row's result depends on the kernel its batch
// picked). Each warp owns one (tile, head): a tile is up to 16 consecutive
// batch rows of one sequence (listed by the host). Keys are visited 16 at a
// time through the block table, K and V rows staged in shared memory
// (16-byte loads, any block size): S = Q·Kᵀ with two m16n8k16 f16 MMAs per
// 16 dims, a causal mask by absolute position, an online softmax in base 2
// on the accumulator fragments, then O += P·V with P reused in registers as
// the A operand (fa_step). head_dim a multiple of 16, at most 128. Two
// kernels run these warp steps: flash_attention_prefill (a CTA of one warp
// that loads its own K/V) and flash_attention_prefill_g (the heads of a KV
// head in one CTA, K/V copied once for all of them, double-buffered): the
// same bits.
#define FA_MAXD 128
#define FA_PAD 8


// One warp's state over its tile: rows g and g + 8 of the tile (positions
// pa, pb; -1 past the tile), the Q fragments (scaled by scale * log2 e,
// f16), the output accumulators and the online softmax's (m, l) per row.
struct FaWarp {
    u32 qa[FA_MAXD / 16][4];
    float o[FA_MAXD / 8][4];
    float ma, mb, la, lb;
    int pa, pb;
};

// The tile's rows and Q fragments for head h; returns the tile's largest
// position (every lane).
__device__ __forceinline__ int fa_begin(FaWarp& st, const float* __restrict__ q, int n_heads,
                                        int hd, float scale, int h, int r0, int nr,
                                        const u32* __restrict__ positions) {
    int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    int nkc = hd / 16;
    st.pa = g < nr ? (int)positions[r0 + g] : -1;
    st.pb = g + 8 < nr ? (int)positions[r0 + g + 8] : -1;
    int maxpos = max(st.pa, st.pb);
#pragma unroll
    for (int o = 4; o >= 1; o >>= 1) maxpos = max(maxpos, __shfl_xor_sync(0xffffffffu, maxpos, o * 4));
    const float qs = scale * 1.4426950408889634f;
    const float* qra = q + ((long long)(r0 + min(g, nr - 1)) * n_heads + h) * hd;
    const float* qrb = q + ((long long)(r0 + min(g + 8, nr - 1)) * n_heads + h) * hd;
#pragma unroll
    for (int kc = 0; kc < FA_MAXD / 16; kc++) {
        if (kc >= nkc) break;
        int d = 16 * kc + 2 * t;
        st.qa[kc][0] = pack_f16x2(qra[d] * qs, qra[d + 1] * qs);
        st.qa[kc][1] = pack_f16x2(qrb[d] * qs, qrb[d + 1] * qs);
        st.qa[kc][2] = pack_f16x2(qra[d + 8] * qs, qra[d + 9] * qs);
        st.qa[kc][3] = pack_f16x2(qrb[d + 8] * qs, qrb[d + 9] * qs);
    }
#pragma unroll
    for (int dn = 0; dn < FA_MAXD / 8; dn++)
#pragma unroll
        for (int e = 0; e < 4; e++) st.o[dn][e] = 0.0f;
    st.ma = st.mb = Q_NINF;
    st.la = st.lb = 0.0f;
    return maxpos;
}

// Keys j0 .. j0 + 15, whose K and V rows are ks / vs (16 rows of f16 in
// shared memory): S = Q·Kᵀ with two m16n8k16 f16 MMAs per 16 dims, the
// causal mask by absolute position, the online softmax in base 2 on the
// accumulator fragments, then O += P·V with P reused in registers as the A
// operand. The same steps in the same order whichever kernel loaded ks/vs.
__device__ __forceinline__ void fa_step(FaWarp& st, const u16 (*ks)[FA_MAXD + FA_PAD],
                                        const u16 (*vs)[FA_MAXD + FA_PAD], int j0, int hd) {
    int lane = threadIdx.x & 31, t = lane & 3;
    // ldmatrix: lanes 8m .. 8m + 7 address the rows of matrix m.
    int mq = lane >> 3, mr = lane & 7;
    int nkc = hd / 16;
    // S (16 rows x 16 keys) as two n-tiles of 8 keys; per 16 dims one
    // ldmatrix.x4 gives both tiles' B fragments (matrix m: keys 8 (m / 2)
    // .., dims 8 (m % 2) ..). Each tile's sum runs over the dims in order.
    float s[2][4];
#pragma unroll
    for (int nt = 0; nt < 2; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) s[nt][e] = 0.0f;
#pragma unroll
    for (int kc = 0; kc < FA_MAXD / 16; kc++) {
        if (kc >= nkc) break;
        u32 b[4];
        ldsm_x4(b, &ks[8 * (mq >> 1) + mr][16 * kc + 8 * (mq & 1)]);
        mma_f16_16816(st.qa[kc], b[0], b[1], s[0]);
        mma_f16_16816(st.qa[kc], b[2], b[3], s[1]);
    }
    // Causal mask: key j0 + 8nt + 2t + (e & 1) against the row's position.
    float mxa = st.ma, mxb = st.mb;
#pragma unroll
    for (int nt = 0; nt < 2; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int j = j0 + 8 * nt + 2 * t + (e & 1);
            int p = e < 2 ? st.pa : st.pb;
            if (j > p) s[nt][e] = Q_NINF;
            if (e < 2) mxa = fmaxf(mxa, s[nt][e]);
            else mxb = fmaxf(mxb, s[nt][e]);
        }
#pragma unroll
    for (int o2 = 1; o2 <= 2; o2 <<= 1) {
        mxa = fmaxf(mxa, __shfl_xor_sync(0xffffffffu, mxa, o2));
        mxb = fmaxf(mxb, __shfl_xor_sync(0xffffffffu, mxb, o2));
    }
    float aa = (mxa == Q_NINF) ? 1.0f : exp2f(st.ma - mxa);
    float ab = (mxb == Q_NINF) ? 1.0f : exp2f(st.mb - mxb);
    if (st.ma == Q_NINF) aa = 0.0f;
    if (st.mb == Q_NINF) ab = 0.0f;
    st.ma = mxa;
    st.mb = mxb;
    float suma = 0.0f, sumb = 0.0f;
#pragma unroll
    for (int nt = 0; nt < 2; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            float m = e < 2 ? st.ma : st.mb;
            float pv = (s[nt][e] == Q_NINF) ? 0.0f : exp2f(s[nt][e] - m);
            s[nt][e] = pv;
            if (e < 2) suma += pv;
            else sumb += pv;
        }
    st.la = st.la * aa + suma;
    st.lb = st.lb * ab + sumb;
    u32 pa16[4] = {pack_f16x2(s[0][0], s[0][1]), pack_f16x2(s[0][2], s[0][3]),
                   pack_f16x2(s[1][0], s[1][1]), pack_f16x2(s[1][2], s[1][3])};
    // V's B fragments, two 8-dim tiles per ldmatrix.x4.trans (matrix m:
    // keys 8 (m % 2) .., dims 8 (dn + m / 2) ..; hd / 8 is even).
#pragma unroll
    for (int dn = 0; dn < FA_MAXD / 8; dn += 2) {
        if (dn >= hd / 8) break;
#pragma unroll
        for (int i = 0; i < 2; i++) {
            st.o[dn + i][0] *= aa;
            st.o[dn + i][1] *= aa;
            st.o[dn + i][2] *= ab;
            st.o[dn + i][3] *= ab;
        }
        u32 b[4];
        ldsm_x4_trans(b, &vs[8 * (mq & 1) + mr][8 * (dn + (mq >> 1))]);
        mma_f16_16816(pa16, b[0], b[1], st.o[dn]);
        mma_f16_16816(pa16, b[2], b[3], st.o[dn + 1]);
    }
}

// The tile's rows of head h: O / l; with x16 non-null also as f16 in the
// wgmma prefill GEMM's layout (f16wr_off; to_f16_wr's bits) for the o
// projection after it (the host zeroes the padding rows; head_dim a
// multiple of 16, n_heads x head_dim of 256).
__device__ __forceinline__ void fa_end(FaWarp& st, float* __restrict__ out, int n_heads, int hd,
                                       int h, int r0, int nr, u16* __restrict__ x16) {
    int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    float la = st.la, lb = st.lb;
#pragma unroll
    for (int o2 = 1; o2 <= 2; o2 <<= 1) {
        la += __shfl_xor_sync(0xffffffffu, la, o2);
        lb += __shfl_xor_sync(0xffffffffu, lb, o2);
    }
#pragma unroll
    for (int dn = 0; dn < FA_MAXD / 8; dn++) {
        if (dn >= hd / 8) break;
        int d = 8 * dn + 2 * t;
        const int v = h * hd + d, k = n_heads * hd;
        if (g < nr) {
            float* op = out + ((long long)(r0 + g) * n_heads + h) * hd + d;
            const float a = st.o[dn][0] / la, b = st.o[dn][1] / la;
            op[0] = a;
            op[1] = b;
            if (x16)
                *(u32*)((u8*)x16 + f16wr_off(r0 + g, k, v >> 3) + 2 * (v & 7)) =
                    (u32)q_to_f16(a) | ((u32)q_to_f16(b) << 16);
        }
        if (g + 8 < nr) {
            float* op = out + ((long long)(r0 + g + 8) * n_heads + h) * hd + d;
            const float a = st.o[dn][2] / lb, b = st.o[dn][3] / lb;
            op[0] = a;
            op[1] = b;
            if (x16)
                *(u32*)((u8*)x16 + f16wr_off(r0 + g + 8, k, v >> 3) + 2 * (v & 7)) =
                    (u32)q_to_f16(a) | ((u32)q_to_f16(b) << 16);
        }
    }
}

// Both kernels' arguments. tiles: (n_tiles, 2) = {first batch row, rows
// (1..16)}.
#define FA_ARGS                                                                              \
    const float *__restrict__ q, int n_heads, int n_kv_heads, int head_dim, int block_size,  \
        float scale, const u16 *__restrict__ kc, const u16 *__restrict__ vc,                 \
        const u32 *__restrict__ tables, const u32 *__restrict__ table_off,                   \
        const u32 *__restrict__ row_seq, const u32 *__restrict__ positions,                  \
        const u32 *__restrict__ tiles, float *__restrict__ out, u16 *__restrict__ x16

// One warp per (tile, head), loading its own K/V rows (any head grouping).
extern "C" __global__ void flash_attention_prefill(FA_ARGS) {
    GRID_DEP();
    __shared__ __align__(16) u16 ks[16][FA_MAXD + FA_PAD];
    __shared__ __align__(16) u16 vs[16][FA_MAXD + FA_PAD];
    int tile = blockIdx.x, h = blockIdx.y;
    int lane = threadIdx.x;
    int hd = head_dim, cpr = hd / 8;
    int kvh = h / (n_heads / n_kv_heads);
    int r0 = (int)tiles[2 * tile], nr = (int)tiles[2 * tile + 1];
    const u32* table = tables + table_off[row_seq[r0]];
    FaWarp st;
    int maxpos = fa_begin(st, q, n_heads, hd, scale, h, r0, nr, positions);
    for (int j0 = 0; j0 <= maxpos; j0 += 16) {
        __syncwarp();
        for (int idx = lane; idx < 16 * cpr; idx += 32) {
            int kk = idx / cpr, c = idx - kk * cpr;
            int j = j0 + kk;
            uint4 kv = make_uint4(0, 0, 0, 0), vv = make_uint4(0, 0, 0, 0);
            if (j <= maxpos) {
                long long cell = (long long)table[j / block_size] * block_size + j % block_size;
                long long off = (cell * n_kv_heads + kvh) * hd + 8 * c;
                kv = *(const uint4*)(kc + off);
                vv = *(const uint4*)(vc + off);
            }
            *(uint4*)&ks[kk][8 * c] = kv;
            *(uint4*)&vs[kk][8 * c] = vv;
        }
        __syncwarp();
        fa_step(st, ks, vs, j0, hd);
    }
    fa_end(st, out, n_heads, hd, h, r0, nr, x16);
}

// The same per-warp arithmetic (fa_begin / fa_step / fa_end: the same bits
// as flash_attention_prefill) with the heads that share a KV head in one
// CTA: warp w takes head kvh * group + w (blockDim = 32 * group, group <=
// 8), and the CTA copies each FA_KB-key block of K and V rows once for all
// of them, with cp.async into two buffers so the next block loads while
// the warps compute on this one. Grid (n_tiles, n_kv_heads).
#define FA_KB 32
extern "C" __global__ void __launch_bounds__(256) flash_attention_prefill_g(FA_ARGS) {
    GRID_DEP();
    __shared__ __align__(16) u16 ks[2][FA_KB][FA_MAXD + FA_PAD];
    __shared__ __align__(16) u16 vs[2][FA_KB][FA_MAXD + FA_PAD];
    int tile = blockIdx.x, kvh = blockIdx.y;
    int group = n_heads / n_kv_heads;
    int h = kvh * group + (threadIdx.x >> 5);
    int hd = head_dim, cpr = hd / 8;
    int r0 = (int)tiles[2 * tile], nr = (int)tiles[2 * tile + 1];
    const u32* table = tables + table_off[row_seq[r0]];
    FaWarp st;
    // Every warp has the tile's rows, so the same maxpos.
    int maxpos = fa_begin(st, q, n_heads, hd, scale, h, r0, nr, positions);
    // Block b holds keys FA_KB * b ..; keys past maxpos are zero-filled.
    auto load = [&](int buf, int j0) {
        for (int idx = threadIdx.x; idx < FA_KB * cpr; idx += blockDim.x) {
            int kk = idx / cpr, c = idx - kk * cpr;
            int j = j0 + kk;
            long long off = 0;
            if (j <= maxpos) {
                long long cell = (long long)table[j / block_size] * block_size + j % block_size;
                off = (cell * n_kv_heads + kvh) * hd + 8 * c;
            }
            int n = j <= maxpos ? 16 : 0;
            cp_async16(&ks[buf][kk][8 * c], kc + off, n);
            cp_async16(&vs[buf][kk][8 * c], vc + off, n);
        }
        cp_async_commit();
    };
    int nb = maxpos / FA_KB + 1;
    load(0, 0);
    for (int b = 0; b < nb; b++) {
        int buf = b & 1;
        if (b + 1 < nb) {
            load(buf ^ 1, FA_KB * (b + 1));
            cp_async_wait_group<1>();
        } else {
            cp_async_wait_group<0>();
        }
        __syncthreads();
#pragma unroll
        for (int sub = 0; sub < FA_KB / 16; sub++) {
            int j0 = FA_KB * b + 16 * sub;
            if (j0 <= maxpos) fa_step(st, &ks[buf][16 * sub], &vs[buf][16 * sub], j0, hd);
        }
        __syncthreads();  // before the next load overwrites this buffer
    }
    fa_end(st, out, n_heads, hd, h, r0, nr, x16);
}
