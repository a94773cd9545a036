// Rotary embedding in place with canonical sin/cos. One thread per
// (row, head, pair). angle = (pos as f32) * inv_freq[i];
// o0 = (x0*c) - (x1*s), o1 = (x0*s) + (x1*c).
extern "C" __global__ void rope(float* __restrict__ x, int n, int n_heads, int head_dim,
                                int rope_dim, const u32* __restrict__ positions,
                                const float* __restrict__ inv_freq, int neox) {
    GRID_DEP();
    int half = rope_dim / 2;
    long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (long long)n * n_heads * half) return;
    int i = (int)(t % half);
    long long rh = t / half;  // row * n_heads + head
    int r = (int)(rh / n_heads);
    float s, c;
    q_sin_cos(q_mul(__uint2float_rn(positions[r]), inv_freq[i]), &s, &c);
    float* hp = x + rh * head_dim;
    int a = neox ? i : 2 * i;
    int b = neox ? i + half : 2 * i + 1;
    float x0 = hp[a], x1 = hp[b];
    hp[a] = q_sub(q_mul(x0, c), q_mul(x1, s));
    hp[b] = q_add(q_mul(x0, s), q_mul(x1, c));
}
