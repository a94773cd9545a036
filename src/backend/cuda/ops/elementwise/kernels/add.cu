// Residual add (x += y) and bias add (x[r, :] += bias), elementwise.
extern "C" __global__ void add(float* __restrict__ x, const float* __restrict__ y, long long len) {
    GRID_DEP();
    long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= len) return;
    x[t] = q_add(x[t], y[t]);
}

extern "C" __global__ void add_bias(float* __restrict__ x, const float* __restrict__ bias,
                                    long long len, int dim) {
    GRID_DEP();
    long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= len) return;
    x[t] = q_add(x[t], bias[t % dim]);
}

// x += 0.0 elementwise (a MatMuls job with k = 0 adds a zero product: -0
// becomes +0, as on the cpu).
extern "C" __global__ void add_zero(float* __restrict__ x, long long len) {
    GRID_DEP();
    long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= len) return;
    x[t] = q_add(x[t], 0.0f);
}
