// One-row decode matvec with its input's RMS norm folded in (`MatMuls`
// with `norm`, launch/matmul_norm.rs; opt-in, QUIRE_NORM_FOLD=1). Compiled
// as part of matmul_fast.cu's program (source.rs appends this file), so
// it shares mv_q8_row and mv_finish: after the norm, the arithmetic is
// mv_q8_r1{,_w2,_w4}'s, reading the row's int8 blocks from shared memory.

// rms_norm_fast's arithmetic for one row held by the whole CTA (256
// threads, as rms_norm_fast's block): thread t sums x² over the float4s t,
// t + 256, ... with fmaf in element order, warps reduce by the xor tree,
// thread 0 adds the 8 warp sums in order, scale = rsqrtf(sum / k + eps),
// value = x * scale * g, quantized by q8_block into xq (k int8) and xds
// (k / 32 float2) in shared memory. Same operations in the same order, so
// the same bytes as rms_norm_fast's xq / xds for this row: the folded
// matvec gives the bits of the unfused pair. Keep the two in step (the
// parity harness compares them bitwise: ops --op mat_muls_norm).
// Requires k a multiple of 32, x and g 16-byte aligned; ends with a
// barrier, so every thread of the CTA must call it.
__device__ __forceinline__ void rms_q8_row_smem(const float* __restrict__ x,
                                                const float* __restrict__ g, int k, float eps,
                                                signed char* xq, float2* xds) {
    __shared__ float part[8];
    __shared__ float scale_s;
    float s = 0.0f;
#pragma unroll 4
    for (int e = threadIdx.x; e < k / 4; e += blockDim.x) {
        float4 v = ((const float4*)x)[e];
        s = fmaf(v.x, v.x, s);
        s = fmaf(v.y, v.y, s);
        s = fmaf(v.z, v.z, s);
        s = fmaf(v.w, v.w, s);
    }
#pragma unroll
    for (int o = 16; o >= 1; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        float t = 0.0f;
        for (int i = 0; i < (int)(blockDim.x >> 5); i++) t += part[i];
        scale_s = rsqrtf(t / (float)k + eps);
    }
    __syncthreads();
    float scale = scale_s;
#pragma unroll 4
    for (int e = threadIdx.x; e < k / 4; e += blockDim.x) {
        float4 v = ((const float4*)x)[e], gv = ((const float4*)g)[e];
        float q[4] = {v.x * scale * gv.x, v.y * scale * gv.y, v.z * scale * gv.z,
                      v.w * scale * gv.w};
        // k / 4 is a multiple of 8: a group of 8 lanes is all in range or
        // all out.
        int blk = (4 * e) / 32;
        q8_block<4>(q, e & 7, xq + 32 * blk, xds + blk);
    }
    __syncthreads();
}

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
    rms_q8_row_smem(x, g, k, eps, xq, xds);
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
