// out = silu(gate) * up with the canonical silu x / (1 + exp(-x)).
extern "C" __global__ void swiglu(const float* __restrict__ gate, const float* __restrict__ up,
                                  long long len, float* __restrict__ out) {
    GRID_DEP();
    long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= len) return;
    out[t] = q_mul(q_silu(gate[t]), up[t]);
}

// swiglu, and the output quantized as quant_q8 would (q8_block: one warp
// per 32-block) for the matmul that reads it next. len is a multiple of 32
// and blockDim of 32, so whole warps return together.
extern "C" __global__ void swiglu_q8(const float* __restrict__ gate, const float* __restrict__ up,
                                     long long len, float* __restrict__ out,
                                     signed char* __restrict__ xq, float2* __restrict__ xds) {
    GRID_DEP();
    long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= len) return;
    float v = q_mul(q_silu(gate[t]), up[t]);
    out[t] = v;
    q8_block<1>(&v, (int)(t & 31), xq + (t & ~31LL), xds + (t >> 5));
}
