// out = silu(gate) * up with the canonical silu x / (1 + exp(-x)).
extern "C" __global__ void swiglu(const float* __restrict__ gate, const float* __restrict__ up,
                                  long long len, float* __restrict__ out) {
    long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= len) return;
    out[t] = q_mul(q_silu(gate[t]), up[t]);
}
