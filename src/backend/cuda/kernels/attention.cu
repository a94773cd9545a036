// Paged causal attention reading f16 K/V through block tables in the
// kernel (cell = table[j / B] * B + j % B), decode and prefill rows alike.
// Canonical arithmetic (src/backend/cpu/ops/attention.rs): per (row, head),
// chunks of 32 key positions aligned to absolute position 0; thread j of
// a warp computes s_j with its own 32-lane dot32 (registers); the chunk
// max is an exact warp reduction; the sums over j are sequential in j.
// paged_attention: one warp per (row, head), the chunks in order, a
// chunk's V rows queued into shared memory (cp.async) before its K rows
// are read, so both are in flight together; paged_attention_par: a CTA
// of ATT_EX_W warps per (row, head) over the chunks (see there), for rows
// with more than four chunks. The same bits. head_dim <= 256 (8 values
// per thread).

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

// The L2 prefetch of ATT_EXACT_PREFETCH (above) by the CTA's threads.
__device__ __forceinline__ void att_exact_prefetch(int n_rows, int n_heads, int n_kv_heads,
                                                   int head_dim, int block_size,
                                                   const u16* __restrict__ kc,
                                                   const u16* __restrict__ vc,
                                                   const u32* __restrict__ tables,
                                                   const u32* __restrict__ table_off,
                                                   const u32* __restrict__ row_seq,
                                                   const u32* __restrict__ positions) {
    if (ATT_EXACT_PREFETCH > 0 && (int)blockIdx.x < n_rows * n_heads) {
        int r0 = blockIdx.x / n_heads;
        int kv0 = (blockIdx.x % n_heads) / (n_heads / n_kv_heads);
        const u32* tb = tables + table_off[row_seq[r0]];
        int last = min((int)positions[r0], ATT_EXACT_PREFETCH - 1);
        long long row_bytes = 2LL * head_dim;
        for (int j = threadIdx.x; j <= last; j += blockDim.x) {
            long long cell = (long long)tb[j / block_size] * block_size + j % block_size;
            long long off = (cell * n_kv_heads + kv0) * head_dim;
            for (int line = 0; line <= (int)(row_bytes / 128); line++) {
                prefetch_line(kc + off, row_bytes, line, true);
                prefetch_line(vc + off, row_bytes, line, true);
            }
        }
    }
}

// The score s_j = dot32(q, k_j) * scale of key j (its K row at kr) in the
// canonical order: element e + t lands in lane[t], in increasing e, then
// the dot32 tree. qs: q in shared memory.
__device__ __forceinline__ float att_exact_score(const float* qs, const u16* __restrict__ kr,
                                                 int hd, float scale) {
    float lane[32];
#pragma unroll
    for (int t = 0; t < 32; t++) lane[t] = 0.0f;
    if (hd % 8 == 0) {
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
        int full = hd / 32 * 32;
        for (int e = 0; e < full; e += 32) {
#pragma unroll
            for (int t = 0; t < 32; t++) lane[t] = q_add(lane[t], q_mul(qs[e + t], q_f16(kr[e + t])));
        }
#pragma unroll
        for (int t = 0; t < 32; t++)
            if (t < hd - full) lane[t] = q_add(lane[t], q_mul(qs[full + t], q_f16(kr[full + t])));
    }
    // The dot32 tree, written out so every lane[] index is a constant (a
    // loop over st left lane[] in local memory).
#pragma unroll
    for (int t = 0; t < 16; t++) lane[t] = q_add(lane[t], lane[t + 16]);
#pragma unroll
    for (int t = 0; t < 8; t++) lane[t] = q_add(lane[t], lane[t + 8]);
#pragma unroll
    for (int t = 0; t < 4; t++) lane[t] = q_add(lane[t], lane[t + 4]);
    lane[0] = q_add(lane[0], lane[2]);
    lane[1] = q_add(lane[1], lane[3]);
    lane[0] = q_add(lane[0], lane[1]);
    return q_mul(lane[0], scale);
}

// vs[u] += p_t * v_t[d] for lane l's values d = l + 32u of the V row vr
// (one step of a chunk's sequential sum over its keys).
__device__ __forceinline__ void att_exact_pv(float* vs, float pt, const u16* vr, int l, int hd) {
#pragma unroll
    for (int u = 0; u < ATT_MAXD; u++) {
        int d = l + 32 * u;
        if (d < hd) vs[u] = q_add(vs[u], q_mul(pt, q_f16(vr[d])));
    }
}

// One warp per (row, head) (the file's header).
extern "C" __global__ void paged_attention(
    const float* __restrict__ q, int n_rows, int n_heads, int n_kv_heads, int head_dim,
    int block_size, float scale, const u16* __restrict__ kc, const u16* __restrict__ vc,
    const u32* __restrict__ tables, const u32* __restrict__ table_off,
    const u32* __restrict__ row_seq, const u32* __restrict__ positions,
    float* __restrict__ out) {
    att_exact_prefetch(n_rows, n_heads, n_kv_heads, head_dim, block_size, kc, vc, tables,
                       table_off, row_seq, positions);
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
            s = att_exact_score(qs, kc + off, hd, scale);
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
            att_exact_pv(vs, ps[t], vr, l, hd);
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

// The canonical recurrence over 32-key chunks c (keys 32c .. 32c + 31 of
// the row, up to its position) is
//   m_c = max(m_{c-1}, max_j s_j),  alpha_c = exp(m_{c-1} - m_c),
//   p_j = exp(s_j - m_c),  ls_c = sum_t p_t,  vs_c[d] = sum_t p_t v_t[d]
//   (both sequential in t),  lsum = lsum * alpha_c + ls_c,
//   acc[d] = acc[d] * alpha_c + vs_c[d],
// m_{-1} = -inf. Only the last two lines chain the chunks; the scores do
// not depend on any state, and the m_c are prefix maxima (exact and
// order-free). So a CTA of ATT_EX_W warps per (row, head) computes the
// same operations with the same operands in four phases over blocks of
// ATT_EX_CH chunks: (A) every warp scores its chunks (lane j: key 32c + j)
// and takes each chunk's maximum, (B) one thread forms the prefix maxima,
// (C) every warp turns its chunks' scores into p, ls_c and vs_c, (D) warp
// 0 folds the chunks in order. Bitwise the single-warp loop it replaced
// (and the cpu): the parallel phases reorder nothing within a sum.
#define ATT_EX_W 8
#define ATT_EX_CH 32

extern "C" __global__ void __launch_bounds__(32 * ATT_EX_W) paged_attention_par(
    const float* __restrict__ q, int n_rows, int n_heads, int n_kv_heads, int head_dim,
    int block_size, float scale, const u16* __restrict__ kc, const u16* __restrict__ vc,
    const u32* __restrict__ tables, const u32* __restrict__ table_off,
    const u32* __restrict__ row_seq, const u32* __restrict__ positions,
    float* __restrict__ out) {
    att_exact_prefetch(n_rows, n_heads, n_kv_heads, head_dim, block_size, kc, vc, tables,
                       table_off, row_seq, positions);
    GRID_DEP();
    __shared__ float qs[256];
    __shared__ float ss[ATT_EX_CH * 32];        // the block's scores, then p
    __shared__ float mprev[ATT_EX_CH], mcur[ATT_EX_CH], lss[ATT_EX_CH];
    __shared__ float vss[ATT_EX_CH][256];       // vs_c[d]
    __shared__ float m_run;
    int rh = blockIdx.x;
    if (rh >= n_rows * n_heads) return;  // whole CTAs
    int r = rh / n_heads, h = rh % n_heads;
    int w = threadIdx.x >> 5, l = threadIdx.x & 31;
    int hd = head_dim;
    int kvh = h / (n_heads / n_kv_heads);
    const float* qv = q + (long long)rh * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) qs[d] = qv[d];
    if (threadIdx.x == 0) m_run = Q_NINF;
    __syncthreads();
    const u32* table = tables + table_off[row_seq[r]];
    int pos = (int)positions[r];
    // Warp 0's state (every lane holds lsum; lane l the d = l + 32u).
    float acc[ATT_MAXD];
#pragma unroll
    for (int u = 0; u < ATT_MAXD; u++) acc[u] = 0.0f;
    float lsum = 0.0f;
    for (int b0 = 0; b0 <= pos; b0 += 32 * ATT_EX_CH) {
        int nch = min(ATT_EX_CH, (pos - b0) / 32 + 1);
        // (A) scores and chunk maxima.
        for (int c = w; c < nch; c += ATT_EX_W) {
            int j0 = b0 + 32 * c;
            int cnt = min(32, pos + 1 - j0);
            int j = j0 + l;
            float sc = Q_NINF;
            if (l < cnt) {
                long long cell = (long long)table[j / block_size] * block_size + j % block_size;
                sc = att_exact_score(qs, kc + (cell * n_kv_heads + kvh) * hd, hd, scale);
            }
            ss[32 * c + l] = sc;
            // Chunk max: NaN-ignoring, exact and order-free (starts at -inf).
            float cmax = q_max(Q_NINF, sc);
            for (int st = 16; st >= 1; st >>= 1)
                cmax = q_max(cmax, __shfl_xor_sync(0xffffffffu, cmax, st, 32));
            if (l == 0) mcur[c] = cmax;
        }
        __syncthreads();
        // (B) prefix maxima.
        if (threadIdx.x == 0) {
            float m = m_run;
            for (int c = 0; c < nch; c++) {
                float m_new = q_max(m, mcur[c]);
                mprev[c] = m;
                mcur[c] = m_new;
                m = m_new;
            }
            m_run = m;
        }
        __syncthreads();
        // (C) p, ls_c and vs_c of each chunk.
        for (int c = w; c < nch; c += ATT_EX_W) {
            int j0 = b0 + 32 * c;
            int cnt = min(32, pos + 1 - j0);
            float p = (l < cnt) ? q_exp(q_sub(ss[32 * c + l], mcur[c])) : 0.0f;
            ss[32 * c + l] = p;
            __syncwarp();
            float ls = 0.0f;
            for (int t = 0; t < cnt; t++) ls = q_add(ls, ss[32 * c + t]);
            if (l == 0) lss[c] = ls;
            float vs[ATT_MAXD];
#pragma unroll
            for (int u = 0; u < ATT_MAXD; u++) vs[u] = 0.0f;
            int blk = j0 / block_size, within = j0 % block_size;
            for (int t = 0; t < cnt; t++) {
                long long cell = (long long)table[blk] * block_size + within;
                const u16* vr = vc + (cell * n_kv_heads + kvh) * hd;
                att_exact_pv(vs, ss[32 * c + t], vr, l, hd);
                if (++within == block_size) {
                    within = 0;
                    blk++;
                }
            }
#pragma unroll
            for (int u = 0; u < ATT_MAXD; u++) {
                int d = l + 32 * u;
                if (d < hd) vss[c][d] = vs[u];
            }
        }
        __syncthreads();
        // (D) the chunks folded in order.
        if (w == 0) {
            for (int c = 0; c < nch; c++) {
                float alpha = q_exp(q_sub(mprev[c], mcur[c]));
                lsum = q_add(q_mul(lsum, alpha), lss[c]);
#pragma unroll
                for (int u = 0; u < ATT_MAXD; u++) {
                    int d = l + 32 * u;
                    if (d < hd) acc[u] = q_add(q_mul(acc[u], alpha), vss[c][d]);
                }
            }
        }
        __syncthreads();
    }
    if (w != 0) return;
    float* o = out + (long long)rh * hd;
#pragma unroll
    for (int u = 0; u < ATT_MAXD; u++) {
        int d = l + 32 * u;
        if (d < hd) o[d] = q_div(acc[u], lsum);
    }
}
