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

// swiglu, and the output quantized as quant_act32 would (canon_block: one
// warp per 32-block) for the exact matmul that reads it next: qs (len),
// d and s (len / 32). len is a multiple of 32 and blockDim of 32, so
// whole warps return together.
extern "C" __global__ void swiglu_c16(const float* __restrict__ gate, const float* __restrict__ up,
                                      long long len, float* __restrict__ out,
                                      short* __restrict__ qs, float* __restrict__ d,
                                      float* __restrict__ s) {
    GRID_DEP();
    long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= len) return;
    float v = q_mul(q_silu(gate[t]), up[t]);
    out[t] = v;
    canon_block<1>(&v, (int)(t & 31), qs + (t & ~31LL), d + (t >> 5), s + (t >> 5));
}
