// One-row quantized matvecs with the elementwise op next to them folded
// in (`deterministic` and `fast` decode; launch/fused.rs decides when).
// Compiled in matmul_fast.cu's module (source.rs appends this file): the
// row loop is mv_q8_row, so every output has the bits of the unfused
// kernels, and the folded op's arithmetic is its own kernel's:
//
//   mv_q8_r1_rope: the q/k/v MatMuls, then RopeKvWrite (rope_kv_write.cu,
//     adjacent-pair rope only). A CTA's 8 weight rows hold 4 whole rope
//     pairs (head_dim is even, a job's CTAs start at row 0), so after the
//     row sums meet in shared memory 4 threads rotate them, store q, k, v
//     and write K/V to the cache: one launch instead of two per layer.
//   mv_q8_r1{,_w2}_swiglu: SwiGlu, then the down MatMul on its output
//     (swiglu_q8's arithmetic). Every CTA computes act = silu(gate) * up
//     and its int8 blocks (q8_block) into shared memory itself, then runs
//     the matvec on them; CTA 0 also stores act. Redundant work per CTA
//     (k / 32 blocks over 8 warps), so the host takes it only for short
//     FFN rows (QUIRE_FUSE_SWIGLU_MAX).

// The q/k/v matvec of one decode row (jobs 0, 1, 2 = q, k, v: no job
// adds) with rope and the K/V store in its epilogue. q, k, v get the
// values RopeKvWrite leaves (q and k rotated, v as computed), and the
// cache cell `slots[0]` (if < n_cells) k and v as f16 (kv_f16).
// kc, vc: (n_cells, n_kv * head_dim); the k and v jobs' rows are n_kv *
// head_dim. Pair (2i, 2i + 1) of a head rotates by positions[0] *
// inv_freq[i] where 2i < rope_dim.
extern "C" __global__ void MV_R1_BOUNDS mv_q8_r1_rope(
    MmJobs jobs, int k, long long row_bytes, int ty, const signed char* __restrict__ xq,
    const float2* __restrict__ xds, int head_dim, int rope_dim,
    const u32* __restrict__ positions, const float* __restrict__ inv_freq,
    const u32* __restrict__ slots, long long n_cells, u16* __restrict__ kc,
    u16* __restrict__ vc, int trigger) {
    __shared__ float sv[8];
    MmJob jb = mm_job(jobs, blockIdx.y);
    int warp = threadIdx.x >> 5, l = threadIdx.x & 31;
    int row = jb.by * 8 + warp;
    bool live = row < jb.m;
    const u8* wr = jb.w + (long long)min(row, jb.m - 1) * row_bytes;
    if (MV_PREFETCH && jobs.prefetch) prefetch_line(wr, row_bytes, l, MV_PREFETCH == 2);
    GRID_WAIT();
    if (trigger == 0) GRID_TRIGGER();
    float acc[1] = {0.0f};
    if (live) {
#define MV_Q8_ROW(T) mv_q8_row<T, 1, MV_UNITS1>(wr, k / 32, xq, xds, k, 1, l, 32, acc)
        QTYPE_DISPATCH(ty, MV_Q8_ROW)
#undef MV_Q8_ROW
    }
    if (trigger == 1) GRID_TRIGGER();
    // mv_finish's reduction (the unfused kernel's bits).
    float v = acc[0];
#pragma unroll
    for (int st = 16; st >= 1; st >>= 1) v += __shfl_xor_sync(0xffffffffu, v, st, 32);
    if (l == 0) sv[warp] = v;
    __syncthreads();
    int p = threadIdx.x;  // pair p: rows 2p, 2p + 1 of the CTA
    int r0 = jb.by * 8 + 2 * p;
    if (p >= 4 || r0 >= jb.m) return;
    int job = (blockIdx.y >= (unsigned)jobs.end[0]) + (blockIdx.y >= (unsigned)jobs.end[1]);
    float x0 = sv[2 * p], x1 = sv[2 * p + 1];
    int e = r0 % head_dim;
    if (job < 2 && e < rope_dim) {
        // rope_pair (rope_kv_write.cu) for the adjacent pair (e, e + 1).
        float s, c;
        q_sin_cos(q_mul(__uint2float_rn(positions[0]), inv_freq[e / 2]), &s, &c);
        float o0 = q_sub(q_mul(x0, c), q_mul(x1, s));
        float o1 = q_add(q_mul(x0, s), q_mul(x1, c));
        x0 = o0;
        x1 = o1;
    }
    jb.out[r0] = x0;
    jb.out[r0 + 1] = x1;
    u32 slot = slots[0];
    if (job > 0 && (long long)slot < n_cells) {
        u16* cell = (job == 1 ? kc : vc) + (long long)slot * jb.m + r0;
        cell[0] = kv_f16(x0);
        cell[1] = kv_f16(x1);
    }
}

// Rows of act per unrolled step of the prologue (loads in flight).
#define SW_UNROLL 4

// out (1, m) (=, or +=) act · wᵀ, act = silu(gate) * up (k values), with
// W warps per weight row as mv_q8_body. Dynamic shared memory: k int8 and
// k / 32 float2 (16-byte aligned start).
template <int W>
__device__ __forceinline__ void mv_q8_swiglu_body(MmJobs jobs, int k, long long row_bytes, int ty,
                                                  const float* __restrict__ gate,
                                                  const float* __restrict__ up,
                                                  float* __restrict__ act, int trigger) {
    extern __shared__ __align__(16) unsigned char sw_smem[];
    signed char* sq = (signed char*)sw_smem;   // (k) int8
    float2* sds = (float2*)(sw_smem + k);       // (k / 32) {d, d * sum(q)}
    MmJob jb = mm_job(jobs, blockIdx.y);
    int warp = threadIdx.x >> 5, l = threadIdx.x & 31;
    int row = jb.by * (8 / W) + warp / W;
    bool live = row < jb.m;
    const u8* wr = jb.w + (long long)min(row, jb.m - 1) * row_bytes;
    if (MV_PREFETCH && jobs.prefetch)
        prefetch_line(wr, row_bytes, l + 32 * (warp % W), MV_PREFETCH == 2);
    GRID_WAIT();
    if (trigger == 0) GRID_TRIGGER();
    int nb = k / 32;
    bool keep = blockIdx.y == 0;
    // Warp w quantizes blocks w, w + 8, ... (swiglu_q8: lane l holds value
    // l of its block), SW_UNROLL blocks' loads at a time.
    for (int b0 = warp; b0 < nb; b0 += 8 * SW_UNROLL) {
        float g[SW_UNROLL], u[SW_UNROLL];
#pragma unroll
        for (int i = 0; i < SW_UNROLL; i++) {
            int b = b0 + 8 * i;
            if (b < nb) {
                g[i] = gate[32 * b + l];
                u[i] = up[32 * b + l];
            }
        }
#pragma unroll
        for (int i = 0; i < SW_UNROLL; i++) {
            int b = b0 + 8 * i;
            if (b >= nb) break;
            float a = q_mul(q_silu(g[i]), u[i]);
            if (keep) act[32 * b + l] = a;
            q8_block<1>(&a, l, sq + 32 * b, sds + b);
        }
    }
    __syncthreads();
    if (trigger == 1) GRID_TRIGGER();
    if (W == 1 && !live) return;
    float acc[1] = {0.0f};
#define MV_Q8_ROW(T) \
    mv_q8_row<T, 1, MV_UNITS1>(wr, nb, sq, sds, k, 1, l + 32 * (warp % W), 32 * W, acc)
    QTYPE_DISPATCH(ty, MV_Q8_ROW)
#undef MV_Q8_ROW
    mv_finish<1, W>(acc, 1, jb.m, min(row, jb.m - 1), live, warp, l, jb.out, jb.add);
}

extern "C" __global__ void MV_R1_BOUNDS mv_q8_r1_swiglu(MmJobs jobs, int k, long long row_bytes,
                                                        int ty, const float* __restrict__ gate,
                                                        const float* __restrict__ up,
                                                        float* __restrict__ act, int trigger) {
    mv_q8_swiglu_body<1>(jobs, k, row_bytes, ty, gate, up, act, trigger);
}
extern "C" __global__ void mv_q8_r1_w2_swiglu(MmJobs jobs, int k, long long row_bytes, int ty,
                                              const float* __restrict__ gate,
                                              const float* __restrict__ up,
                                              float* __restrict__ act, int trigger) {
    mv_q8_swiglu_body<2>(jobs, k, row_bytes, ty, gate, up, act, trigger);
}
