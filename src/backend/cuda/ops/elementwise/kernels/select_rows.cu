// Row gather: out (m, dim) = x[rows[i]] (a copy, bitwise equal to the cpu).
// rows are device values: a row >= n reads as NaN.
extern "C" __global__ void select_rows(const float* __restrict__ x, int n, int dim,
                                       const u32* __restrict__ rows, int m,
                                       float* __restrict__ out) {
    GRID_DEP();
    long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (long long)m * dim) return;
    int i = (int)(t / dim), e = (int)(t % dim);
    u32 r = rows[i];
    out[t] = r < (u32)n ? x[(long long)r * dim + e] : __int_as_float(0x7fc00000);
}
