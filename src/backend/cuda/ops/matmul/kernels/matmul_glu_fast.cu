// The FFN's gate/up matvec with the SwiGlu in its epilogue (ops/matmul/
// matmul_glu.rs; one activation row, `deterministic` and `fast`): a
// MatMuls of two jobs, job 0 the gate and job 1 the up projection (m rows
// each, m a multiple of 32), whose op also asks for h = silu(gate) * up.
//
// Why: unfused, swiglu_q8 is a launch of its own between the gate/up and
// down matvecs, one more dependent kernel boundary per layer (a timing
// build that left it out ran SmolLM2 6.5%, the 1B 4.4% and the 8B 2.5%
// faster after 512 tokens; docs/PERF.md, 2026-11-27 late night). Here a CTA
// owns 32 consecutive indices i, one int8 block of the down projection's
// input, so it can quantize that block itself: its W warps take 32 / W
// indices each, and for each index the gate row and the up row together
// (both rows' unit loads in flight at once). Each row adds lane l's units
// l, l + 32, ... in increasing order and reduces them by mv_q8_r1's xor
// tree, so gate and up get mv_q8_r1's bits; h is swiglu_q8's arithmetic
// and its block q8_block's bytes: the op's results are those of the
// unfused mv_q8_r1 then swiglu_q8, bit for bit (the parity harness checks
// it, `quire ops --op mat_muls_glu`).
//
// Arguments: jobs (the two jobs' weights (m, k) of row_bytes and outputs
// gate / up (m,)); xq (k,) int8 and xds (k / 32,) float2 the normalized
// input as quant_q8 stores it; h (m,) the SwiGlu's f32 output, hq (m,)
// int8 and hds (m / 32,) float2 its blocks. Grid (1, C * m / 32), W * 32
// threads (clusters of C along y for the c{C} entries). hq / hds must not
// alias xq / xds: other CTAs still read the
// input while a CTA stores its block.

template <int TY>
__device__ __forceinline__ void mv_glu_pair(const u8* __restrict__ wg, const u8* __restrict__ wu,
                                            int units, const signed char* __restrict__ xq,
                                            const float2* __restrict__ xds, int k, int l,
                                            float* acc) {
    unsigned long long pol = MV_L2_POL ? l2_evict_first() : 0ull;
    for (int u = l; u < units; u += 32) {
        int a[8], b[8];
        float a0, a1, ab, b0, b1, bb;
        decode_unit_q8<TY, MV_L2_POL>(wg, u, a, a0, a1, ab, pol);
        decode_unit_q8<TY, MV_L2_POL>(wu, u, b, b0, b1, bb, pol);
        mv_q8_dot<1>(a, a0, a1, ab, u, xq, xds, k, 1, &acc[0]);
        mv_q8_dot<1>(b, b0, b1, bb, u, xq, xds, k, 1, &acc[1]);
    }
}

// W warps per CTA; C CTAs (a thread-block cluster along y, C > 1) share
// one block of 32 indices: each CTA takes 32 / C of them, its warps 32 /
// (C W) each, and stores its SwiGlu values into rank 0's shared memory
// (st.shared::cluster) before the cluster barrier; rank 0 quantizes. So
// a small FFN (SmolLM2: 48 blocks) spreads over more SMs than one CTA
// per block allows.
// NA (norm-ahead's consumer entries, `_nc`): xq / xds are the blocks of
// x * g that the residual producer stored (mv_q8_r1_na*), and gate and up
// are scaled by the norm's 1/rms from `norm` after their sums, as
// mv_q8_r1_nc scales its rows.
template <int W, int C, bool NA = false>
__device__ __forceinline__ void mv_glu_body(const MmJobs& jobs, int k, long long row_bytes,
                                            int ty, const signed char* __restrict__ xq,
                                            const float2* __restrict__ xds, float* __restrict__ h,
                                            signed char* __restrict__ hq,
                                            float2* __restrict__ hds,
                                            NormIn norm = NormIn{nullptr, 0, 0.0f}) {
    constexpr int IPC = 32 / C;   // indices per CTA
    constexpr int IPW = IPC / W;  // indices per warp
    static_assert(IPW >= 1 && IPW * W * C == 32, "W warps x C CTAs own 32 indices");
    __shared__ float hs[32];
    int warp = threadIdx.x >> 5, l = threadIdx.x & 31;
    int rank = 0;
    if (C > 1) cl_shape(&rank);
    int blk = blockIdx.y / C;
    int s0 = rank * IPC + warp * IPW;  // this warp's first slot of the block
    int i0 = blk * 32 + s0;
    const u8* wg = jobs.w[0];
    const u8* wu = jobs.w[1];
    float* gate = jobs.out[0];
    float* up = jobs.out[1];
    // The read-ahead's progress: this CTA's gate rows (mv_mark's rule).
    mv_mark(jobs, MmJob{wg, gate, jobs.m[0], false, (int)blockIdx.y, 0}, IPC, row_bytes);
    if (MV_PREFETCH && jobs.prefetch) {
#pragma unroll
        for (int ii = 0; ii < IPW; ii++) {
            prefetch_line(wg + (long long)(i0 + ii) * row_bytes, row_bytes, l, MV_PREFETCH == 2);
            prefetch_line(wu + (long long)(i0 + ii) * row_bytes, row_bytes, l, MV_PREFETCH == 2);
        }
    }
    GRID_DEP();
    NormParts nparts = {};
    if (NA) nparts = mv_norm_load(norm, l);
    float rs = 1.0f;
    int units = k / 32;
    // The trip count hidden from the compiler: with one index per warp it
    // otherwise drops the loop and schedules the pair loop worse (sm_90:
    // the Q4_0 loop 106 instructions instead of 84, and spills at 40
    // registers).
    int n_ii = IPW;
    asm volatile("" : "+r"(n_ii));
#pragma unroll 1
    for (int ii = 0; ii < n_ii; ii++) {
        int i = i0 + ii;
        float acc[2] = {0.0f, 0.0f};
        const u8* rg = wg + (long long)i * row_bytes;
        const u8* ru = wu + (long long)i * row_bytes;
#define MV_GLU_PAIR(T) mv_glu_pair<T>(rg, ru, units, xq, xds, k, l, acc)
        QTYPE_DISPATCH(ty, MV_GLU_PAIR)
#undef MV_GLU_PAIR
#pragma unroll
        for (int r = 0; r < 2; r++) {
#pragma unroll
            for (int st = 16; st >= 1; st >>= 1)
                acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], st, 32);
        }
        if (NA) {
            // Warp-uniform (ii is): every lane takes part in the tree.
            if (ii == 0) rs = mv_norm_scale(norm, mv_norm_sum(norm, nparts, l));
            acc[0] *= rs;
            acc[1] *= rs;
        }
        if (l == 0) {
            gate[i] = acc[0];
            up[i] = acc[1];
            float v = q_mul(q_silu(acc[0]), acc[1]);
            h[i] = v;
            int slot = (i & 31);  // i - blk * 32: s0 + ii
            if (C == 1) {
                hs[slot] = v;
            } else {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
                // (No memory clobber: the cluster barrier after the loop
                // orders it; a clobber here spilled the loop's registers.)
                asm volatile("st.shared::cluster.f32 [%0], %1;" ::"r"(cl_peer(&hs[slot], 0)),
                             "f"(v));
#endif
            }
        }
    }
    // C > 1: the barrier makes every CTA's stores into rank 0 visible to
    // it; only rank 0's shared memory is written, and rank 0 stays until
    // it has read it, so the others may leave after arriving.
    cl_sync(C);
    if (C > 1) cl_shape(&rank);  // read again: not live across the loop
    if (rank != 0 || warp != 0) return;
    float v = hs[l];
    q8_block<1>(&v, l, hq + (long long)blk * 32, hds + blk);
}

#define MV_GLU_PARAMS                                                                     \
    MmJobs jobs, int k, long long row_bytes, int ty, const signed char *__restrict__ xq, \
        const float2 *__restrict__ xds, float *__restrict__ h, signed char *__restrict__ hq, \
        float2 *__restrict__ hds
#define MV_GLU_ARGS jobs, k, row_bytes, ty, xq, xds, h, hq, hds
// mv_q8_r1_glu{W}[c{C}]: W warps per CTA, clusters of C; the bounds keep
// 48 warps per SM, mv_q8_r1's.
extern "C" __global__ void __launch_bounds__(256, 6) mv_q8_r1_glu8(MV_GLU_PARAMS) {
    mv_glu_body<8, 1>(MV_GLU_ARGS);
}
extern "C" __global__ void __launch_bounds__(512, 3) mv_q8_r1_glu16(MV_GLU_PARAMS) {
    mv_glu_body<16, 1>(MV_GLU_ARGS);
}
extern "C" __global__ void __launch_bounds__(1024, 1) mv_q8_r1_glu32(MV_GLU_PARAMS) {
    mv_glu_body<32, 1>(MV_GLU_ARGS);
}
extern "C" __global__ void __launch_bounds__(256, 6) mv_q8_r1_glu8c2(MV_GLU_PARAMS) {
    mv_glu_body<8, 2>(MV_GLU_ARGS);
}
extern "C" __global__ void __launch_bounds__(256, 6) mv_q8_r1_glu8c4(MV_GLU_PARAMS) {
    mv_glu_body<8, 4>(MV_GLU_ARGS);
}
extern "C" __global__ void __launch_bounds__(512, 3) mv_q8_r1_glu16c2(MV_GLU_PARAMS) {
    mv_glu_body<16, 2>(MV_GLU_ARGS);
}
// The same forms as norm-ahead's consumers (`_nc`: NA above), with the
// sums of squares `parts` (blocks of them) and the norm's eps.
#define MV_GLU_NC(NAME, BOUNDS, W, C)                                                   \
    extern "C" __global__ void BOUNDS NAME##_nc(MV_GLU_PARAMS, const float* __restrict__ parts, \
                                                int blocks, float eps) {                \
        mv_glu_body<W, C, true>(MV_GLU_ARGS, NormIn{parts, blocks, eps});               \
    }
MV_GLU_NC(mv_q8_r1_glu8, __launch_bounds__(256, 6), 8, 1)
MV_GLU_NC(mv_q8_r1_glu16, __launch_bounds__(512, 3), 16, 1)
MV_GLU_NC(mv_q8_r1_glu32, __launch_bounds__(1024, 1), 32, 1)
MV_GLU_NC(mv_q8_r1_glu8c2, __launch_bounds__(256, 6), 8, 2)
MV_GLU_NC(mv_q8_r1_glu8c4, __launch_bounds__(256, 6), 8, 4)
MV_GLU_NC(mv_q8_r1_glu16c2, __launch_bounds__(512, 3), 16, 2)
#undef MV_GLU_NC
#undef MV_GLU_ARGS
#undef MV_GLU_PARAMS
