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

// swiglu, and the output also as f16 in the wgmma GEMM's layout (f16wr_off;
// to_f16_wr's bits) for the prefill GEMM that reads it next: one thread
// per 16-byte piece of 8 values, `pieces` = whole tiles of 128 rows x k /
// 8, zeros for rows n... k a multiple of 256; gate, up, out 16-byte
// aligned.
extern "C" __global__ void swiglu_f16wr(const float* __restrict__ gate,
                                        const float* __restrict__ up, int n, int k,
                                        long long pieces, float* __restrict__ out,
                                        u16* __restrict__ x16) {
    GRID_DEP();
    f16wr_piece(x16, n, k, pieces, [&](long long o, float4* r) {
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const float4 g = *(const float4*)(gate + o + 4 * i), u = *(const float4*)(up + o + 4 * i);
            r[i] = make_float4(q_mul(q_silu(g.x), u.x), q_mul(q_silu(g.y), u.y),
                               q_mul(q_silu(g.z), u.z), q_mul(q_silu(g.w), u.w));
            *(float4*)(out + o + 4 * i) = r[i];
        }
    });
}
