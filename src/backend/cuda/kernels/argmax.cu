// Greedy token choice on the device, sampler.rs's greedy rule: per row of
// logits, the first maximum in id order (ties go to the lowest id; -0.0
// and +0.0 compare equal, as the sampler's `x + 0.0` makes them). The
// sampler refuses a NaN or +inf logit; here such a row sets its status to
// 1 and the host reports the error. Which thread scans which ids changes
// no result: the rule is a total order on (value, id), so any reduction
// tree picks the same id.
// One CTA of ARGMAX_THREADS threads per row.
// logits: (n, vocab) f32; tokens: (n,) u32; status: (n,) u32 (0: ok).
// ring (may be null): page-locked host memory mapped for the device,
// nslots slots of (tokens (cap), status (cap)); the step's tokens and
// statuses also go to slot positions[0] % nslots (the step's first row's
// position: consecutive greedy steps take consecutive slots, and the host,
// knowing the position, reads the slot once the step has completed).
#define ARGMAX_THREADS 1024

// (v, i) replaces (bv, bi) when it comes first in the order: larger value,
// then lower id. A NaN v never does (the comparisons are false).
__device__ __forceinline__ void argmax_take(float& bv, int& bi, float v, int i) {
    if (v > bv || (v == bv && i < bi)) {
        bv = v;
        bi = i;
    }
}

extern "C" __global__ void __launch_bounds__(ARGMAX_THREADS)
    argmax_rows(const float* __restrict__ logits, int vocab, unsigned* __restrict__ tokens,
                unsigned* __restrict__ status, unsigned* __restrict__ ring,
                const unsigned* __restrict__ positions, int cap, int nslots) {
    GRID_DEP();
    __shared__ float sv[ARGMAX_THREADS / 32];
    __shared__ int si[ARGMAX_THREADS / 32];
    __shared__ int sbad[ARGMAX_THREADS / 32];
    const float* row = logits + (long long)blockIdx.x * vocab;
    // -inf with an id past every real one: the first real id of equal
    // value (an all -inf row: id 0, as the sampler picks) replaces it.
    float bv = Q_NINF;
    int bi = 0x7fffffff;
    int bad = 0;
    // 16-byte loads where every row starts 16-byte aligned (vocab % 4 == 0).
    if ((vocab & 3) == 0) {
        const float4* r4 = (const float4*)row;
        for (int e = threadIdx.x; e < vocab / 4; e += blockDim.x) {
            float4 v = r4[e];
            float q[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int j = 0; j < 4; j++) {
                bad |= (q[j] != q[j]) | (q[j] == Q_INF);
                argmax_take(bv, bi, q[j], 4 * e + j);
            }
        }
    } else {
        for (int e = threadIdx.x; e < vocab; e += blockDim.x) {
            float v = row[e];
            bad |= (v != v) | (v == Q_INF);
            argmax_take(bv, bi, v, e);
        }
    }
#pragma unroll
    for (int o = 16; o >= 1; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        argmax_take(bv, bi, ov, oi);
        bad |= __shfl_xor_sync(0xffffffffu, bad, o);
    }
    int w = threadIdx.x >> 5;
    if ((threadIdx.x & 31) == 0) {
        sv[w] = bv;
        si[w] = bi;
        sbad[w] = bad;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int k = 1; k < (int)(blockDim.x >> 5); k++) {
            argmax_take(bv, bi, sv[k], si[k]);
            bad |= sbad[k];
        }
        tokens[blockIdx.x] = (unsigned)bi;
        status[blockIdx.x] = bad ? 1u : 0u;
        if (ring) {
            unsigned* sl = ring + (long long)(positions[0] % (unsigned)nslots) * 2 * cap;
            sl[blockIdx.x] = (unsigned)bi;
            sl[cap + blockIdx.x] = bad ? 1u : 0u;
        }
    }
}
