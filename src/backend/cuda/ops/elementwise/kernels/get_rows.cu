// Embedding lookup: out (n_ids, cols) = dequantized table rows
// (q_dequant of dequant.cuh). One thread per output element.

// ids are device values: an id >= table_rows (never uploaded by the
// executor, which checks them) reads as NaN instead of out of bounds.
extern "C" __global__ void get_rows(const u8* __restrict__ table, int table_rows, int cols,
                                    long long row_bytes, int ty, const u32* __restrict__ ids,
                                    int n_ids, float* __restrict__ out) {
    GRID_DEP();
    long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (long long)n_ids * cols) return;
    int r = (int)(t / cols), e = (int)(t % cols);
    if (ids[r] >= (u32)table_rows) {
        out[t] = __int_as_float(0x7fc00000);
        return;
    }
    const u8* row = table + (long long)ids[r] * row_bytes;
    out[t] = q_dequant(row, e, ty);
}
