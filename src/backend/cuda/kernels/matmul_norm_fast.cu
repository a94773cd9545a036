// One-row decode matvec with its input's RMS norm folded in (`MatMuls`
// with `norm`, launch/matmul_norm.rs; opt-in, QUIRE_NORM_FOLD=1). Compiled
// as part of matmul_fast.cu's program (source.rs appends this file), so
// it shares mv_q8_row and mv_finish: every CTA normalizes and quantizes
// the row into shared memory as rms_norm_fast does, then the arithmetic is
// mv_q8_r1{,_w2,_w4}'s, reading the row's int8 blocks from there.

// out_j (1, m_j) (=, or +=) rms_norm(x) · w_jᵀ for every job of the table:
// grid and job table as mv_q8_r1{,_w2,_w4} (W warps per weight row, 8 / W
// rows per CTA); x (k,) f32 (the residual stream), g (k,) the norm's
// weights; dynamic shared memory: k int8 + k / 32 float2.
template <int W>
__device__ __forceinline__ void mv_q8_norm_body(MmJobs jobs, int k, long long row_bytes, int ty,
                                                const float* __restrict__ x,
                                                const float* __restrict__ g, float eps) {
    extern __shared__ __align__(16) unsigned char mv_norm_smem[];
    signed char* xq = (signed char*)mv_norm_smem;
    float2* xds = (float2*)(mv_norm_smem + k);
    MmJob jb = mm_job(jobs, blockIdx.y);
    int m = jb.m;
    int warp = threadIdx.x >> 5;
    int row = jb.by * ((blockDim.x >> 5) / W) + warp / W;
    int l = threadIdx.x & 31;
    // Every thread stays for the norm's barriers; rows past m store nothing.
    bool live = row < m;
    if (!live) row = m - 1;
    const u8* wr = jb.w + (long long)row * row_bytes;
    if (MV_PREFETCH && jobs.prefetch)
        prefetch_line(wr, row_bytes, l + 32 * (warp % W), MV_PREFETCH == 2);
    GRID_DEP();
    // rms_norm_fast's float4 path with the same functions (common.cuh), so
    // the same bytes as the xq / xds it would have written for this row
    // (the parity harness compares the pair bitwise: ops --op
    // mat_muls_norm). Needs k a multiple of 32, x and g 16-byte aligned.
    float scale = rms_fast_scale(x, k, eps, true);
    rms_fast_out_v4<false>(x, g, k, scale, nullptr, xq, xds);
    __syncthreads();
    if (W == 1 && !live) return;
    float acc[1] = {0.0f};
#define MV_Q8_NROW(T) mv_q8_row<T, 1, MV_UNITS1>(wr, k / 32, xq, xds, k, 1, l + 32 * (warp % W), 32 * W, acc)
    QTYPE_DISPATCH(ty, MV_Q8_NROW)
#undef MV_Q8_NROW
    mv_finish<1, W>(acc, 1, m, row, live, warp, l, jb.out, jb.add);
}

extern "C" __global__ void MV_R1_BOUNDS mv_q8_r1_n(MmJobs jobs, int k, long long row_bytes, int ty,
                                                   const float* __restrict__ x,
                                                   const float* __restrict__ g, float eps) {
    mv_q8_norm_body<1>(jobs, k, row_bytes, ty, x, g, eps);
}
extern "C" __global__ void mv_q8_r1_w2_n(MmJobs jobs, int k, long long row_bytes, int ty,
                                         const float* __restrict__ x,
                                         const float* __restrict__ g, float eps) {
    mv_q8_norm_body<2>(jobs, k, row_bytes, ty, x, g, eps);
}
extern "C" __global__ void mv_q8_r1_w4_n(MmJobs jobs, int k, long long row_bytes, int ty,
                                         const float* __restrict__ x,
                                         const float* __restrict__ g, float eps) {
    mv_q8_norm_body<4>(jobs, k, row_bytes, ty, x, g, eps);
}
