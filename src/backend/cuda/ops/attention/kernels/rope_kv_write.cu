// RopeKvWrite: rope of q and k in place and the K/V store, in one launch,
// with the arithmetic of rope.cu (canonical sin/cos) and kv_write.cu
// (kv_f16), so every mode gets the bits of Rope, Rope, KvWrite.
//
// One thread per item of a row; a row's items, in order:
//   n_heads * half     q pairs (head, i): rotated in place;
//   n_kv * half        k pairs: rotated in place and stored to the cache;
//   n_kv * tail        k values past rope_dim (tail = head_dim - rope_dim):
//                      stored to the cache;
//   n_kv * head_dim    v values: stored to the cache.
// half = rope_dim / 2. q: (n, n_heads, head_dim); k, v: (n, n_kv, head_dim);
// kc, vc: (n_cells, n_kv * head_dim). Slots of one call are distinct
// (checked on the host); a slot >= n_cells stores nothing.
__device__ __forceinline__ void rope_pair(float* hp, int i, int half, int neox, u32 pos,
                                          const float* __restrict__ inv_freq, float* o0,
                                          float* o1, int* a_out, int* b_out) {
    float s, c;
    q_sin_cos(q_mul(__uint2float_rn(pos), inv_freq[i]), &s, &c);
    int a = neox ? i : 2 * i;
    int b = neox ? i + half : 2 * i + 1;
    float x0 = hp[a], x1 = hp[b];
    *o0 = q_sub(q_mul(x0, c), q_mul(x1, s));
    *o1 = q_add(q_mul(x0, s), q_mul(x1, c));
    hp[a] = *o0;
    hp[b] = *o1;
    *a_out = a;
    *b_out = b;
}

extern "C" __global__ void rope_kv_write(float* __restrict__ q, float* __restrict__ k,
                                         const float* __restrict__ v, int n, int n_heads,
                                         int n_kv, int head_dim, int rope_dim,
                                         const u32* __restrict__ positions,
                                         const float* __restrict__ inv_freq, int neox,
                                         const u32* __restrict__ slots, long long n_cells,
                                         u16* __restrict__ kc, u16* __restrict__ vc) {
    GRID_DEP();
    int half = rope_dim / 2, tail = head_dim - rope_dim;
    long long per_row = (long long)(n_heads + n_kv) * half + (long long)n_kv * tail +
                        (long long)n_kv * head_dim;
    long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (long long)n * per_row) return;
    int r = (int)(t / per_row);
    long long j = t % per_row;
    u32 pos = positions[r];
    u32 slot = slots[r];
    bool store = (long long)slot < n_cells;
    long long row = (long long)n_kv * head_dim;  // cache cell length
    long long qa = (long long)n_heads * half, ka = qa + (long long)n_kv * half;
    long long ta = ka + (long long)n_kv * tail;
    float o0, o1;
    int a, b;
    if (j < qa) {
        int h = (int)(j / half), i = (int)(j % half);
        rope_pair(q + ((long long)r * n_heads + h) * head_dim, i, half, neox, pos, inv_freq, &o0,
                  &o1, &a, &b);
    } else if (j < ka) {
        long long jj = j - qa;
        int h = (int)(jj / half), i = (int)(jj % half);
        rope_pair(k + ((long long)r * n_kv + h) * head_dim, i, half, neox, pos, inv_freq, &o0,
                  &o1, &a, &b);
        if (store) {
            u16* cell = kc + (long long)slot * row + (long long)h * head_dim;
            cell[a] = kv_f16(o0);
            cell[b] = kv_f16(o1);
        }
    } else if (j < ta) {
        long long jj = j - ka;
        int h = (int)(jj / tail), e = rope_dim + (int)(jj % tail);
        long long off = (long long)h * head_dim + e;
        if (store) kc[(long long)slot * row + off] = kv_f16(k[(long long)r * row + off]);
    } else {
        long long e = j - ta;
        if (store) vc[(long long)slot * row + e] = kv_f16(v[(long long)r * row + e]);
    }
}
