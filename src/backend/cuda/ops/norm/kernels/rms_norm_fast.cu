// RMS norm for the fast and deterministic modes (not the canonical
// arithmetic: FMA partial sums, a shuffle tree, rsqrtf). One block per
// row, of a thread count that is a function of dim alone (ops/norm,
// rms_threads: one float4 per thread up to 1,024 threads, so a 4,096
// row is one round of loads in each phase instead of four dependent ones).
// Each row depends only on itself in a fixed order: batch-invariant.

// The scale of one row xr (dim,) held by a whole CTA of B threads (a
// multiple of 32, at most 1,024): thread t sums x² over e = t, t + B, ...
// (vec4: over float4s, their four values in order) with fmaf, warps reduce
// by a fixed xor tree and thread 0 adds the B / 32 warp sums in order;
// scale = rsqrtf(sum / dim + eps).
// Returns the scale to every thread; contains barriers, so every thread
// must call it.
__device__ __forceinline__ float rms_fast_scale(const float* __restrict__ xr, int dim, float eps,
                                                bool vec4) {
    __shared__ float part[32];
    __shared__ float scale_s;
    float s = 0.0f;
    if (vec4) {
#pragma unroll 4
        for (int e = threadIdx.x; e < dim / 4; e += blockDim.x) {
            float4 v = ((const float4*)xr)[e];
            s = fmaf(v.x, v.x, s);
            s = fmaf(v.y, v.y, s);
            s = fmaf(v.z, v.z, s);
            s = fmaf(v.w, v.w, s);
        }
    } else {
#pragma unroll 4
        for (int e = threadIdx.x; e < dim; e += blockDim.x) s = fmaf(xr[e], xr[e], s);
    }
#pragma unroll
    for (int o = 16; o >= 1; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        float t = 0.0f;
        for (int i = 0; i < (int)(blockDim.x >> 5); i++) t += part[i];
        scale_s = rsqrtf(t / (float)dim + eps);
    }
    __syncthreads();
    return scale_s;
}

// The normalized row xr * scale * w by float4s (16-byte aligned, dim a
// multiple of 4): stored to o and, with xq non-null (dim a multiple of
// 32), quantized as quant_q8 would into the row's xq (dim int8) and xds
// (dim / 32 float2) by q8_block.
// F16 (dim a multiple of 256): also as f16 in the wgmma GEMM's layout
// (f16wr_off) into x16, row t; to_f16_wr's bits. A template parameter, so
// that the decode entry's loop carries none of it.
template <bool F16>
__device__ __forceinline__ void rms_fast_out_v4(const float* __restrict__ xr,
                                                const float* __restrict__ w, int dim, float scale,
                                                float* o, signed char* xq, float2* xds,
                                                u16* x16, int t) {
#pragma unroll 4
    for (int e = threadIdx.x; e < dim / 4; e += blockDim.x) {
        float4 v = ((const float4*)xr)[e], g = ((const float4*)w)[e];
        float4 r = make_float4(v.x * scale * g.x, v.y * scale * g.y, v.z * scale * g.z,
                               v.w * scale * g.w);
        ((float4*)o)[e] = r;
        if (F16) *(uint2*)((u8*)x16 + f16wr_off(t, dim, e >> 1) + 8 * (e & 1)) = f16x4(r);
        if (xq) {
            // dim / 4 is a multiple of 8: a group of 8 lanes is all in
            // range or all out.
            float q[4] = {r.x, r.y, r.z, r.w};
            int blk = (4 * e) / 32;
            q8_block<4>(q, e & 7, xq + 32 * blk, xds + blk);
        }
    }
}

// vec4 (x, w, out 16-byte aligned and dim a multiple of 4): thread t owns
// the float4s t, t + B, ... (the scalar loop took four dependent rounds
// of a 4096-wide row: ~16 us under ncu; 256 threads of float4s took four
// in the output loop, whose loads cannot pass the previous float4's
// stores: 6.1 us under ncu on an H200, 2026-11-27).
// With xq non-null (vec4, dim a multiple of 32): the output is also
// quantized as quant_q8 would (q8_block; a 32-block is 8 consecutive
// float4s, so 8 consecutive lanes), for the matmul that reads it next.
extern "C" __global__ void rms_norm_fast(const float* __restrict__ x,
                                         const float* __restrict__ w, int dim, float eps,
                                         int vec4, float* __restrict__ out,
                                         signed char* __restrict__ xq,
                                         float2* __restrict__ xds) {
    if (RMS_PREFETCH) prefetch_line(w, 4LL * dim, threadIdx.x, false);  // see common.cuh
    GRID_DEP();
    const float* xr = x + (long long)blockIdx.x * dim;
    float scale = rms_fast_scale(xr, dim, eps, vec4 != 0);
    float* o = out + (long long)blockIdx.x * dim;
    if (vec4) {
        // xq / xds non-null only with dim a multiple of 32: this row's
        // blocks start at block blockIdx.x * dim / 32.
        long long b0 = (long long)blockIdx.x * (dim / 32);
        rms_fast_out_v4<false>(xr, w, dim, scale, o, xq ? xq + 32 * b0 : nullptr, xds + b0,
                               nullptr, 0);
        return;
    }
#pragma unroll 4
    for (int e = threadIdx.x; e < dim; e += blockDim.x) o[e] = xr[e] * scale * w[e];
}

// rms_norm_fast (vec4) for the prefill GEMM after it: the output also as
// f16 in the wgmma GEMM's layout into x16 (to_f16_wr's bits; dim a
// multiple of 256), the grid covering whole tiles of 128 rows: rows n..
// of the last tiles are zeros.
extern "C" __global__ void rms_norm_fast_f16wr(const float* __restrict__ x,
                                               const float* __restrict__ w, int n, int dim,
                                               float eps, float* __restrict__ out,
                                               u16* __restrict__ x16) {
    GRID_DEP();
    if ((int)blockIdx.x >= n) {
        // A padding row: the whole CTA returns, before any barrier.
        for (int pk = threadIdx.x; pk < dim / 8; pk += blockDim.x)
            *(uint4*)((u8*)x16 + f16wr_off(blockIdx.x, dim, pk)) = make_uint4(0, 0, 0, 0);
        return;
    }
    const float* xr = x + (long long)blockIdx.x * dim;
    float scale = rms_fast_scale(xr, dim, eps, true);
    rms_fast_out_v4<true>(xr, w, dim, scale, out + (long long)blockIdx.x * dim, nullptr, nullptr,
                          x16, blockIdx.x);
}
