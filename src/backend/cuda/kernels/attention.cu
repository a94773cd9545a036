// Paged causal attention reading f16 K/V through block tables in the
// kernel (cell = table[j / B] * B + j % B), decode and prefill rows alike.
// Canonical arithmetic (src/backend/cpu/ops/attention.rs): per (row, head),
// chunks of 32 key positions aligned to absolute position 0.
// One warp per (row, head). Thread j of the warp computes s_j with its own
// 32-lane dot32 (registers); the chunk max is an exact warp reduction; the
// sums over j are sequential in j (ls on thread 0; vs per d on the thread
// owning d, d = l, l + 32, ...). head_dim <= 256 (8 values per thread).
// With head_dim a multiple of 8 (16-byte rows), a chunk's V rows are
// queued into shared memory (cp.async) before its K rows are read with
// 16-byte loads, so both are in flight together; the arithmetic and its
// order are the same as with scalar loads.

#define ATT_MAXD 8

// Keys whose K and V rows a warp prefetches into L2 before GRID_DEP()'s
// wait (tuning knob; 0: none), while the previous kernel (the KV write)
// still runs: the start of the row's keys, which its dependent chunk loop
// would otherwise fetch from DRAM one round trip at a time. Only
// positions, row_seq and the block tables are read before the wait (no
// kernel of the step writes them: they are copied from the host before
// its first kernel); an L2 prefetch returns nothing to the SM, so a line
// the predecessor is still writing (the row's own key) cannot be read
// stale. Loads only: no result depends on it.
#ifndef ATT_EXACT_PREFETCH
#define ATT_EXACT_PREFETCH 256
#endif

extern "C" __global__ void paged_attention(
    const float* __restrict__ q, int n_rows, int n_heads, int n_kv_heads, int head_dim,
    int block_size, float scale, const u16* __restrict__ kc, const u16* __restrict__ vc,
    const u32* __restrict__ tables, const u32* __restrict__ table_off,
    const u32* __restrict__ row_seq, const u32* __restrict__ positions,
    float* __restrict__ out) {
    if (ATT_EXACT_PREFETCH > 0 && (int)blockIdx.x < n_rows * n_heads) {
        int r0 = blockIdx.x / n_heads;
        int kv0 = (blockIdx.x % n_heads) / (n_heads / n_kv_heads);
        const u32* tb = tables + table_off[row_seq[r0]];
        int last = min((int)positions[r0], ATT_EXACT_PREFETCH - 1);
        long long row_bytes = 2LL * head_dim;
        for (int j = threadIdx.x; j <= last; j += 32) {
            long long cell = (long long)tb[j / block_size] * block_size + j % block_size;
            long long off = (cell * n_kv_heads + kv0) * head_dim;
            for (int line = 0; line <= (int)(row_bytes / 128); line++) {
                prefetch_line(kc + off, row_bytes, line, true);
                prefetch_line(vc + off, row_bytes, line, true);
            }
        }
    }
    GRID_DEP();
    __shared__ float qs[256];
    __shared__ float ps[32];
    __shared__ __align__(16) u16 vsm[32 * 256];  // (32 keys, head_dim) of a chunk
    int rh = blockIdx.x;
    if (rh >= n_rows * n_heads) return;
    int r = rh / n_heads, h = rh % n_heads;
    int l = threadIdx.x;
    int hd = head_dim;
    int kvh = h / (n_heads / n_kv_heads);
    const float* qv = q + (long long)rh * hd;
    for (int d = l; d < hd; d += 32) qs[d] = qv[d];
    __syncwarp();
    const u32* table = tables + table_off[row_seq[r]];
    int pos = (int)positions[r];
    float acc[ATT_MAXD];
#pragma unroll
    for (int u = 0; u < ATT_MAXD; u++) acc[u] = 0.0f;
    float m = Q_NINF, lsum = 0.0f;
    int full = hd / 32 * 32;
    bool vec = hd % 8 == 0;
    int cpr = hd / 8;
    for (int j0 = 0; j0 <= pos; j0 += 32) {
        int cnt = min(32, pos + 1 - j0);
        int j = j0 + l;
        if (vec) {
            for (int i = l; i < cnt * cpr; i += 32) {
                int t = i / cpr, c = i - t * cpr, jt = j0 + t;
                long long cell = (long long)table[jt / block_size] * block_size + jt % block_size;
                cp_async16(&vsm[t * hd + 8 * c], vc + (cell * n_kv_heads + kvh) * hd + 8 * c, 16);
            }
            cp_async_commit();
        }
        float s = Q_NINF;
        long long off = 0;
        if (l < cnt) {
            long long cell = (long long)table[j / block_size] * block_size + j % block_size;
            off = (cell * n_kv_heads + kvh) * hd;
            const u16* kr = kc + off;
            float lane[32];
#pragma unroll
            for (int t = 0; t < 32; t++) lane[t] = 0.0f;
            if (vec) {
                // Element e + t still lands in lane[t], in increasing e.
#pragma unroll 2
                for (int e = 0; e < hd; e += 32) {
#pragma unroll
                    for (int c4 = 0; c4 < 4; c4++) {
                        if (e + 8 * c4 < hd) {
                            uint4 v = *(const uint4*)(kr + e + 8 * c4);
                            u32 hv[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
                            for (int i = 0; i < 4; i++) {
                                int t = 8 * c4 + 2 * i;
                                float2 kv = q_f16x2(hv[i]);
                                lane[t] = q_add(lane[t], q_mul(qs[e + t], kv.x));
                                lane[t + 1] = q_add(lane[t + 1], q_mul(qs[e + t + 1], kv.y));
                            }
                        }
                    }
                }
            } else {
                for (int e = 0; e < full; e += 32) {
#pragma unroll
                    for (int t = 0; t < 32; t++)
                        lane[t] = q_add(lane[t], q_mul(qs[e + t], q_f16(kr[e + t])));
                }
#pragma unroll
                for (int t = 0; t < 32; t++)
                    if (t < hd - full)
                        lane[t] = q_add(lane[t], q_mul(qs[full + t], q_f16(kr[full + t])));
            }
            // The dot32 tree, written out so every lane[] index is a
            // constant (a loop over st left lane[] in local memory).
#pragma unroll
            for (int t = 0; t < 16; t++) lane[t] = q_add(lane[t], lane[t + 16]);
#pragma unroll
            for (int t = 0; t < 8; t++) lane[t] = q_add(lane[t], lane[t + 8]);
#pragma unroll
            for (int t = 0; t < 4; t++) lane[t] = q_add(lane[t], lane[t + 4]);
            lane[0] = q_add(lane[0], lane[2]);
            lane[1] = q_add(lane[1], lane[3]);
            lane[0] = q_add(lane[0], lane[1]);
            s = q_mul(lane[0], scale);
        }
        // Chunk max: NaN-ignoring, exact and order-free (starts at -inf).
        float cmax = q_max(Q_NINF, s);
        for (int st = 16; st >= 1; st >>= 1)
            cmax = q_max(cmax, __shfl_xor_sync(0xffffffffu, cmax, st, 32));
        float m_new = q_max(m, cmax);
        float alpha = q_exp(q_sub(m, m_new));
        float p = (l < cnt) ? q_exp(q_sub(s, m_new)) : 0.0f;
        ps[l] = p;
        __syncwarp();
        float ls = 0.0f;
        for (int t = 0; t < cnt; t++) ls = q_add(ls, ps[t]);
        lsum = q_add(q_mul(lsum, alpha), ls);
        // vs[d] = sum_j p_j * v_j[d], sequential in j.
        float vs[ATT_MAXD];
#pragma unroll
        for (int u = 0; u < ATT_MAXD; u++) vs[u] = 0.0f;
        if (vec) {
            cp_async_wait_all();
            __syncwarp();
        }
        int blk = j0 / block_size, within = j0 % block_size;
        for (int t = 0; t < cnt; t++) {
            const u16* vr;
            if (vec) {
                vr = &vsm[t * hd];
            } else {
                long long cell = (long long)table[blk] * block_size + within;
                vr = vc + (cell * n_kv_heads + kvh) * hd;
            }
            float pt = ps[t];
#pragma unroll
            for (int u = 0; u < ATT_MAXD; u++) {
                int d = l + 32 * u;
                if (d < hd) vs[u] = q_add(vs[u], q_mul(pt, q_f16(vr[d])));
            }
            if (++within == block_size) {
                within = 0;
                blk++;
            }
        }
#pragma unroll
        for (int u = 0; u < ATT_MAXD; u++) acc[u] = q_add(q_mul(acc[u], alpha), vs[u]);
        m = m_new;
        __syncwarp();
    }
    float* o = out + (long long)rh * hd;
#pragma unroll
    for (int u = 0; u < ATT_MAXD; u++) {
        int d = l + 32 * u;
        if (d < hd) o[d] = q_div(acc[u], lsum);
    }
}
