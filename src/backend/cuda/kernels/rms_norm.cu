// Row-wise RMS norm: ss = dot32(x, x); scale = rsqrt(ss / dim + eps);
// out = (x * scale) * w. One warp per row; thread l owns lane l of dot32.
extern "C" __global__ void rms_norm(const float* __restrict__ x, const float* __restrict__ w,
                                    int n, int dim, float eps, float* __restrict__ out) {
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
