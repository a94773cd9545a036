// `exact` mode's batched-decode and prefill matmul on 32-block weights
// (Q4_0, Q4_1, Q8_0; k a multiple of 256): the canonical arithmetic of
// mm_q32 (kernels/matmul.cu, canon.rs) with each block's integer dot taken
// on the int8 tensor cores. Bitwise mm_q32, so bitwise the cpu.
//
// Why the tensor cores can reproduce it: the canonical term of block b is
//   t_b = (d_w * d_x) * float(I_b)   [Q4_1: + m_w * s_x]
// with I_b the exact integer dot of the weights' integers and the row's
// 16-bit activations (quant_act32). A 16-bit activation q is 256 h + l with
// h = q >> 8 in -128..127 (int8) and l = q & 255 in 0..255 (uint8), so
//   I_b = 256 * (w . h) + (w . l)
// where both dots are exact int8 x int8 / int8 x uint8 MMAs (PTX
// mma.m16n8k32 .s8.s8 and .s8.u8). Each of them is below 2^22 in magnitude
// (32 * 128 * 127, 32 * 255 * 127), so an accumulator started at the bit
// pattern of 1.5 * 2^23 ends at the float 1.5 * 2^23 + dot exactly (as in
// matmul_mma_fast.cu); subtracting 1.5 * 2^23 is exact, so is the product
// 256 * H, and the add 256 H + L rounds the exact integer I_b once:
// __int2float_rn(I_b)'s bits, without a conversion instruction (an
// eighth-rate one on sm_90). No FMA anywhere (tests/cuda_nvrtc.rs).
// The two scale products and the term use mm_q32's unfused multiplies and
// adds (q_mul, q_add) in its order. The terms then go where mm_q32 puts
// them: canonical lane c = b % 8 adds its blocks' terms in increasing b,
// and the 8-lane tree (((c0 + c4) + (c2 + c6)) + ((c1 + c5) + (c3 + c7)))
// finishes. A k chunk of 8 blocks holds one block of each lane, so a thread
// keeps its outputs' 8 lanes in registers and adds chunk block bi to lane
// bi: the same operands in the same order for any tile, row count or batch.
//
// Geometry: a CTA of 8 KG warps (KG = 1 or 2 k groups) owns XM_MR = 64
// weight rows x XM_NR = 32 activation rows; warp w takes weight rows 16 (w
// % 4) .. (one m16 tile), activation rows 16 ((w / 4) % 2) .. (two n8
// tiles; a tile wholly past n is skipped) and k group w / 8. With one
// group a thread keeps 8 outputs x 8 lanes; with two, group kg takes
// blocks 4 kg .. + 3 of every chunk, that is canonical lanes 0..3 or 4..7,
// so a thread keeps 8 outputs x 4 lanes, and at the end group 1 hands its
// lanes to group 0 through shared memory, which runs the tree. k runs in chunks of 8 blocks; each
// chunk's raw weight blocks,
// 16-bit activations (from quant_act32's canon_chunk layout into plain
// block order) and the blocks' activation scales land in shared memory by
// cp.async, STAGES - 1 chunks in flight while one is computed. Rows past
// m or n are not copied: whatever a stage holds there reaches only outputs
// that are never stored.
//
// Fragments (PTX mma.m16n8k32, g = lane / 4, t = lane % 4): a0 / a1 are
// weight rows g / g + 8 at k 4t..4t+3, a2 / a3 the same rows at k 16 +
// 4t..; b0 / b1 activation row g at k 4t.. / 16 + 4t..; c0, c1 weight row
// g, activation rows 2t, 2t + 1; c2, c3 the same for row g + 8. A Q4_0 /
// Q4_1 block's byte j holds k = j (low nibble) and k = j + 16 (high).

#define XM_MR 64
#define XM_NR 32
// Threads of a CTA of KG k groups.
#define XM_THREADS(KG) (256 * (KG))
// Activation row stride in shared memory, in 16-bit values: 8 blocks of 32
// and a pad, so that a fragment load's rows g = 0..3 start 8 banks apart.
#define XM_XLD (8 * 32 + 16)
#define XM_MAGIC 0x4B400000
#define XM_MAGIC_F 12582912.0f

// One stage: weights, activations, then the scales d [8][XM_NR] and the
// Q4_1 minimum's s [8][XM_NR] (ops/matmul/exact.rs xm_smem: the same sum).
__device__ constexpr int xm_stage_bytes(int ty) {
    return XM_MR * mq_wld(ty) + XM_NR * XM_XLD * 2 + 2 * 8 * XM_NR * 4;
}

// c = a . b + XM_MAGIC over one k32 step: weights (s8) by the activations'
// high bytes (s8, BT = "s8") or low bytes (u8, BT = "u8"). Not volatile: a
// pure function of its registers, which the compiler may schedule among
// the other blocks' work.
#define XM_MMA(BT, a, b0, b1, c)                                                         \
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8." BT ".s32 {%0,%1,%2,%3}, "            \
        "{%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};"                                     \
        : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])                                 \
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(XM_MAGIC))

// Queues chunk `b0` (its first block, a multiple of 8) into stage st:
// XM_MR rows of raw weights from CTA row `by` (row bytes rb), XM_NR rows of
// 16-bit activations (qs: canon_chunk's layout, rows of k) stored per
// block (row r, block bi: values at r XM_XLD + 32 bi), the blocks' d
// [bi][r] and (Q4_1) s [bi][r].
template <int TY, int KG>
__device__ __forceinline__ void xm_issue(const u8* __restrict__ w, int m, long long rb,
                                         const short* __restrict__ qs,
                                         const float* __restrict__ ad,
                                         const float* __restrict__ as, int k, int n, int b0,
                                         int by, u8* st) {
    constexpr int BS = gr_type_size(TY), WLD = mq_wld(TY), WP = 8 * BS / 16;
    constexpr int T = XM_THREADS(KG);
    int tid = threadIdx.x;
    int rows = min(XM_MR, m - by * XM_MR);
    const u8* wb = w + (long long)by * XM_MR * rb + (long long)b0 * BS;
#pragma unroll
    for (int j = 0; j < (XM_MR * WP + T - 1) / T; j++) {
        int i = tid + j * T;
        int r = i / WP, p = i % WP;
        if (i < XM_MR * WP && r < rows) cp_async16(st + r * WLD + 16 * p, wb + r * rb + 16 * p, 16);
    }
    short* sx = (short*)(st + XM_MR * WLD);
    int nb = k / 32;
    // 16-byte pieces (8 values: canon_chunk's chunk h of block b0 + bi):
    // consecutive threads take consecutive blocks of one chunk index, which
    // lie back to back in qs.
#pragma unroll
    for (int j = 0; j < XM_NR * 32 / T; j++) {
        int i = tid + j * T;
        int r = i >> 5, h = (i >> 3) & 3, bi = i & 7;
        if (r < n)
            cp_async16(sx + r * XM_XLD + 32 * bi + 8 * h,
                       qs + (long long)r * k + canon_chunk(nb, b0 + bi, h), 16);
    }
    float* sd = (float*)(sx + XM_NR * XM_XLD);
    // 2 planes x 8 blocks x XM_NR rows: d, then (Q4_1) s.
#pragma unroll
    for (int j = 0; j < 2 * 8 * XM_NR / T; j++) {
        int i = tid + j * T;
        int r = i % XM_NR, bi = (i / XM_NR) % 8, pl = i / (8 * XM_NR);
        if (r < n && (pl == 0 || TY == TY_Q4_1))
            cp_async4(sd + (8 * pl + bi) * XM_NR + r,
                      (pl == 0 ? ad : as) + (long long)r * nb + b0 + bi, 4);
    }
}

// acc[j] (canonical lane L kg + j, L = 8 / KG lanes a group) += the terms
// of block L kg + j of the chunk in stage st for this thread's outputs in
// its first NT n8 tiles: [lane][n8 tile][fragment element].
template <int TY, int KG, int NT>
__device__ __forceinline__ void xm_chunk(const u8* st, float (*acc)[2][4]) {
    constexpr int L = 8 / KG;
    constexpr int BS = gr_type_size(TY), WLD = mq_wld(TY);
    constexpr int QOFF = TY == TY_Q4_1 ? 4 : 2;
    int wid = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int g = lane >> 2, t = lane & 3;
    int wm = wid & 3, wn = (wid >> 2) & 1, kg = wid >> 3;
    const u8* sw = st + (16 * wm + g) * WLD;
    const short* sx = (const short*)(st + XM_MR * WLD) + (16 * wn + g) * XM_XLD;
    const float* sd = (const float*)(st + XM_MR * WLD + XM_NR * XM_XLD * 2) + 16 * wn + 2 * t;
#pragma unroll
    for (int j = 0; j < L; j++) {
        int bi = L * kg + j;
        // Block bi's integers are 4-byte aligned for odd bi (Q4_0, Q8_0:
        // BS bi + 2 = 2 mod 4 for even bi), always for Q4_1.
        constexpr bool AL_ALL = TY == TY_Q4_1;
        bool al = AL_ALL || (j & 1);
        u32 a[4];
        float dw[2], mw[2];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const u8* blk = sw + 8 * h * WLD + bi * BS;
            dw[h] = q_f16(*(const u16*)blk);
            mw[h] = TY == TY_Q4_1 ? q_f16(*(const u16*)(blk + 2)) : 0.0f;
            const u8* q = blk + QOFF + 4 * t;
            if (TY == TY_Q8_0) {
                a[h] = al ? lds_word<true>(q) : lds_word<false>(q);
                a[2 + h] = al ? lds_word<true>(q + 16) : lds_word<false>(q + 16);
            } else {
                u32 v = al ? lds_word<true>(q) : lds_word<false>(q);
                u32 lo = v & 0x0F0F0F0Fu, hi = (v >> 4) & 0x0F0F0F0Fu;
                if (TY == TY_Q4_0) {
                    // q - 8 per byte (mm_q32's block_isum): -8..7 as int8.
                    lo = __vsub4(lo, 0x08080808u);
                    hi = __vsub4(hi, 0x08080808u);
                }
                a[h] = lo;
                a[2 + h] = hi;
            }
        }
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            // Activation row g of tile nt, block bi: values 4t..4t+3 and
            // 16+4t..; each 16-bit value splits into its high (int8) and low
            // (uint8) bytes.
            const short* xr = sx + 8 * nt * XM_XLD + 32 * bi;
            uint2 p0 = *(const uint2*)(xr + 4 * t);
            uint2 p1 = *(const uint2*)(xr + 16 + 4 * t);
            u32 h0 = __byte_perm(p0.x, p0.y, 0x7531), l0 = __byte_perm(p0.x, p0.y, 0x6420);
            u32 h1 = __byte_perm(p1.x, p1.y, 0x7531), l1 = __byte_perm(p1.x, p1.y, 0x6420);
            int ch[4], cl[4];
            XM_MMA("s8", a, h0, h1, ch);
            XM_MMA("u8", a, l0, l1, cl);
            // d (and s) of activation rows 2t, 2t + 1 of this tile.
            float2 d = *(const float2*)(sd + bi * XM_NR + 8 * nt);
            float2 s = TY == TY_Q4_1 ? *(const float2*)(sd + (8 + bi) * XM_NR + 8 * nt)
                                     : make_float2(0.0f, 0.0f);
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float hf = __int_as_float(ch[e]) - XM_MAGIC_F;  // exact
                float lf = __int_as_float(cl[e]) - XM_MAGIC_F;  // exact
                // 256 H is exact; the add rounds I once: __int2float_rn(I).
                float isum = q_add(q_mul(hf, 256.0f), lf);
                float tt = q_mul(q_mul(dw[e >> 1], (e & 1) ? d.y : d.x), isum);
                if (TY == TY_Q4_1) tt = q_add(tt, q_mul(mw[e >> 1], (e & 1) ? s.y : s.x));
                acc[j][nt][e] = q_add(acc[j][nt][e], tt);
            }
        }
    }
}

template <int TY, int KG, int STAGES>
__device__ __forceinline__ void xm_body(const u8* __restrict__ w, int m, long long rb,
                                        const short* __restrict__ qs,
                                        const float* __restrict__ ad,
                                        const float* __restrict__ as, int k, int n, int by,
                                        u8* smem, float (*acc)[2][4]) {
    constexpr int STAGE = xm_stage_bytes(TY);
    int nch = k / 256;
    // This warp's n8 tiles with rows inside n (warp-uniform).
    int nl = min(2, max(0, (n - 16 * ((threadIdx.x >> 7) & 1) + 7) / 8));
#pragma unroll
    for (int c = 0; c < STAGES - 1; c++) {
        if (c < nch) xm_issue<TY, KG>(w, m, rb, qs, ad, as, k, n, 8 * c, by, smem + c * STAGE);
        cp_async_commit();
    }
    for (int c = 0; c < nch; c++) {
        // Every group but the newest STAGES - 2 is complete: chunk c.
        cp_async_wait_group<STAGES - 2>();
        // Chunk c landed for every thread, and every warp is done with the
        // stage the next issue overwrites (chunk c - 1's).
        __syncthreads();
        int nx = c + STAGES - 1;
        if (nx < nch)
            xm_issue<TY, KG>(w, m, rb, qs, ad, as, k, n, 8 * nx, by, smem + (nx % STAGES) * STAGE);
        cp_async_commit();
        const u8* st = smem + (c % STAGES) * STAGE;
        // One k group always takes both tiles: its registers hold no second
        // instantiation (measured faster on prefill than skipping).
        if (KG == 1 || nl == 2)
            xm_chunk<TY, KG, 2>(st, acc);
        else if (nl == 1)
            xm_chunk<TY, KG, 1>(st, acc);
    }
}

// Each job j of the table (one type and k; CTA rows blockIdx.y in its range
// of ceil(m_j / XM_MR) tiles): out_j (n, m_j) = (or +=) x (n, k) · w_jᵀ,
// x given as quant_act32's qs (n, k) in canon_chunk's layout, ad (n, k /
// 32) and as (n, k / 32). Grid: (ceil(n / XM_NR), the table's CTAs);
// XM_THREADS(KG) threads; dynamic shared memory STAGES *
// xm_stage_bytes(ty).
template <int KG, int STAGES>
__device__ __forceinline__ void xm_kernel(const MmJobs& J, int k, long long rb, int ty,
                                          const short* __restrict__ qs,
                                          const float* __restrict__ ad,
                                          const float* __restrict__ as, int n_all) {
    GRID_DEP();
    constexpr int L = 8 / KG;
    extern __shared__ __align__(16) u8 xm_smem[];
    MmJob jb = mm_job(J, blockIdx.y);
    int m = jb.m;
    int g0 = blockIdx.x * XM_NR;
    int n = min(XM_NR, n_all - g0);
    int nb = k / 32;
    qs += (long long)g0 * k;
    ad += (long long)g0 * nb;
    as += (long long)g0 * nb;
    float acc[L][2][4];
#pragma unroll
    for (int c = 0; c < L; c++)
#pragma unroll
        for (int i = 0; i < 2; i++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[c][i][e] = 0.0f;
    if (ty == TY_Q4_0)
        xm_body<TY_Q4_0, KG, STAGES>(jb.w, m, rb, qs, ad, as, k, n, jb.by, xm_smem, acc);
    else if (ty == TY_Q4_1)
        xm_body<TY_Q4_1, KG, STAGES>(jb.w, m, rb, qs, ad, as, k, n, jb.by, xm_smem, acc);
    else
        xm_body<TY_Q8_0, KG, STAGES>(jb.w, m, rb, qs, ad, as, k, n, jb.by, xm_smem, acc);
    // k group 1 hands lanes 4..7 to group 0 through shared memory (the
    // stages are free once every copy has landed and every warp is past
    // the last chunk): [lane][tile][element][thread of the group].
    constexpr int TG = XM_THREADS(1);
    float* red = (float*)xm_smem;
    int tg = threadIdx.x % TG;
    if (KG == 2) {
        cp_async_wait_all();
        __syncthreads();
        if (threadIdx.x >= TG) {
#pragma unroll
            for (int x = 0; x < L * 8; x++) red[x * TG + tg] = (&acc[0][0][0])[x];
        }
        __syncthreads();
        if (threadIdx.x >= TG) return;  // no barrier follows
    }
    int wid = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int g = lane >> 2, t = lane & 3;
    int r0 = jb.by * XM_MR + 16 * (wid & 3) + g;
    int i0 = g0 + 16 * (wid >> 2) + 2 * t;
#pragma unroll
    for (int nt = 0; nt < 2; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int row = r0 + 8 * (e >> 1), i = i0 + 8 * nt + (e & 1);
            if (row < m && i < n_all) {
                // The canonical 8-lane tree (q_group_tree8's order); with
                // two k groups lane 4 + j is group 1's acc[j].
                float c[8];
#pragma unroll
                for (int j = 0; j < 8; j++)
                    c[j] = j < L ? acc[j % L][nt][e] : red[(((j - L) * 2 + nt) * 4 + e) * TG + tg];
                float l0 = q_add(c[0], c[4]);
                float l1 = q_add(c[1], c[5]);
                float l2 = q_add(c[2], c[6]);
                float l3 = q_add(c[3], c[7]);
                float r = q_add(q_add(l0, l2), q_add(l1, l3));
                mm_store(jb.out + (long long)i * m + row, r, jb.add);
            }
        }
}

#define XM_ARGS                                                                          \
    MmJobs J, int k, long long rb, int ty, const short *__restrict__ qs,                 \
        const float *__restrict__ ad, const float *__restrict__ as, int n_all
#define XM_PASS J, k, rb, ty, qs, ad, as, n_all
// Two k groups of 8 warps, one CTA per SM, four stages (ops/matmul/mod.rs
// XM_FORMS lists the same).
extern "C" __global__ void __launch_bounds__(XM_THREADS(2), 1) mm_exact_mma(XM_ARGS) {
    xm_kernel<2, 4>(XM_PASS);
}
// One k group of 8 warps (8 lanes a thread), two CTAs per SM, three stages.
extern "C" __global__ void __launch_bounds__(XM_THREADS(1), 2) mm_exact_mma_k1(XM_ARGS) {
    xm_kernel<1, 3>(XM_PASS);
}
