// Batched decode on 32-block quantized weights (Q4_0, Q4_1, Q8_0), `fast`
// mode (2..64 activation rows by default; any count when the tuning table's
// matmul.mma_max_rows sends prefill here too): int8 tensor-core MMA on the weights' own integers and
// quant_q8's int8 activations (the layout the warp-per-row kernels read and
// rms_norm_fast / swiglu_q8 write).
//
// One 32-block is one k32 step of mma.m16n8k32 (s8 x s8 -> s32): the block's
// integer dot products come out of the tensor cores exact (as floats, see
// mma_s8_16832), and the epilogue applies both block scales in f32:
//   Q8_0: acc += A * (d_x * I)                  (w = A q, q in -127..127)
//   Q4_0: acc += A * (d_x * I - 8 s_x)          (w = A (q - 8), q in 0..15)
//   Q4_1: acc += A * (d_x * I) + B * s_x        (w = A q + B)
// with d_x, s_x = d_x * sum(q_x) the activation block's scale and sum
// (quant_q8's float2). The nibbles go into the MMA unshifted (0..15).
//
// A CTA of 4 WN KS warps owns MQ_ROWS = 128 weight rows and TOK activation
// rows (64, or 16 / 8 for small batches); warp w computes weight rows
// 32 (w % 4) .. + 31 (two m16 tiles) for activation rows TOK / WN *
// ((w / 4) % WN) .. (up to TOK / 8 / WN n8 tiles), over k group
// (w / 4) / WN's half of each chunk when KS = 2.
// Each job of a MatMuls table has its own range of CTA rows. k runs in chunks of MQ_KB =
// 8 blocks (256 values): the chunk's raw weight blocks (16-byte pieces: 8
// blocks of 18, 20 or 34 bytes are 144, 160 or 272 bytes), int8
// activations and their float2 scales land in shared memory by cp.async,
// STAGES - 1 chunks in flight while one is computed. The weight fragments are read straight from
// the raw blocks: block b's integers begin at byte BS b + 2 (Q4_1: + 4),
// so for Q4_0 / Q8_0 every other block is only 2-byte aligned and its words
// are assembled from two halves.
//
// Fragments (PTX mma.m16n8k32, .s8; g = lane / 4, t = lane % 4): a0 / a1 are
// rows g / g + 8 at k 4t..4t+3, a2 / a3 the same rows at k 16 + 4t..; b0 / b1
// activation row g at k 4t.. / 16 + 4t..; c0, c1 row g, activation rows 2t,
// 2t + 1, c2, c3 the same for row g + 8. A Q4_0 / Q4_1 block's byte j holds
// k = j (low nibble) and k = j + 16 (high nibble): bytes 4t..4t+3 of the
// block give both a0 (low nibbles) and a2 (high nibbles).
//
// Requirements (ops/matmul/mma.rs checks them): k a multiple of 256 and
// rows 16-byte aligned (row bytes a multiple of 16: true for k % 256 == 0),
// split ranges whole chunks.

// Template arguments (ops/matmul/mq.rs MqKernel lists the same; KS k
// groups of 4 WN warps split every chunk's blocks, see mq_kernel):
// WN warps along the activation rows (4 WN warps, MQ_THREADS(WN) threads),
// TOK activation rows per CTA (each warp then has mq_ntw(WN, TOK) = TOK / 8
// / WN tiles of 8 rows) and STAGES chunk buffers in shared memory:
//   mm_q8_mma      WN 1, TOK 64, STAGES 2 (up to 255 registers)
//   mm_q8_mma_w2   WN 2, TOK 64, STAGES 2 (128 registers)
//   mm_q8_mma_t16_k2b WN 1, TOK 16, STAGES 4, KS 2 (up to 16 rows of 4-bit
//                  weights: the small activation tile leaves room for three
//                  chunks of weights in flight per CTA, where TOK 64 keeps
//                  one; two CTAs of 8 warps, 128 registers; each k group
//                  takes half of every chunk's blocks, group 0 adds the
//                  other's sums in a fixed order before the store)
//   mm_q8_mma_t16_k2 the same at one CTA per SM (Q8_0: 161 KiB)
//   mm_q8_mma_t8_k2b TOK 8, STAGES 3, KS 2, two CTAs (Q8_0 up to 8 rows)
// Raw weights of Q4_0 / Q8_0 by one 2-D bulk tensor copy per chunk (sm_90+:
// the copy engine, a tensor map per job, completing on the stage's
// mbarrier) instead of every thread's cp.async (MQ_TMA=0; Q4_1's padded
// rows and older devices always take cp.async).
#ifndef MQ_TMA
#define MQ_TMA 1
#endif
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define MQ_TMA_ON MQ_TMA
#else
#define MQ_TMA_ON 0
#endif
#define MQ_THREADS(WN) (128 * (WN))
#define MQ_ROWS 128
#define MQ_KB 8
#define MQ_XLD (32 * MQ_KB + 16)  // activation row stride in shared memory
__device__ constexpr int mq_ntw(int wn, int tok) { return tok / 8 / wn; }
__device__ constexpr int mq_min(int a, int b) { return a < b ? a : b; }

__device__ constexpr int mq_stage_bytes(int ty, int tok) {
    return MQ_ROWS * mq_wld(ty) + tok * MQ_XLD + MQ_KB * tok * 8;
}

__device__ __forceinline__ void cp_async8(void* dst, const void* src, int src_bytes) {
    u32 d = (u32)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;" ::"r"(d), "l"(src), "r"(src_bytes));
}

// c = a . b + MQ_MAGIC (one k32 step). The integer dot I of a block is at
// most 32 * 127 * 127 < 2^22 in magnitude, so I + 0x4B400000 is the bit
// pattern of the float MQ_MAGIC_F + I = 1.5 * 2^23 + I, exactly: the
// epilogue (mq_chunk) takes the integer as a float without a conversion
// instruction and folds the subtraction of MQ_MAGIC_F into its first FMA.
#define MQ_MAGIC 0x4B400000
#define MQ_MAGIC_F 12582912.0f
__device__ __forceinline__ void mma_s8_16832(const u32* a, u32 b0, u32 b1, int* c) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%10,%10,%10,%10};"
        : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(MQ_MAGIC));
}

// Queues chunk `b0` (its first block) into stage st: MQ_ROWS rows of raw
// weights, TOK rows of activations, their scales as [block][row]. Rows
// past m or n are not copied: whatever the stage holds there only reaches
// products that are never stored (a few activation rows then cost a few
// copies, not a whole tile of zeros). Thread
// tid copies weight pieces tid + MQ_THREADS(WN) j (row r, piece p of the
// flattened rows: consecutive lanes read consecutive 16-byte pieces),
// walked incrementally (no division per copy).
// With the bulk tensor copy (mq_tma<TY>), thread 0 queues the weights on
// the stage's barrier `bar` by job `map` (rows past m arrive as zeros).
template <int TY>
__device__ constexpr bool mq_tma() {
    return MQ_TMA_ON && TY != TY_Q4_1;
}
template <int TY, int WN, int TOK, int KS>
__device__ __forceinline__ void mq_issue(const u8* __restrict__ w, int m, long long rb,
                                         const signed char* __restrict__ xq,
                                         const float2* __restrict__ xds, int k, int n, int b0,
                                         int by, u8* st, const TmaMap* map, u64* bar) {
    constexpr int BS = gr_type_size(TY), WLD = mq_wld(TY), WP = 8 * BS / 16;
    constexpr int T = MQ_THREADS(WN) * KS;
    constexpr int DR = T / WP, DP = T % WP;
    constexpr int JW = (MQ_ROWS * WP + T - 1) / T;
    int tid = threadIdx.x;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (mq_tma<TY>()) {
        if (tid == 0) {
            mbar_expect(bar, MQ_ROWS * WLD);
            tma_2d_g2s(st, map, b0 / 8 * BS, by * MQ_ROWS, bar);
        }
    } else
#endif
    {
        int rows = min(MQ_ROWS, m - by * MQ_ROWS);
        const u8* wb = w + (long long)by * MQ_ROWS * rb + (long long)b0 * BS;
        int r = tid / WP, p = tid % WP;
#pragma unroll
        for (int j = 0; j < JW; j++) {
            // r passes MQ_ROWS (>= rows) once the pieces run out.
            if (r < rows) cp_async16(st + r * WLD + 16 * p, wb + r * rb + 16 * p, 16);
            r += DR;
            p += DP;
            if (p >= WP) {
                p -= WP;
                r++;
            }
        }
    }
    u8* sx = st + MQ_ROWS * WLD;
    {
        int r0 = tid >> 4, pp = tid & 15;
        const signed char* xb = xq + (long long)r0 * k + 32 * b0 + 16 * pp;
#pragma unroll
        // (rr < n <= TOK also drops the rows past TOK of a ceil'd loop.)
        for (int j = 0; j < (TOK * 16 + T - 1) / T; j++) {
            int rr = r0 + j * (T / 16);
            if (rr < n)
                cp_async16(sx + rr * MQ_XLD + 16 * pp, xb + (long long)j * (T / 16) * k, 16);
        }
    }
    float2* ss = (float2*)(sx + TOK * MQ_XLD);
    {
        int nb = k / 32;
        int r0 = tid / MQ_KB, b = tid % MQ_KB;
        const float2* sb = xds + (long long)r0 * nb + b0 + b;
#pragma unroll
        for (int j = 0; j < (TOK * MQ_KB + T - 1) / T; j++) {
            int rr = r0 + j * (T / MQ_KB);
            if (rr < n) cp_async8(&ss[b * TOK + rr], sb + (long long)j * (T / MQ_KB) * nb, 8);
        }
    }
}

// Q4_0 / Q8_0 only (Q4_1's epilogue needs s; mq_body skips this for it):
// the landed chunk's activation scales (d, s) become (d, c), the
// epilogue's per-row constant (mq_chunk), once per CTA instead of once per
// warp.
template <int TY, int WN, int TOK, int KS>
__device__ __forceinline__ void mq_prepass(u8* st) {
    constexpr int T = MQ_THREADS(WN) * KS;
    float2* ss = (float2*)(st + MQ_ROWS * mq_wld(TY) + TOK * MQ_XLD);
#pragma unroll
    for (int j = 0; j < (TOK * MQ_KB + T - 1) / T; j++) {
        int i = threadIdx.x + T * j;
        if (TOK * MQ_KB % T != 0 && i >= TOK * MQ_KB) break;
        float2 v = ss[i];
        float c = -MQ_MAGIC_F * v.x;
        if (TY == TY_Q4_0) c = fmaf(-8.0f, v.y, c);
        ss[i].y = c;
    }
}

// acc += the chunk in stage st: this warp's 32 weight rows x the first NT
// activation tiles (the rest are past n), block by block. NT is a template
// argument so that no branch separates a block's MMAs: they issue back to
// back (in groups of four tiles, bounding the registers they hold) and
// their latency overlaps the epilogue.
//
// Epilogue per output (two FMAs): the MMA's float D = MQ_MAGIC_F + I (see
// mma_s8_16832), t = d_x D + c with c = -(d_x MQ_MAGIC_F) (Q4_0: - 8 s_x)
// rounded once per activation row and block (mq_prepass), acc += A t (Q4_1:
// + B s_x). The rounding of c is at most 0.375 d_x: an error under half a
// unit of the block's integer dot product, far below the int8 rounding of
// the activations.
template <int TY, int WN, int TOK, int KS, int NT>
__device__ __forceinline__ void mq_chunk(const u8* st, float (*acc)[mq_ntw(WN, TOK)][4]) {
    constexpr int BS = gr_type_size(TY), WLD = mq_wld(TY);
    constexpr int QOFF = TY == TY_Q4_1 ? 4 : 2;
    int wid = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int g = lane >> 2, t = lane & 3;
    // Warp wid: weight rows 32 (wid % 4) .., activation tile group
    // (wid / 4) % WN, k group (wid / 4) / WN (blocks kg * MQ_KB / KS ..).
    int wm = wid & 3, wg = (wid >> 2) % WN, kg = (wid >> 2) / WN;
    int tk0 = 8 * mq_ntw(WN, TOK) * wg;
    const u8* sw = st + (32 * wm + g) * WLD;
    const u8* sx = st + MQ_ROWS * WLD + (tk0 + g) * MQ_XLD;
    const float2* ss = (const float2*)(st + MQ_ROWS * WLD + TOK * MQ_XLD) + tk0 + 2 * t;
#pragma unroll
    for (int bi = 0; bi < MQ_KB / KS; bi++) {
        int b = kg * (MQ_KB / KS) + bi;  // b % 2 == bi % 2 (MQ_KB / KS even)
        // Block b's integers are 4-byte aligned for odd b (Q4_0, Q8_0: BS b
        // + 2 = 2 mod 4 for even b), always for Q4_1.
        u32 a[2][4];
        float A[2][2], B[2][2];
#pragma unroll
        for (int mt = 0; mt < 2; mt++) {
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const u8* blk = sw + (16 * mt + 8 * h) * WLD + b * BS;
                A[mt][h] = q_f16(*(const u16*)blk);
                B[mt][h] = TY == TY_Q4_1 ? q_f16(*(const u16*)(blk + 2)) : 0.0f;
                const u8* q = blk + QOFF + 4 * t;
                bool al = TY == TY_Q4_1 || (bi & 1);
                if (TY == TY_Q8_0) {
                    a[mt][h] = al ? lds_word<true>(q) : lds_word<false>(q);
                    a[mt][2 + h] = al ? lds_word<true>(q + 16) : lds_word<false>(q + 16);
                } else {
                    u32 v = al ? lds_word<true>(q) : lds_word<false>(q);
                    a[mt][h] = v & 0x0F0F0F0Fu;
                    a[mt][2 + h] = (v >> 4) & 0x0F0F0F0Fu;
                }
            }
        }
#pragma unroll
        for (int n0 = 0; n0 < NT; n0 += 4) {
            constexpr int G = NT < 4 ? NT : 4;
            int c[G][2][4];
#pragma unroll
            for (int i = 0; i < G; i++) {
                const u8* xr = sx + 8 * (n0 + i) * MQ_XLD + 32 * b + 4 * t;
                u32 b0 = *(const u32*)xr, b1 = *(const u32*)(xr + 16);
#pragma unroll
                for (int mt = 0; mt < 2; mt++) mma_s8_16832(a[mt], b0, b1, c[i][mt]);
            }
#pragma unroll
            for (int i = 0; i < G; i++) {
                // (d, c) of activation rows 2t and 2t + 1 of this tile (Q4_1:
                // (d, s), and c made here).
                float4 s = *(const float4*)(ss + b * TOK + 8 * (n0 + i));
                float k0 = s.y, k1 = s.w;
                if (TY == TY_Q4_1) {
                    k0 = -MQ_MAGIC_F * s.x;
                    k1 = -MQ_MAGIC_F * s.z;
                }
#pragma unroll
                for (int mt = 0; mt < 2; mt++) {
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        float dx = (e & 1) ? s.z : s.x;
                        float tt = fmaf(dx, __int_as_float(c[i][mt][e]), (e & 1) ? k1 : k0);
                        float& r = acc[mt][n0 + i][e];
                        if (TY == TY_Q4_1) r = fmaf(B[mt][e >> 1], (e & 1) ? s.w : s.y, r);
                        r = fmaf(A[mt][e >> 1], tt, r);
                    }
                }
            }
        }
    }
}

template <int TY, int WN, int TOK, int STAGES, int KS>
__device__ __forceinline__ void mq_body(const u8* __restrict__ w, int m, long long rb,
                                        const signed char* __restrict__ xq,
                                        const float2* __restrict__ xds, int k, int n, int ba,
                                        int bb, int by, u8* smem,
                                        float (*acc)[mq_ntw(WN, TOK)][4], const TmaMap* map) {
    constexpr int STAGE = mq_stage_bytes(TY, TOK), NTW = mq_ntw(WN, TOK);
    // The stages' barriers (bulk tensor copies), after the stages.
    u64* bars = (u64*)(smem + STAGES * STAGE);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    static_assert(STAGE % 128 == 0, "bulk tensor copies land 128-byte aligned");
    if (mq_tma<TY>()) {
        if (threadIdx.x == 0) {
            // The stages start 128-byte aligned (the shared window's start).
            if ((__cvta_generic_to_shared(smem) & 127) != 0) __trap();
            for (int i = 0; i < STAGES; i++) mbar_init(bars + i, 1);
            asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        }
        __syncthreads();
    }
#endif
    // This warp's live tiles of 8 activation rows.
    int nl = min(NTW, max(0, (n - 8 * NTW * (((threadIdx.x >> 5) >> 2) % WN) + 7) / 8));
    int nch = (bb - ba) / MQ_KB;
#pragma unroll
    for (int c = 0; c < STAGES - 1; c++) {
        if (c < nch)
            mq_issue<TY, WN, TOK, KS>(w, m, rb, xq, xds, k, n, ba + MQ_KB * c, by,
                                      smem + c * STAGE, map, bars + c);
        cp_async_commit();
    }
    for (int c = 0; c < nch; c++) {
        u8* st = smem + (c % STAGES) * STAGE;
        // Every group but the newest STAGES - 2 is complete: chunk c.
        asm volatile("cp.async.wait_group %0;" ::"n"(STAGES - 2));
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        // Its weights' bulk copy too (the stage's barrier completes once per
        // use: phase c / STAGES).
        if (mq_tma<TY>()) mbar_wait(bars + c % STAGES, (c / STAGES) & 1);
#endif
        // Chunk c landed for every thread, and every warp is done with the
        // stage the next issue overwrites (chunk c - 1's).
        __syncthreads();
        if (TY != TY_Q4_1) {
            mq_prepass<TY, WN, TOK, KS>(st);
            __syncthreads();
        }
        int nx = c + STAGES - 1;
        if (nx < nch)
            mq_issue<TY, WN, TOK, KS>(w, m, rb, xq, xds, k, n, ba + MQ_KB * nx, by,
                                      smem + (nx % STAGES) * STAGE, map, bars + nx % STAGES);
        cp_async_commit();
        // Tiles of 8 activation rows: 1, 2, 4 or NTW (past n: never
        // stored).
        if (nl == 0) {
        } else if (nl <= 1) {
            mq_chunk<TY, WN, TOK, KS, 1>(st, acc);
        } else if (nl <= 2) {
            mq_chunk<TY, WN, TOK, KS, mq_min(2, NTW)>(st, acc);
        } else if (nl <= 4) {
            mq_chunk<TY, WN, TOK, KS, mq_min(4, NTW)>(st, acc);
        } else {
            mq_chunk<TY, WN, TOK, KS, NTW>(st, acc);
        }
    }
}

// Each job j of the table (one type and k; CTA rows blockIdx.y in its range
// of ceil(m_j / MQ_ROWS) tiles): out_j (n, m_j) (=, or += for an adding job)
// x (n, k) · w_jᵀ over blocks [z * bpc, min((z + 1) * bpc, k / 32)), x given
// as quant_q8's xq (n, k) int8 and xds (n, k / 32) float2. One split
// (part_stride 0) writes out_j; with several, split z writes its partial
// sums of job j at part + z * part_stride + n * (m_0 + .. + m_{j-1}) as an
// (n, m_j) block, for split_sum. Grid: (ceil(n / TOK), the table's
// CTAs, splits); MQ_THREADS(WN) threads; bpc a multiple of MQ_KB. Dynamic
// shared memory: STAGES * mq_stage_bytes(ty, TOK), then STAGES mbarriers.
template <int WN, int TOK, int STAGES, int KS>
__device__ __forceinline__ void mq_kernel(const MmJobs& J, int k, long long rb, int ty,
                                          const signed char* __restrict__ xq,
                                          const float2* __restrict__ xds, int n_all, int bpc,
                                          long long part_stride, float* __restrict__ part,
                                          const JobMaps& maps) {
    GRID_DEP();
    extern __shared__ __align__(16) u8 mq_smem[];
    MmJob jb = mm_job(J, blockIdx.y);
    int roff = 0;  // rows of the jobs before this one
#pragma unroll
    for (int j = 1; j < MM_JOBS; j++)
        if (j < J.count && (int)blockIdx.y >= J.end[j - 1]) roff += J.m[j - 1];
    int m = jb.m;
    constexpr int NTW = mq_ntw(WN, TOK);
    int g0 = blockIdx.x * TOK;
    int n = min(TOK, n_all - g0);
    xq += (long long)g0 * k;
    xds += (long long)g0 * (k / 32);
    float* out = part_stride == 0
                     ? jb.out + (long long)g0 * m
                     : part + blockIdx.z * part_stride + (long long)n_all * roff + (long long)g0 * m;
    int ba = blockIdx.z * bpc, bb = min(ba + bpc, k / 32);
    float acc[2][NTW][4];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < NTW; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[i][j][e] = 0.0f;
    if (ty == TY_Q4_0)
        mq_body<TY_Q4_0, WN, TOK, STAGES, KS>(jb.w, m, rb, xq, xds, k, n, ba, bb, jb.by, mq_smem, acc,
                                           &maps.m[jb.j]);
    else if (ty == TY_Q4_1)
        mq_body<TY_Q4_1, WN, TOK, STAGES, KS>(jb.w, m, rb, xq, xds, k, n, ba, bb, jb.by, mq_smem, acc,
                                           &maps.m[jb.j]);
    else
        mq_body<TY_Q8_0, WN, TOK, STAGES, KS>(jb.w, m, rb, xq, xds, k, n, ba, bb, jb.by, mq_smem, acc,
                                           &maps.m[jb.j]);
    int wid = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int g = lane >> 2, t = lane & 3;
    if (KS > 1) {
        // k groups 1.. hand their sums to group 0 through shared memory
        // (the stages are free once every warp is past the last chunk),
        // which adds them in group order: (KS - 1, NA, MQ_THREADS(WN)), acc
        // taken flat (NA values, constant indices once unrolled).
        constexpr int TG = MQ_THREADS(WN), NA = 2 * NTW * 4;
        int kg = (wid >> 2) / WN, lt = threadIdx.x % TG;
        float* red = (float*)mq_smem;
        float* af = &acc[0][0][0];
        cp_async_wait_all();
        __syncthreads();
        if (kg > 0) {
#pragma unroll
            for (int x = 0; x < NA; x++) red[((kg - 1) * NA + x) * TG + lt] = af[x];
        }
        __syncthreads();
        if (kg > 0) return;  // no barrier follows
#pragma unroll
        for (int q = 1; q < KS; q++)
#pragma unroll
            for (int x = 0; x < NA; x++) af[x] += red[((q - 1) * NA + x) * TG + lt];
    }
    int r0 = jb.by * MQ_ROWS + 32 * (wid & 3) + g;
    int tk0 = 8 * NTW * ((wid >> 2) % WN) + 2 * t;
    bool add_here = jb.add && part_stride == 0;
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int nt = 0; nt < NTW; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int row = r0 + 16 * mt + 8 * (e >> 1), tk = tk0 + 8 * nt + (e & 1);
                if (tk < n && row < m) mm_store(out + (long long)tk * m + row, acc[mt][nt][e], add_here);
            }
}

#define MQ_ARGS                                                                              \
    MmJobs J, int k, long long rb, int ty, const signed char *__restrict__ xq,               \
        const float2 *__restrict__ xds, int n_all, int bpc, long long part_stride,           \
        float *__restrict__ part, const __grid_constant__ JobMaps maps
#define MQ_PASS J, k, rb, ty, xq, xds, n_all, bpc, part_stride, part, maps
extern "C" __global__ void __launch_bounds__(MQ_THREADS(1), 2) mm_q8_mma(MQ_ARGS) {
    mq_kernel<1, 64, 2, 1>(MQ_PASS);
}
extern "C" __global__ void __launch_bounds__(MQ_THREADS(2), 2) mm_q8_mma_w2(MQ_ARGS) {
    mq_kernel<2, 64, 2, 1>(MQ_PASS);
}
// Up to 16 rows, two k groups of 4 warps: one CTA per SM (Q8_0) and two.
extern "C" __global__ void __launch_bounds__(2 * MQ_THREADS(1), 1) mm_q8_mma_t16_k2(MQ_ARGS) {
    mq_kernel<1, 16, 4, 2>(MQ_PASS);
}
extern "C" __global__ void __launch_bounds__(2 * MQ_THREADS(1), 2) mm_q8_mma_t16_k2b(MQ_ARGS) {
    mq_kernel<1, 16, 4, 2>(MQ_PASS);
}
// Up to 8 rows of Q8_0: 8-row tiles, so three chunk buffers fit twice per
// SM (two CTAs of 8 warps in two k groups).
extern "C" __global__ void __launch_bounds__(2 * MQ_THREADS(1), 2) mm_q8_mma_t8_k2b(MQ_ARGS) {
    mq_kernel<1, 8, 3, 2>(MQ_PASS);
}
// One k group (ops/matmul/mq.rs MQ_T16, MQ_T8: `deterministic` mode's
// small batches, down to one row): each output adds its blocks' terms in
// k order in one chain, as mm_q8_mma and mm_q8_mma_w2 do, so the same
// bits for any tile of activation rows.
extern "C" __global__ void __launch_bounds__(MQ_THREADS(1), 2) mm_q8_mma_t16(MQ_ARGS) {
    mq_kernel<1, 16, 3, 1>(MQ_PASS);
}
extern "C" __global__ void __launch_bounds__(MQ_THREADS(1), 2) mm_q8_mma_t8(MQ_ARGS) {
    mq_kernel<1, 8, 3, 1>(MQ_PASS);
}
