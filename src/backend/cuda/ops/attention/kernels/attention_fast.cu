// Paged attention for the fast and deterministic modes (not the canonical
// arithmetic: FMA, __expf; see attention.cu for exact). Both kernels here
// are batch- and KV-cache invariant. The split-KV partition and merge:
// attention_split.cuh, which the kernel table (ops/kernels.rs) puts before this file; the
// pipelined GQA kernels: attention_pipe_fast.cu.

// Fallback for head_dim not a multiple of 8: one block of ATT_WARPS warps per (row,
// head). Warp w visits the groups of 4 keys g = w, w + ATT_WARPS, ... (key
// j belongs to warp (j / 4) % ATT_WARPS whatever the context length or
// chunking); lane l owns dimensions l, l + 32, ... of q, the accumulator
// and each K/V row, so every K/V row is read coalesced. Per key an online
// softmax (__expf);
// the dot products of a group are reduced by a fixed xor-shuffle tree.
// The warps' partial (max, sum, acc) are combined in warp order. Every
// row's result depends only on its own keys, in a fixed order: batch- and
// KV-cache invariant, not bitwise equal to the cpu.
#define ATT_WARPS 8

extern "C" __global__ void paged_attention_fast(ATT_ROWHEAD_PARAMS) {
    GRID_DEP();
    __shared__ float part_m[ATT_WARPS], part_l[ATT_WARPS];
    __shared__ float part_acc[ATT_WARPS][256];
    int rh = blockIdx.x;
    if (rh >= n_rows * n_heads) return;
    int w = threadIdx.x >> 5, l = threadIdx.x & 31;
    int r = rh / n_heads, h = rh % n_heads;
    int hd = head_dim;
    int kvh = h / (n_heads / n_kv_heads);
    const float* qv = q + (long long)rh * hd;
    float qr[ATT_MAXD], acc[ATT_MAXD];
#pragma unroll
    for (int u = 0; u < ATT_MAXD; u++) {
        int d = l + 32 * u;
        qr[u] = d < hd ? qv[d] * scale : 0.0f;
        acc[u] = 0.0f;
    }
    const u32* table = tables + table_off[row_seq[r]];
    int pos = (int)positions[r];
    float m = Q_NINF, lsum = 0.0f;
    for (int j0 = 4 * w; j0 <= pos; j0 += 4 * ATT_WARPS) {
        float s[4];
        long long off[4];
#pragma unroll
        for (int t = 0; t < 4; t++) {
            int j = j0 + t;
            s[t] = 0.0f;
            off[t] = -1;
            if (j <= pos) {
                long long cell = (long long)table[j / block_size] * block_size + j % block_size;
                off[t] = (cell * n_kv_heads + kvh) * hd;
                const u16* kr = kc + off[t];
#pragma unroll
                for (int u = 0; u < ATT_MAXD; u++) {
                    int d = l + 32 * u;
                    if (d < hd) s[t] += qr[u] * q_f16(kr[d]);
                }
            }
        }
#pragma unroll
        for (int st = 16; st >= 1; st >>= 1) {
#pragma unroll
            for (int t = 0; t < 4; t++) s[t] += __shfl_xor_sync(0xffffffffu, s[t], st, 32);
        }
#pragma unroll
        for (int t = 0; t < 4; t++) {
            if (off[t] < 0) continue;
            float m_new = fmaxf(m, s[t]);
            float alpha = __expf(m - m_new);
            float p = __expf(s[t] - m_new);
            lsum = lsum * alpha + p;
            const u16* vr = vc + off[t];
#pragma unroll
            for (int u = 0; u < ATT_MAXD; u++) {
                int d = l + 32 * u;
                if (d < hd) acc[u] = acc[u] * alpha + p * q_f16(vr[d]);
            }
            m = m_new;
        }
    }
    if (l == 0) {
        part_m[w] = m;
        part_l[w] = lsum;
    }
#pragma unroll
    for (int u = 0; u < ATT_MAXD; u++) {
        int d = l + 32 * u;
        if (d < hd) part_acc[w][d] = acc[u];
    }
    __syncthreads();
    if (w != 0) return;
    // Warp 0 combines the partials in warp order (warp 0 always holds key 0,
    // so the maximum is finite unless a score is NaN/Inf).
    float mx = part_m[0];
    for (int i = 1; i < ATT_WARPS; i++) mx = fmaxf(mx, part_m[i]);
    float L = 0.0f;
    float o[ATT_MAXD];
#pragma unroll
    for (int u = 0; u < ATT_MAXD; u++) o[u] = 0.0f;
    for (int i = 0; i < ATT_WARPS; i++) {
        if (part_l[i] == 0.0f) continue; // a warp that saw no key
        float f = __expf(part_m[i] - mx);
        L += part_l[i] * f;
#pragma unroll
        for (int u = 0; u < ATT_MAXD; u++) {
            int d = l + 32 * u;
            if (d < hd) o[u] += part_acc[i][d] * f;
        }
    }
    float* op = out + (long long)rh * hd;
#pragma unroll
    for (int u = 0; u < ATT_MAXD; u++) {
        int d = l + 32 * u;
        if (d < hd) op[d] = o[u] / L;
    }
}


// part: (n_rows * n_heads, stride, 2 + head_dim) = {m, l, acc[head_dim]}.
// head_dim <= 256 and a multiple of 8.
extern "C" __global__ void paged_attention_split(
    const float* __restrict__ q, int n_rows, int n_heads, int n_kv_heads, int head_dim,
    int block_size, float scale, const u16* __restrict__ kc, const u16* __restrict__ vc,
    const u32* __restrict__ tables, const u32* __restrict__ table_off,
    const u32* __restrict__ row_seq, const u32* __restrict__ positions, int stride,
    int n_parts, float* __restrict__ part) {
    GRID_DEP();
    __shared__ float qs[256];
    __shared__ float wm[ATT_SPLIT_WARPS], wl[ATT_SPLIT_WARPS];
    __shared__ float wacc[ATT_SPLIT_WARPS][256];
    __shared__ long long woff[ATT_SPLIT_WARPS][32];
    __shared__ float wp[ATT_SPLIT_WARPS][32];
    __shared__ uint4 vst[ATT_SPLIT_WARPS][ATT_VSTAGE * 32];
    int rh = blockIdx.x;
    int w = threadIdx.x >> 5, l = threadIdx.x & 31;
    int r = rh / n_heads, h = rh % n_heads;
    int hd = head_dim, cpr = hd / 8;
    int kvh = h / (n_heads / n_kv_heads);
    int pos = (int)positions[r];
    int n_chunks = pos / ATT_CHUNK + 1;
    if ((int)blockIdx.y >= min(n_chunks, n_parts)) return;
    const float* qv = q + (long long)rh * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) qs[d] = qv[d] * scale;
    __syncthreads();
    const u32* table = tables + table_off[row_seq[r]];
    for (int p = blockIdx.y; p < min(n_chunks, n_parts); p += gridDim.y) {
        float m = Q_NINF, lsum = 0.0f;
        float acc[ATT_MAXD];
#pragma unroll
        for (int u = 0; u < ATT_MAXD; u++) acc[u] = 0.0f;
        for (int s = p; s < n_chunks; s += n_parts) {
            for (int g0 = s * ATT_CHUNK + 32 * w; g0 < (s + 1) * ATT_CHUNK && g0 <= pos;
                 g0 += 32 * ATT_SPLIT_WARPS) {
                int j = g0 + l;
                bool ok = j <= pos;
                long long off = 0;
                float sc = Q_NINF;
                if (ok) {
                    long long cell = (long long)table[j / block_size] * block_size + j % block_size;
                    off = (cell * n_kv_heads + kvh) * hd;
                    const uint4* kr = (const uint4*)(kc + off);
                    float d0 = 0.0f, d1 = 0.0f;
#pragma unroll 4
                    for (int c = 0; c < cpr; c++) {
                        uint4 v = kr[c];
                        u32 hv[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
                        for (int i = 0; i < 4; i++) {
                            d0 = fmaf(qs[8 * c + 2 * i], q_f16((u16)(hv[i] & 0xFFFF)), d0);
                            d1 = fmaf(qs[8 * c + 2 * i + 1], q_f16((u16)(hv[i] >> 16)), d1);
                        }
                    }
                    sc = d0 + d1;
                }
                float mr = sc;
#pragma unroll
                for (int st = 16; st >= 1; st >>= 1) mr = fmaxf(mr, __shfl_xor_sync(0xffffffffu, mr, st));
                float m_new = fmaxf(m, mr);
                float alpha = (m == Q_NINF) ? 0.0f : __expf(m - m_new);
                float pj = ok ? __expf(sc - m_new) : 0.0f;
                float ps = pj;
#pragma unroll
                for (int st = 16; st >= 1; st >>= 1) ps += __shfl_xor_sync(0xffffffffu, ps, st);
                lsum = lsum * alpha + ps;
#pragma unroll
                for (int u = 0; u < ATT_MAXD; u++) acc[u] *= alpha;
                woff[w][l] = off;
                wp[w][l] = pj;
                int nk = min(32, pos - g0 + 1);
                for (int t0 = 0; t0 < nk; t0 += ATT_VSTAGE) {
                    int nt = min(ATT_VSTAGE, nk - t0);
                    __syncwarp();
                    for (int idx = l; idx < nt * cpr; idx += 32) {
                        int t = idx / cpr, c = idx - t * cpr;
                        vst[w][t * cpr + c] = ((const uint4*)(vc + woff[w][t0 + t]))[c];
                    }
                    __syncwarp();
                    const u16* vs = (const u16*)vst[w];
                    for (int t = 0; t < nt; t++) {
                        float pt = wp[w][t0 + t];
#pragma unroll
                        for (int u = 0; u < ATT_MAXD; u++) {
                            int d = l + 32 * u;
                            if (d < hd) acc[u] = fmaf(pt, q_f16(vs[t * hd + d]), acc[u]);
                        }
                    }
                }
                __syncwarp();
                m = m_new;
            }
        }
        if (l == 0) {
            wm[w] = m;
            wl[w] = lsum;
        }
#pragma unroll
        for (int u = 0; u < ATT_MAXD; u++) {
            int d = l + 32 * u;
            if (d < hd) wacc[w][d] = acc[u];
        }
        __syncthreads();
        if (w == 0) {
            float mx = Q_NINF;
            for (int i = 0; i < ATT_SPLIT_WARPS; i++)
                if (wl[i] != 0.0f) mx = fmaxf(mx, wm[i]);
            float L = 0.0f;
            float o[ATT_MAXD];
#pragma unroll
            for (int u = 0; u < ATT_MAXD; u++) o[u] = 0.0f;
            for (int i = 0; i < ATT_SPLIT_WARPS; i++) {
                if (wl[i] == 0.0f) continue;  // a warp that saw no key
                float f = __expf(wm[i] - mx);
                L += wl[i] * f;
#pragma unroll
                for (int u = 0; u < ATT_MAXD; u++) {
                    int d = l + 32 * u;
                    if (d < hd) o[u] = fmaf(wacc[i][d], f, o[u]);
                }
            }
            float* pp = part + ((long long)rh * stride + p) * (2 + hd);
            if (l == 0) {
                pp[0] = mx;
                pp[1] = L;
            }
#pragma unroll
            for (int u = 0; u < ATT_MAXD; u++) {
                int d = l + 32 * u;
                if (d < hd) pp[2 + d] = o[u];
            }
        }
        __syncthreads();
    }
}


#define ATT_COMBINE(NAME, MAXU, LOADS)                                                        \
    extern "C" __global__ void NAME(const float* __restrict__ part, int n_rows, int n_heads,  \
                                    int head_dim, const u32* __restrict__ positions,          \
                                    int stride, int n_parts, float* __restrict__ out,         \
                                    signed char* __restrict__ xq, float2* __restrict__ xds) { \
        unsigned long long g0 = 0, g1 = 0, g2 = 0;                                            \
        if (ATT_STAMP) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(g0));                \
        GRID_DEP();                                                                           \
        if (ATT_STAMP) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(g1));                \
        int rh = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);                         \
        if (rh >= n_rows * n_heads) return;                                                   \
        att_combine_rh<MAXU, LOADS, false>(part, rh, rh, (int)positions[rh / n_heads],        \
                                           head_dim, stride, n_parts, out, xq, xds);          \
        if (ATT_STAMP && threadIdx.x == 0 && blockIdx.x == 0 &&                               \
            positions[0] % 64 == 0) {                                                         \
            asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(g2));                            \
            printf("ATT_STAMP combine pos=%u entry_ns=%llu wait_ns=%llu work_ns=%llu\n",       \
                   positions[0], g0, g1 - g0, g2 - g1);                                       \
        }                                                                                     \
    }
ATT_COMBINE(attention_combine, 8, 8)
ATT_COMBINE(attention_combine_d128, 4, 16)
