// K/V rows (f32) -> f16, round to nearest even. With the host-slice op
// interface the kernel writes row i of the converted K/V to `k16 + i * row`;
// the host stores row i into physical cell slots[i] (in row order, so a
// repeated slot keeps the last row, as on the CPU). A device-resident cache
// will write through `slots` directly.
// NaN keeps its sign and top payload bits, quieted (as the `half` crate).
__device__ __forceinline__ u16 kv_f16(float x) {
    u32 b = __float_as_uint(x);
    if ((b & 0x7fffffffu) > 0x7f800000u)
        return (u16)(((b >> 16) & 0x8000u) | 0x7C00u | 0x0200u | ((b & 0x7fffffu) >> 13));
    return q_to_f16(x);
}

extern "C" __global__ void kv_write(const float* __restrict__ k, const float* __restrict__ v,
                                    long long len, u16* __restrict__ k16,
                                    u16* __restrict__ v16) {
    long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= len) return;
    k16[t] = kv_f16(k[t]);
    v16[t] = kv_f16(v[t]);
}
