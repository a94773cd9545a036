// RMS norm for the fast and deterministic modes (not the canonical
// arithmetic: FMA partial sums, a shuffle tree, rsqrtf; rms_fast_scale and
// rms_fast_out_v4 in common.cuh). One block of 256 threads per row. Each row depends only on
// itself in a fixed order: batch-invariant.
// vec4 (x, w, out 16-byte aligned and dim a multiple of 4): thread t owns
// the float4s t, t + 256, ..., so a 4096-wide row is one round of loads
// (the scalar loop took four dependent rounds: ~16 us under ncu).
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
        rms_fast_out_v4<true>(xr, w, dim, scale, o, xq ? xq + 32 * b0 : nullptr, xds + b0);
        return;
    }
#pragma unroll 4
    for (int e = threadIdx.x; e < dim; e += blockDim.x) o[e] = xr[e] * scale * w[e];
}
