// Row-wise RMS norm: ss = dot32(x, x); scale = rsqrt(ss / dim + eps);
// out = (x * scale) * w. One warp per row; thread l owns lane l of dot32.
extern "C" __global__ void rms_norm(const float* __restrict__ x, const float* __restrict__ w,
                                    int n, int dim, float eps, float* __restrict__ out) {
    if (RMS_PREFETCH) prefetch_line(w, 4LL * dim, threadIdx.x, false);  // see common.cuh
    GRID_DEP();
    int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    int l = threadIdx.x & 31;
    bool ok = row < n;
    const float* xr = x + (long long)(ok ? row : 0) * dim;
    float lane = 0.0f;
    if (ok)
        for (int e = l; e < dim; e += 32) lane = q_add(lane, q_mul(xr[e], xr[e]));
    float ss = q_warp_tree32(lane);
    ss = __shfl_sync(0xffffffffu, ss, 0);
    if (!ok) return;
    float mean = q_div(ss, __uint2float_rn((unsigned)dim));
    float scale = q_rsqrt(q_add(mean, eps));
    float* o = out + (long long)row * dim;
    for (int e = l; e < dim; e += 32) o[e] = q_mul(q_mul(xr[e], scale), w[e]);
}

// The same arithmetic with one block per row (ops/norm, rms_threads:
// a float4 per thread up to 1,024 threads; the bits do not depend on the
// count): all threads
// stage x·x in shared memory (dynamic, dim floats) with many loads in
// flight, warp 0 sums it in the canonical order (lane l adds e = l, l + 32,
// ... sequentially, then the 32-lane tree), and all threads write the
// output. Bitwise equal to rms_norm; a single-warp row is latency-bound.
// vec4: x, w, out 16-byte aligned and dim a multiple of 4: the same
// values and order, moved with 16-byte loads and stores (one round of loads
// for a 4096-wide row instead of several dependent ones).
extern "C" __global__ void rms_norm_block(const float* __restrict__ x,
                                          const float* __restrict__ w, int dim, float eps,
                                          int vec4, float* __restrict__ out) {
    if (RMS_PREFETCH) prefetch_line(w, 4LL * dim, threadIdx.x, false);  // see common.cuh
    GRID_DEP();
    extern __shared__ __align__(16) float sq[];
    __shared__ float scale_s;
    const float* xr = x + (long long)blockIdx.x * dim;
    // Unrolled so a thread's loads are in flight together (the loops are
    // latency-bound otherwise); the order of the sums below is unchanged.
    if (vec4) {
#pragma unroll 4
        for (int e = threadIdx.x; e < dim / 4; e += blockDim.x) {
            float4 v = ((const float4*)xr)[e];
            ((float4*)sq)[e] = make_float4(q_mul(v.x, v.x), q_mul(v.y, v.y), q_mul(v.z, v.z),
                                           q_mul(v.w, v.w));
        }
    } else {
#pragma unroll 8
        for (int e = threadIdx.x; e < dim; e += blockDim.x) {
            float v = xr[e];
            sq[e] = q_mul(v, v);
        }
    }
    __syncthreads();
    if (threadIdx.x < 32) {
        int l = threadIdx.x;
        float lane = 0.0f;
#pragma unroll 8
        for (int e = l; e < dim; e += 32) lane = q_add(lane, sq[e]);
        float ss = q_warp_tree32(lane);
        if (l == 0) {
            float mean = q_div(ss, __uint2float_rn((unsigned)dim));
            scale_s = q_rsqrt(q_add(mean, eps));
        }
    }
    __syncthreads();
    float scale = scale_s;
    float* o = out + (long long)blockIdx.x * dim;
    if (vec4) {
#pragma unroll 4
        for (int e = threadIdx.x; e < dim / 4; e += blockDim.x) {
            float4 v = ((const float4*)xr)[e], g = ((const float4*)w)[e];
            ((float4*)o)[e] = make_float4(q_mul(q_mul(v.x, scale), g.x), q_mul(q_mul(v.y, scale), g.y),
                                          q_mul(q_mul(v.z, scale), g.z), q_mul(q_mul(v.w, scale), g.w));
        }
        return;
    }
#pragma unroll 8
    for (int e = threadIdx.x; e < dim; e += blockDim.x) o[e] = q_mul(q_mul(xr[e], scale), w[e]);
}
