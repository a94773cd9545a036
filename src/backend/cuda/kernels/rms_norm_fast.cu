// RMS norm for the fast and deterministic modes (not the canonical
// arithmetic: FMA partial sums, a shuffle tree, rsqrtf). One block of 256
// threads per row: thread t sums x² over e = t, t + 256, ...; warps reduce
// by a fixed xor tree and thread 0 adds the 8 warp sums in order. Each row
// depends only on itself in a fixed order: batch-invariant.
// vec4 (x, w, out 16-byte aligned and dim a multiple of 4): thread t owns
// the float4s t, t + 256, ..., so a 4096-wide row is one round of loads
// (the scalar loop took four dependent rounds: ~16 us under ncu).
// With xq non-null (vec4, dim a multiple of 32): the output is also
// quantized as quant_q8 would, for the matmul that reads it next. The
// arithmetic lives in common.cuh (rms_scale_v4, rms_apply_v4), shared with
// the matvec that normalizes its own input (mv_q8_norm_*).
extern "C" __global__ void rms_norm_fast(const float* __restrict__ x,
                                         const float* __restrict__ w, int dim, float eps,
                                         int vec4, float* __restrict__ out,
                                         signed char* __restrict__ xq,
                                         float2* __restrict__ xds) {
    if (RMS_PREFETCH) prefetch_line(w, 4LL * dim, threadIdx.x, false);  // see common.cuh
    GRID_DEP();
    __shared__ float part[8];
    __shared__ float scale_s;
    const float* xr = x + (long long)blockIdx.x * dim;
    float* o = out + (long long)blockIdx.x * dim;
    if (vec4) {
        float scale = rms_scale_v4(xr, dim, eps, part, &scale_s);
        long long r = blockIdx.x;
        rms_apply_v4(xr, w, dim, scale, o, xq ? xq + r * dim : nullptr,
                     xq ? xds + r * (dim / 32) : nullptr);
        return;
    }
    float s = 0.0f;
#pragma unroll 4
    for (int e = threadIdx.x; e < dim; e += blockDim.x) s = fmaf(xr[e], xr[e], s);
    float scale = rms_scale(s, dim, eps, part, &scale_s);
#pragma unroll 4
    for (int e = threadIdx.x; e < dim; e += blockDim.x) o[e] = xr[e] * scale * w[e];
}
