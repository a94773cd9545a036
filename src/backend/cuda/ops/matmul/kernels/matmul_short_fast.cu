// One-row decode matvec for short rows (`fast` mode; ops/matmul,
// mv_short_rows): R weight rows per warp, each taken by a group of 32 / R
// lanes. A row of k = 576 (SmolLM2: 18 units) keeps only 18 of a warp's
// 32 lanes busy in mv_q8_r1, one load round trip per warp; its 49,152-row
// output head then runs about eight waves of such warps (14.4 us for 13.7
// MB under ncu on an H200, docs/PERF.md). Here lane j of a group takes
// units j, j + 32 / R, ... (several loads in flight per lane), the group
// reduces by a fixed xor tree over its lanes, and the grid has R times
// fewer CTAs. A row's sum is in another order than the grouped kernel's,
// so this is `fast` mode only (a row's bits depend on the batch size, as
// with mv_q8_r1_w2).
//
// Arguments as mv_q8_r1: each job's out (m,) (=, or +=) its weights (m, k)
// · the one activation row xq / xds (quant_q8's). Block 256 threads: 8
// warps of R rows; grid (1, sum over jobs of ceil(m / (8 R))).
template <int R>
__device__ __forceinline__ void mv_short_body(const MmJobs& jobs, int k, long long row_bytes,
                                              int ty, const signed char* __restrict__ xq,
                                              const float2* __restrict__ xds) {
    constexpr int L = 32 / R;  // lanes per row
    MmJob jb = mm_job(jobs, blockIdx.y);
    int warp = threadIdx.x >> 5, l = threadIdx.x & 31;
    int j = l % L;
    int row = (jb.by * 8 + warp) * R + l / L;
    bool live = row < jb.m;
    // A row past m repeats the last one's loads and stores nothing: every
    // lane stays for the group's shuffles.
    const u8* wr = jb.w + (long long)min(row, jb.m - 1) * row_bytes;
    mv_mark(jobs, jb, 8 * R, row_bytes);
    if (MV_PREFETCH && jobs.prefetch) prefetch_line(wr, row_bytes, j, MV_PREFETCH == 2);
    GRID_DEP();
    float acc[1] = {0.0f};
#define MV_SHORT_ROW(T) mv_q8_row<T, 1, 1>(wr, k / 32, xq, xds, k, 1, j, L, acc)
    QTYPE_DISPATCH(ty, MV_SHORT_ROW)
#undef MV_SHORT_ROW
    float v = acc[0];
#pragma unroll
    for (int st = L / 2; st >= 1; st >>= 1) v += __shfl_xor_sync(0xffffffffu, v, st, 32);
    if (live && j == 0) mm_store(jb.out + row, v, jb.add);
}

#define MV_SHORT_PARAMS                                                                   \
    MmJobs jobs, int k, long long row_bytes, int ty, const signed char *__restrict__ xq, \
        const float2 *__restrict__ xds, int n_all
// n_all (always 1) keeps mv_q8_r1's parameter list, so the launch is
// mat_vec_q8's.
extern "C" __global__ void __launch_bounds__(256, 6) mv_q8_r1_s4(MV_SHORT_PARAMS) {
    mv_short_body<4>(jobs, k, row_bytes, ty, xq, xds);
}
#undef MV_SHORT_PARAMS
