// Paged causal attention reading f16 K/V through block tables in the
// kernel (cell = table[j / B] * B + j % B), decode and prefill rows alike.
// Canonical arithmetic (src/backend/cpu/ops/attention.rs): per (row, head),
// chunks of 32 key positions aligned to absolute position 0; thread j of
// a warp computes s_j with its own 32-lane dot32 (registers); the chunk
// max is an exact warp reduction; the sums over j are sequential in j.
// paged_attention: one warp per (row, head), the chunks in order, a
// chunk's V rows queued into shared memory (cp.async) before its K rows
// are read, so both are in flight together; paged_attention_par: CTAs
// of ATT_EX_W warps over the chunks, one or a thread-block cluster of
// them per (row, head) (see there), except for rows of at most four
// chunks in launches of more (row, head) pairs than SMs. The same bits. head_dim <= 256 (8 values per thread).

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
__device__ __forceinline__ void att_exact_prefetch(int rh, int n_rows, int n_heads,
                                                   int n_kv_heads, int head_dim, int block_size,
                                                   const u16* __restrict__ kc,
                                                   const u16* __restrict__ vc,
                                                   const u32* __restrict__ tables,
                                                   const u32* __restrict__ table_off,
                                                   const u32* __restrict__ row_seq,
                                                   const u32* __restrict__ positions, int k,
                                                   int S) {
    if (ATT_EXACT_PREFETCH > 0 && rh < n_rows * n_heads) {
        int r0 = rh / n_heads;
        int kv0 = (rh % n_heads) / (n_heads / n_kv_heads);
        const u32* tb = tables + table_off[row_seq[r0]];
        int last = min((int)positions[r0], ATT_EXACT_PREFETCH - 1);
        long long row_bytes = 2LL * head_dim;
        // The S CTAs of a cluster take every S-th key each.
        for (int j = k + S * threadIdx.x; j <= last; j += S * blockDim.x) {
            long long cell = (long long)tb[j / block_size] * block_size + j % block_size;
            long long off = (cell * n_kv_heads + kv0) * head_dim;
            for (int line = 0; line <= (int)(row_bytes / 128); line++) {
                prefetch_line(kc + off, row_bytes, line, true);
                prefetch_line(vc + off, row_bytes, line, true);
            }
        }
    }
}

// Groups of 32 K values a lane's loads keep in flight at once in
// att_exact_score (tuning knob; loads only, the same bits).
#ifndef ATT_EX_KU
#define ATT_EX_KU 2
#endif

// The score s_j = dot32(q, k_j) * scale of key j (its K row at kr) in the
// canonical order: element e + t lands in lane[t], in increasing e, then
// the dot32 tree. qs: q in shared memory.
__device__ __forceinline__ float att_exact_score(const float* qs, const u16* __restrict__ kr,
                                                 int hd, float scale) {
    float lane[32];
#pragma unroll
    for (int t = 0; t < 32; t++) lane[t] = 0.0f;
    if (hd % 8 == 0) {
        constexpr int ku = ATT_EX_KU;
#pragma unroll ku
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

// vs_c[d] = sum_t p_t v_t[d] of one chunk (sequential in t, as
// att_exact_pv) for head_dim 32 G, lane l owning the G consecutive values
// d = G l .. G l + G - 1 (which lane adds a d changes no bits): the V rows
// of ATT_EX_VB keys at a time are loaded (one 2G-byte load per key and
// lane, all in flight together) before their sums, so a chunk waits for
// memory 32 / ATT_EX_VB times, not once per key. cell: lane l's cache
// cell of key l of the chunk (shuffled to all lanes); p: the chunk's p_t
// (shared); cnt keys; out: vs_c (shared, head_dim floats).
#ifndef ATT_EX_VB
#define ATT_EX_VB 16
#endif
template <int G> struct AttExVec;
template <> struct AttExVec<1> { typedef unsigned short T; };
template <> struct AttExVec<2> { typedef u32 T; };
template <> struct AttExVec<4> { typedef uint2 T; };
template <> struct AttExVec<8> { typedef uint4 T; };
template <int G>
__device__ __forceinline__ void att_exact_vs_chunk(const float* p, int cnt,
                                                   const u16* __restrict__ vc, long long cell,
                                                   int n_kv_heads, int kvh, int hd, int l,
                                                   float* out) {
    // G u16 values: one u16, u32, uint2 or uint4 load.
    using V = typename AttExVec<G>::T;
    constexpr int KB = G == 8 ? (ATT_EX_VB < 16 ? ATT_EX_VB : 16) : ATT_EX_VB;
    float vs[G];
#pragma unroll
    for (int g = 0; g < G; g++) vs[g] = 0.0f;
    for (int t0 = 0; t0 < cnt; t0 += KB) {
        V buf[KB];
#pragma unroll
        for (int i = 0; i < KB; i++) {
            long long ct = __shfl_sync(0xffffffffu, cell, (t0 + i) & 31);
            if (t0 + i < cnt) buf[i] = *(const V*)(vc + (ct * n_kv_heads + kvh) * hd + G * l);
        }
#pragma unroll
        for (int i = 0; i < KB; i++) {
            if (t0 + i < cnt) {
                float pt = p[t0 + i];
                const u16* h = (const u16*)&buf[i];
#pragma unroll
                for (int g = 0; g < G; g++) vs[g] = q_add(vs[g], q_mul(pt, q_f16(h[g])));
            }
        }
    }
#pragma unroll
    for (int g = 0; g < G; g++) out[G * l + g] = vs[g];
}

// One warp per (row, head) (the file's header).
extern "C" __global__ void paged_attention(ATT_ROWHEAD_PARAMS) {
    att_exact_prefetch(blockIdx.x, n_rows, n_heads, n_kv_heads, head_dim, block_size, kc, vc,
                       tables, table_off, row_seq, positions, 0, 1);
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

// paged_attention with a sliding window, a softcap, ALiBi slopes or sink
// logits (every mode; cpu ops/attention.rs has the canonical order): one
// warp per (row, head); the chunks stay aligned to position 0 and only
// visible keys (from lo = pos + 1 - window) are read, so a block wholly
// before the window is never touched. alibi / sinks: (n_heads,) or null.
extern "C" __global__ void paged_attention_opts(ATT_ROWHEAD_PARAMS, int window, float softcap,
                                                const float* __restrict__ alibi,
                                                const float* __restrict__ sinks) {
    GRID_DEP();
    __shared__ float qs[256];
    __shared__ float ps[32];
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
    int lo = window > 0 ? max(0, pos + 1 - window) : 0;
    float slope = alibi ? alibi[h] : 0.0f;
    float acc[ATT_MAXD];
#pragma unroll
    for (int u = 0; u < ATT_MAXD; u++) acc[u] = 0.0f;
    float m = Q_NINF, lsum = 0.0f;
    for (int j0 = lo; j0 <= pos; j0 = (j0 / 32 + 1) * 32) {
        int cnt = min((j0 / 32 + 1) * 32, pos + 1) - j0;
        int j = j0 + l;
        float s = Q_NINF;
        if (l < cnt) {
            long long cell = (long long)table[j / block_size] * block_size + j % block_size;
            s = att_exact_score(qs, kc + (cell * n_kv_heads + kvh) * hd, hd, scale);
            if (softcap != 0.0f) s = q_mul(softcap, q_tanh(q_div(s, softcap)));
            if (alibi) s = q_add(s, q_mul(slope, -(float)(pos - j)));
        }
        float cmax = q_max(Q_NINF, s);
        for (int st = 16; st >= 1; st >>= 1)
            cmax = q_max(cmax, __shfl_xor_sync(0xffffffffu, cmax, st, 32));
        float m_new = q_max(m, cmax);
        float alpha = q_exp(q_sub(m, m_new));
        ps[l] = (l < cnt) ? q_exp(q_sub(s, m_new)) : 0.0f;
        __syncwarp();
        float ls = 0.0f;
        for (int t = 0; t < cnt; t++) ls = q_add(ls, ps[t]);
        lsum = q_add(q_mul(lsum, alpha), ls);
        float vs[ATT_MAXD];
#pragma unroll
        for (int u = 0; u < ATT_MAXD; u++) vs[u] = 0.0f;
        for (int t = 0; t < cnt; t++) {
            int jt = j0 + t;
            long long cell = (long long)table[jt / block_size] * block_size + jt % block_size;
            att_exact_pv(vs, ps[t], vc + (cell * n_kv_heads + kvh) * hd, l, hd);
        }
#pragma unroll
        for (int u = 0; u < ATT_MAXD; u++) acc[u] = q_add(q_mul(acc[u], alpha), vs[u]);
        m = m_new;
        __syncwarp();
    }
    if (sinks) {
        float t = sinks[h];
        float mf = q_max(m, t);
        float a = q_exp(q_sub(m, mf));
        lsum = q_add(q_mul(lsum, a), q_exp(q_sub(t, mf)));
#pragma unroll
        for (int u = 0; u < ATT_MAXD; u++) acc[u] = q_mul(acc[u], a);
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
// order-free). So paged_attention_par computes the same operations with
// the same operands over rounds of ATT_EX_CH chunks, each round's chunks
// split in contiguous ranges over the S CTAs of a thread-block cluster
// (S = 1 without one) of ATT_EX_W warps each, in four phases: (A) every
// warp scores its chunks (lane j: key 32c + j) and takes each chunk's
// maximum; (B) every CTA reads all the round's chunk maxima (its cluster
// peers' through distributed shared memory) and forms the prefix maxima;
// (C) every warp turns its chunks' scores into p, ls_c, vs_c and alpha_c;
// (D) CTA 0 gathers its peers' ls_c, alpha_c and vs_c and its warp 0 folds
// the chunks in order. Bitwise the single-warp loop (and the cpu): the
// parallel phases reorder nothing within a sum. The cluster spreads a
// (row, head) over S SMs where a launch has too few (row, head) pairs to
// fill the GPU (batch-1 decode: 32 CTAs on 132 SMs); the host picks S
// and launches clusters only on sm_90+.
#ifndef ATT_EX_W
#define ATT_EX_W 8
#endif
#define ATT_EX_CH 32

// The float at p (a shared address of this kernel) in the shared memory
// of cluster CTA `rank`.
__device__ __forceinline__ float att_ex_peer(const float* p, int rank) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    u32 ra = cl_peer(p, rank);
    float v;
    asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(ra) : "memory");
    return v;
#else
    return *p;
#endif
}

// paged_attention_par's body; its two entries differ only in their
// launch bounds: paged_attention_par at one CTA per SM (up to 255
// registers: the fewest stalls, for launches of at most one wave, batch-1
// decode in clusters) and paged_attention_par2 at two (128 registers,
// some spilled: more warps per SM for launches of several waves). The
// same bits.
__device__ __forceinline__ void paged_attention_par_body(ATT_ROWHEAD_PARAMS) {
    int k;
    int S = cl_shape(&k);
    int rh = blockIdx.x / S;  // a cluster's CTAs are consecutive in x
    att_exact_prefetch(rh, n_rows, n_heads, n_kv_heads, head_dim, block_size, kc, vc, tables,
                       table_off, row_seq, positions, k, S);
    GRID_DEP();
    __shared__ float qs[256];
    __shared__ float ss[ATT_EX_CH * 32];        // this CTA's chunks' scores, then p
    // Per chunk of the round: its maximum (owner's, read by the peers),
    // all maxima gathered, the prefix maxima before / after it, ls_c and
    // alpha_c (owner's; CTA 0 gathers them).
    __shared__ float cmax_s[ATT_EX_CH], cm[ATT_EX_CH], mprev[ATT_EX_CH], mnew[ATT_EX_CH];
    __shared__ float lss[ATT_EX_CH], alph[ATT_EX_CH];
    __shared__ float vss[ATT_EX_CH][256];       // vs_c[d]
    __shared__ float m_run;
    if (rh >= n_rows * n_heads) return;  // whole clusters
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
    // Warp 0's state in CTA 0 (every lane holds lsum; lane l the d = l + 32u).
    float acc[ATT_MAXD];
#pragma unroll
    for (int u = 0; u < ATT_MAXD; u++) acc[u] = 0.0f;
    float lsum = 0.0f;
    for (int b0 = 0; b0 <= pos; b0 += 32 * ATT_EX_CH) {
        int nch = min(ATT_EX_CH, (pos - b0) / 32 + 1);
        // This CTA's chunks of the round: [c_lo, c_hi); chunk c's owner is c / per.
        int per = (nch + S - 1) / S;
        int c_lo = min(nch, k * per), c_hi = min(nch, c_lo + per);
        // (A) scores and chunk maxima.
        for (int c = c_lo + w; c < c_hi; c += ATT_EX_W) {
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
            if (l == 0) cmax_s[c] = cmax;
        }
        cl_sync(S);
        // (B) every chunk maximum of the round, then the prefix maxima
        // (every CTA computes the same ones).
        for (int c = threadIdx.x; c < nch; c += blockDim.x)
            cm[c] = c / per == k ? cmax_s[c] : att_ex_peer(&cmax_s[c], c / per);
        __syncthreads();
        if (threadIdx.x == 0) {
            float m = m_run;
            for (int c = 0; c < nch; c++) {
                float m_new = q_max(m, cm[c]);
                mprev[c] = m;
                mnew[c] = m_new;
                m = m_new;
            }
            m_run = m;
        }
        __syncthreads();
        // (C) p, ls_c, vs_c and alpha_c of each of this CTA's chunks.
        for (int c = c_lo + w; c < c_hi; c += ATT_EX_W) {
            int j0 = b0 + 32 * c;
            int cnt = min(32, pos + 1 - j0);
            float p = (l < cnt) ? q_exp(q_sub(ss[32 * c + l], mnew[c])) : 0.0f;
            ss[32 * c + l] = p;
            __syncwarp();
            float ls = 0.0f;
            for (int t = 0; t < cnt; t++) ls = q_add(ls, ss[32 * c + t]);
            if (l == 0) {
                lss[c] = ls;
                alph[c] = q_exp(q_sub(mprev[c], mnew[c]));
            }
            // Lane l's cell of key j0 + l (lane t's is key t's, shuffled).
            long long cell = 0;
            if (l < cnt) {
                int j = j0 + l;
                cell = (long long)table[j / block_size] * block_size + j % block_size;
            }
            const float* pc = &ss[32 * c];
            switch (hd) {
                case 32: att_exact_vs_chunk<1>(pc, cnt, vc, cell, n_kv_heads, kvh, hd, l, vss[c]); break;
                case 64: att_exact_vs_chunk<2>(pc, cnt, vc, cell, n_kv_heads, kvh, hd, l, vss[c]); break;
                case 128: att_exact_vs_chunk<4>(pc, cnt, vc, cell, n_kv_heads, kvh, hd, l, vss[c]); break;
                case 256: att_exact_vs_chunk<8>(pc, cnt, vc, cell, n_kv_heads, kvh, hd, l, vss[c]); break;
                default: {
                    float vs[ATT_MAXD];
#pragma unroll
                    for (int u = 0; u < ATT_MAXD; u++) vs[u] = 0.0f;
                    for (int t = 0; t < cnt; t++) {
                        long long ct = __shfl_sync(0xffffffffu, cell, t);
                        att_exact_pv(vs, pc[t], vc + (ct * n_kv_heads + kvh) * hd, l, hd);
                    }
#pragma unroll
                    for (int u = 0; u < ATT_MAXD; u++) {
                        int d = l + 32 * u;
                        if (d < hd) vss[c][d] = vs[u];
                    }
                }
            }
        }
        cl_sync(S);
        // (D) CTA 0 gathers the peers' chunks, then folds them in order.
        if (k == 0) {
            if (S > 1) {
                // (Loads batched 8 per thread measured no faster.)
                int own = min(per, nch), row = hd + 2;
                for (int i = threadIdx.x; i < (nch - own) * row; i += blockDim.x) {
                    int c = own + i / row, e = i % row, o = c / per;
                    float* dst = e < hd ? &vss[c][e] : e == hd ? &lss[c] : &alph[c];
                    *dst = att_ex_peer(dst, o);
                }
                __syncthreads();
            }
            if (w == 0) {
                for (int c = 0; c < nch; c++) {
                    float alpha = alph[c];
                    lsum = q_add(q_mul(lsum, alpha), lss[c]);
#pragma unroll
                    for (int u = 0; u < ATT_MAXD; u++) {
                        int d = l + 32 * u;
                        if (d < hd) acc[u] = q_add(q_mul(acc[u], alpha), vss[c][d]);
                    }
                }
            }
        }
        // No CTA writes its shared arrays for the next round (or exits)
        // before CTA 0 has read them.
        cl_sync(S);
    }
    if (k != 0 || w != 0) return;
    float* o = out + (long long)rh * hd;
#pragma unroll
    for (int u = 0; u < ATT_MAXD; u++) {
        int d = l + 32 * u;
        if (d < hd) o[d] = q_div(acc[u], lsum);
    }
}

#define ATT_EX_PAR_ENTRY(NAME, MINB)                                                     \
    extern "C" __global__ void __launch_bounds__(32 * ATT_EX_W, MINB) NAME(ATT_ROWHEAD_PARAMS) { \
        paged_attention_par_body(q, n_rows, n_heads, n_kv_heads, head_dim, block_size, scale, \
                                 kc, vc, tables, table_off, row_seq, positions, out);        \
    }
ATT_EX_PAR_ENTRY(paged_attention_par, 1)
ATT_EX_PAR_ENTRY(paged_attention_par2, 2)
