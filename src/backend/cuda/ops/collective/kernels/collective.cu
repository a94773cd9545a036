// Tensor-parallel collectives' own arithmetic around NCCL's data movement.

// parts (world, n, w): NCCL's all-gather of every rank's (n, w), rank-major.
// out (n, world * w): rank r's row i at [i * world * w + r * w ..][..w]; with
// add, added to out (one rounding, as the add op).
extern "C" __global__ void tp_interleave(const float* __restrict__ parts,
                                         float* __restrict__ out, int n, int w,
                                         int world, int add) {
    GRID_DEP();
    long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long total = (long long)n * w * world;
    if (t >= total) return;
    int j = (int)(t % w);
    long long q = t / w;
    int r = (int)(q % world);
    long long row = q / world;
    float v = parts[((long long)r * n + row) * w + j];
    out[t] = add ? q_add(out[t], v) : v;
}

// parts (world, len): every rank's partial sums. out[e] += the sum in rank
// order, (((p0 + p1) + p2) + ...), the bits of the cpu's in-process group.
extern "C" __global__ void tp_sum_ranks(const float* __restrict__ parts,
                                        float* __restrict__ out, long long len,
                                        int world) {
    GRID_DEP();
    long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= len) return;
    float s = parts[e];
    for (int r = 1; r < world; ++r) s = q_add(s, parts[(long long)r * len + e]);
    out[e] = q_add(out[e], s);
}
