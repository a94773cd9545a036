// The one- and few-row quantized matvecs' inner loop (matmul_fast.cu,
// matmul_glu_fast.cu): a weight row's units dotted with int8 activation
// blocks (quant_q8's layout), and the weights' prefetch knob. Shared so
// that every entry adds a row's units in one order: the same bits for one
// row whichever kernel computes it.

#define MV_ROWS 8

// Adds unit u's dot products with activation rows 0..n-1 (n <= NR) to acc.
template <int NR>
__device__ __forceinline__ void mv_q8_dot(const int* w, float a0, float a1, float b, int u,
                                          const signed char* __restrict__ xq,
                                          const float2* __restrict__ xds, int k, int n,
                                          float* acc) {
    int nb = k / 32;
#pragma unroll
    for (int r = 0; r < NR; r++) {
        if (r >= n) break;
        int i0, i1;
        unit_idot(w, xq + (long long)r * k + 32 * u, &i0, &i1);
        float2 ds = xds[(long long)r * nb + u];
        float t = fmaf(a0, (float)i0, a1 * (float)i1);
        acc[r] = fmaf(ds.x, t, fmaf(b, ds.y, acc[r]));
    }
}

// Lane l's units l, l + 32, ..., UNITS per iteration with their loads
// in flight together. Each lane adds its units in increasing order,
// whatever UNITS and NR are, so one row's output has the same bits in the
// one-row kernel (mv_q8_r1) and in a group of MV_ROWS (mv_q8).
// MV_UNITS (groups of rows): 1 measured fastest on an H100 (8B Q4_0
// tg128: 271 tok/s vs 253 / 246 / 259 with 2 / 3 / 4). MV_UNITS1 (one
// row, batch-1 decode): 1 measured fastest on an H100 (8B Q4_0 tg128:
// 335.7 vs 330.7 / 324.2 with 2 / 4; the grouped kernel 324.9).
#ifndef MV_UNITS
#define MV_UNITS 1
#endif
#ifndef MV_UNITS1
#define MV_UNITS1 1
#endif
// Lane l of the warp takes units l, l + S, l + 2S, ... (S = 32: the warp
// owns the row; S = 32 W: W warps split it, warp s starting at 32 s).
// MV_L2_POL (dequant.cuh): the weights' L2 policy.
template <int TY, int NR, int UNITS>
__device__ __forceinline__ void mv_q8_row(const u8* __restrict__ wr, int units,
                                          const signed char* __restrict__ xq,
                                          const float2* __restrict__ xds, int k, int n, int l,
                                          int S, float* acc) {
    unsigned long long pol = MV_L2_POL ? l2_evict_first() : 0ull;
    int u = l;
    for (; u + S * (UNITS - 1) < units; u += S * UNITS) {
        int w[UNITS][8];
        float a0[UNITS], a1[UNITS], b[UNITS];
#pragma unroll
        for (int i = 0; i < UNITS; i++)
            decode_unit_q8<TY, MV_L2_POL>(wr, u + S * i, w[i], a0[i], a1[i], b[i], pol);
#pragma unroll
        for (int i = 0; i < UNITS; i++)
            mv_q8_dot<NR>(w[i], a0[i], a1[i], b[i], u + S * i, xq, xds, k, n, acc);
    }
    for (; u < units; u += S) {
        int w0[8];
        float a00, a01, b0;
        decode_unit_q8<TY, MV_L2_POL>(wr, u, w0, a00, a01, b0, pol);
        mv_q8_dot<NR>(w0, a00, a01, b0, u, xq, xds, k, n, acc);
    }
}

// A quantized matvec whose job table says so (small matrices, see
// mv_prefetch in ops/matmul/jobs.rs) fetches the start of its rows before
// griddepcontrol.wait (prefetch_line in common.cuh): lane l of the s-th of
// W warps on a row takes line 32 s + l of the row, into L2 (MV_PREFETCH=2;
// 1: into L1, 0: never).
#ifndef MV_PREFETCH
#define MV_PREFETCH 2
#endif

// Norm-ahead's consumer input (ops/matmul/norm_ahead.rs): the sums of squares
// of x per 32-block that mv_q8_r1_na stored, how many, and the norm's eps.
struct NormIn {
    const float* parts;
    int blocks;
    float eps;
};
// Lane l's share of the sums, parts l, l + 32, ... added in order. Loaded
// right after the wait by mv_norm_load and added by mv_norm_sum after the
// row's dot: the first MV_NORM_LOADS parts are independent loads that stay
// in flight under the dot (a loop that adds each part as it arrives made
// every warp wait an L2 round trip before its first weight load: the 1B's
// consumers ran about 1 us slower alone than the plain matvecs, ncu
// 2026-11-29); parts past them (rows of more than 32 MV_NORM_LOADS
// blocks) are added after, in the same order.
#define MV_NORM_LOADS 4
struct NormParts {
    float p[MV_NORM_LOADS];
};
__device__ __forceinline__ NormParts mv_norm_load(const NormIn& N, int l) {
    NormParts r;
#pragma unroll
    for (int j = 0; j < MV_NORM_LOADS; j++) {
        int i = l + 32 * j;
        r.p[j] = i < N.blocks ? N.parts[i] : 0.0f;
    }
    return r;
}
__device__ __forceinline__ float mv_norm_sum(const NormIn& N, const NormParts& r, int l) {
    // 0 + p0 + p1 + ...: the loop's order (a part past the row is +0.0,
    // which changes no sum of finite parts except -0.0, and a sum of
    // squares is never negative).
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < MV_NORM_LOADS; j++) s += r.p[j];
    for (int i = l + 32 * MV_NORM_LOADS; i < N.blocks; i += 32) s += N.parts[i];
    return s;
}
// The norm's 1/rms from every lane's mv_norm_sum (fixed xor tree: every
// warp of the launch gets the same bits). Warp-uniform; all lanes call it.
__device__ __forceinline__ float mv_norm_scale(const NormIn& N, float part) {
#pragma unroll
    for (int st = 16; st >= 1; st >>= 1) part += __shfl_xor_sync(0xffffffffu, part, st, 32);
    return rsqrtf(part / (float)(32 * N.blocks) + N.eps);
}
