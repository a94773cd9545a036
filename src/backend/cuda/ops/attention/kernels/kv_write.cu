// Store K/V rows (f32) into their physical cells of the paged f16 cache,
// round to nearest even (kv_f16, common.cuh). One thread per (row, element). Slots of one call
// are distinct (checked on the host), so no two threads write one cell.
// slots are device values: a slot >= n_cells writes nothing.
// k, v: (n, row); slots: (n,); kc, vc: (n_cells, row) with
// row = n_kv_heads * head_dim.
extern "C" __global__ void kv_write(const float* __restrict__ k, const float* __restrict__ v,
                                    const u32* __restrict__ slots, int n, int row,
                                    long long n_cells, u16* __restrict__ kc,
                                    u16* __restrict__ vc) {
    GRID_DEP();
    long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (long long)n * row) return;
    int i = (int)(t / row), e = (int)(t % row);
    u32 s = slots[i];
    if ((long long)s >= n_cells) return;
    long long dst = (long long)s * row + e;
    kc[dst] = kv_f16(k[t]);
    vc[dst] = kv_f16(v[t]);
}
