// Every transformer layer of a one-row decode step in one launch: one
// thread-block cluster (16 or 8 CTAs, one per SM) runs the layers in order
// (`fast` mode only; sm_90+; launch/decode_layers.rs plans it).
// EXPERIMENTAL, off unless QUIRE_FUSED_LAYERS=1: correct (check-exact
// --mode fast-layers) but measured 4-14x slower than the op-by-op graph;
// docs/PERF.md says where the time goes and what to change next.
//
// Why: at batch 1 a small model's step is a chain of about ten dependent
// kernels per layer, each costing its launch boundary and a few memory
// round trips, not its bytes (docs/PERF.md). Inside one cluster the
// dependencies are DSMEM counters (~0.5 us) instead of kernel boundaries,
// and the weights, which depend on nothing, stream without a pause: one
// producer warp per CTA copies the CTA's share of every weight matrix of
// every layer, in the order the layers use them, into a ring of
// shared-memory slots (bulk copies completing on mbarriers), running ahead
// of the arithmetic as far as the ring allows, across the stage barriers.
//
// Per layer, the consumer warps of each CTA run five stages, each ended by
// a cluster barrier (dl_bar):
//   1. x -> rms_norm -> int8 blocks (every CTA, redundantly, into shared
//      memory); its share of the q/k/v rows (raw q/k/v to scratch).
//   2. Attention unit (kv head g, split s): rope of the G query heads of g
//      and of the new key; the CTA whose key range holds the position
//      writes the new K/V cell; keys in 32-key tiles over its range, one
//      warp per tile (lane per key for q.k, lane per dimension for p.V),
//      warps merged in order; the unit's partial (m, l, acc) to scratch.
//   3. The partials merged per head (every CTA, redundantly) -> int8
//      blocks; its share of the o rows, added to x.
//   4. x -> rms_norm -> int8; its share of the gate and up rows (a gate
//      chunk then the up chunk of the same rows): silu(gate) * up to act.
//   5. act -> int8; its share of the down rows, added to x.
// A CTA's share of a matrix is a contiguous run of rows (whole groups of
// `g` rows, so every copy starts 16-byte aligned), cut into chunks of at
// most one slot. Producer and consumers walk the same chunk sequence
// (dl_next). The matvec arithmetic is mv_q8_r1's (int8 activations per
// 32-block, one warp per row, lane l units l, l + 32, ..., __dp4a, xor
// tree); norm, rope and attention are this file's own (run-to-run
// deterministic: fixed orders, no atomics on values).

#define DL_NW 16          // consumer warps per CTA
#define DL_SLOT 16384     // bytes per ring slot
#define DL_MAX_SLOTS 16
#define DL_MAX_LAYERS 96  // launch/decode_layers.rs: DL_MAX_LAYERS
// Timing experiments only (wrong results): DL_SKIP = bit mask of parts
// skipped: 1 attention, 2 matvec dots, 4 prologues, 8 cluster barriers,
// 16 the weight copies and their waits.
#ifndef DL_SKIP
#define DL_SKIP 0
#endif

// One layer's device pointers (launch/decode_layers.rs writes them).
struct DlLayer {
    const u8* w[7];  // wq, wk, wv, wo, w_gate, w_up, w_down: (rows, k) stored type
    const float* attn_norm;  // (dim,)
    const float* ffn_norm;   // (dim,)
    u16* kc;                 // (n_cells, n_kv, hd) f16
    u16* vc;
};

struct DlShape {
    int n_layers, dim, n_heads, n_kv, hd, ffn, rope_dim, neox, block_size, n_slots, csize;
    int g_qkv, g_o, g_gu, g_down;  // row granularity per matrix kind (16-byte aligned copies)
    float eps, scale;
    long long n_cells;
    int work_bytes;  // shared bytes of the activation / attention work area
};

// The launch's parameter block (by value, read in place: __grid_constant__).
struct DlParams {
    DlShape shape;
    DlLayer layers[DL_MAX_LAYERS];
};

// Scratch (global, f32): q (qd) | k (kvd) | v (kvd) | act (ffn) | parts.
// parts: (n_heads, S, hd + 2) {m (log2 units), l, acc[hd]}.

// The row range [r0, r1) of a CTA's share: groups of g rows split evenly.
__device__ __forceinline__ void dl_share(int rows, int g, int rank, int cs, int* r0, int* r1) {
    int ng = rows / g;
    *r0 = (int)((long long)ng * rank / cs) * g;
    *r1 = (int)((long long)ng * (rank + 1) / cs) * g;
}

// Bytes of one stored row of k values of a 32-value block type TY.
template <int TY>
__device__ __forceinline__ int dl_row_bytes(int k) {
    return (k / 32) * gr_type_size(TY);
}

// One chunk: rows [row0, row0 + rows) of matrix `mat` (0..6: wq, wk, wv,
// wo, w_gate, w_up, w_down) of layer `layer`, rows of rb bytes, read by
// weight stage `stage` (0 q/k/v, 1 o, 2 gate/up, 3 down).
struct DlChunk {
    const u8* src;
    int rows, rb, row0, mat, stage, layer;
};

// Where the walk over every chunk of the step stands: layer, segment
// (0-2 the q/k/v matrices, 3 o, 4 gate/up, 5 down), next row (-1: the
// segment's first), and in segment 4 whether the up chunk of the current
// rows is next.
struct DlCur {
    int li, seg, r, up;
};

// Segment `seg` of this CTA: matrix, row range, row bytes, row group, stage.
template <int TY>
__device__ __forceinline__ void dl_segment(const DlShape& S, int rank, int seg, int* mat, int* r0,
                                           int* r1, int* rb, int* g, int* st) {
    const int qd = S.n_heads * S.hd, kvd = S.n_kv * S.hd;
    if (seg < 3) {
        // q/k/v: the concatenated rows (qd + 2 kvd) split as one matrix.
        int a, b;
        dl_share(qd + 2 * kvd, S.g_qkv, rank, S.csize, &a, &b);
        int base = seg == 0 ? 0 : (seg == 1 ? qd : qd + kvd);
        int end = seg == 0 ? qd : base + kvd;
        *r0 = max(a, base) - base;
        *r1 = max(min(b, end) - base, *r0);
        *mat = seg;
        *rb = dl_row_bytes<TY>(S.dim);
        *g = S.g_qkv;
        *st = 0;
    } else if (seg == 3) {
        dl_share(S.dim, S.g_o, rank, S.csize, r0, r1);
        *mat = 3;
        *rb = dl_row_bytes<TY>(qd);
        *g = S.g_o;
        *st = 1;
    } else if (seg == 4) {
        dl_share(S.ffn, S.g_gu, rank, S.csize, r0, r1);
        *mat = 4;
        *rb = dl_row_bytes<TY>(S.dim);
        *g = S.g_gu;
        *st = 2;
    } else {
        dl_share(S.dim, S.g_down, rank, S.csize, r0, r1);
        *mat = 6;
        *rb = dl_row_bytes<TY>(S.ffn);
        *g = S.g_down;
        *st = 3;
    }
}

// The next chunk of the walk (false past the last): every layer's
// segments in order, each cut into chunks of at most one slot of whole row
// groups; in segment 4 a gate chunk, then the up chunk of the same rows.
// The producer and the consumers of a CTA walk the same sequence.
template <int TY>
__device__ __noinline__ bool dl_next(const DlLayer* layers, const DlShape& S, int rank, DlCur* k,
                                     DlChunk* c) {
    for (;;) {
        if (k->li >= S.n_layers) return false;
        int mat, r0, r1, rb, g, st;
        dl_segment<TY>(S, rank, k->seg, &mat, &r0, &r1, &rb, &g, &st);
        if (k->r < r0) k->r = r0;
        if (k->r >= r1) {
            k->r = -1;
            k->up = 0;
            if (++k->seg == 6) {
                k->seg = 0;
                k->li++;
            }
            continue;
        }
        int per = (DL_SLOT / (rb * g)) * g;
        int n = min(per, r1 - k->r);
        c->mat = k->seg == 4 && k->up ? 5 : mat;
        c->src = layers[k->li].w[c->mat] + (long long)k->r * rb;
        c->rows = n;
        c->rb = rb;
        c->row0 = k->r;
        c->stage = st;
        c->layer = k->li;
        if (k->seg == 4 && !k->up) {
            k->up = 1;
        } else {
            k->up = 0;
            k->r += n;
        }
        return true;
    }
}

// A wait that has spun for DL_SPIN_CYCLES (about 2 s) is a bug (a
// deadlock between the producer, the consumers and the other CTAs): the
// kernel traps, so the step fails with a launch error instead of hanging
// the device.
#ifndef DL_SPIN_CYCLES
#define DL_SPIN_CYCLES 4000000000LL
#endif
__device__ __forceinline__ void dl_spin_check(long long t0, int what, int n) {
    if (clock64() - t0 > DL_SPIN_CYCLES) {
        int rank;
        cl_shape(&rank);
        printf("decode_layers: stuck in wait %d (rank %d, thread %d, count %d)\n", what, rank,
               (int)threadIdx.x, n);
        __trap();
    }
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// mbar_wait with the spin guard.
__device__ __forceinline__ void dl_wait(u64* bar, u32 par, int what, int n) {
    long long t0 = clock64();
    while (!mbar_try(bar, par)) dl_spin_check(t0, what, n);
}
#endif

// Named barrier of the consumer warps only.
__device__ __forceinline__ void dl_sync() {
    asm volatile("bar.sync 1, %0;" ::"r"(DL_NW * 32) : "memory");
}

// The cluster barrier of the consumer warps: every CTA adds 1 to every
// CTA's counter (release, cluster scope; after the consumers' named
// barrier, so it is cumulative over their writes), then waits until its
// own counter reaches `target` (acquire). Counters only grow, so no phase
// can be confused with the next. The producer warp never takes part.
__device__ __forceinline__ void dl_bar(u32* ctr, int cs, u32 target) {
    dl_sync();
    if (DL_SKIP & 8) return;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (threadIdx.x < (unsigned)cs) {
        u32 a = cl_peer(ctr, (int)threadIdx.x);
        asm volatile("red.release.cluster.shared::cluster.add.u32 [%0], 1;" ::"r"(a) : "memory");
    }
    u32 la = (u32)__cvta_generic_to_shared(ctr), v;
    long long t0 = clock64();
    for (;;) {
        asm volatile("ld.relaxed.cluster.shared::cta.u32 %0, [%1];" : "=r"(v) : "r"(la) : "memory");
        if (v >= target) break;
        dl_spin_check(t0, 0, (int)v);
    }
    // Acquire once the count is seen (pairs with the releases above).
    asm volatile("fence.acq_rel.cluster;" ::: "memory");
#endif
}

// Values val(0..len) -> int8 blocks (q8_block) in xq / xds: warp w takes
// 32-blocks w, w + NW, ...; ends with the consumers' barrier.
template <class F>
__device__ __forceinline__ void dl_q8_by(int len, signed char* xq, float2* xds, F val) {
    int l = threadIdx.x & 31, wp = threadIdx.x >> 5;
    for (int b = wp; b < len / 32; b += DL_NW) {
        float v = val(32 * b + l);
        q8_block<1>(&v, l, xq + 32 * b, xds + b);
    }
    dl_sync();
}

// rms_norm(x) * w -> int8 blocks (q8_block) in xq / xds; x read from L2
// (other CTAs wrote it). Warp w takes 32-blocks w, w + NW, ...
__device__ __forceinline__ void dl_norm_q8(const float* x, const float* __restrict__ nw, int dim,
                                           float eps, signed char* xq, float2* xds, float* red) {
    int t = threadIdx.x, l = t & 31, wp = t >> 5;
    float ss = 0.0f;
    for (int i = t; i < dim; i += DL_NW * 32) {
        float v = __ldcg(x + i);
        ss = fmaf(v, v, ss);
    }
#pragma unroll
    for (int s = 16; s >= 1; s >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, s);
    if (l == 0) red[wp] = ss;
    dl_sync();
    float tot = 0.0f;
#pragma unroll
    for (int i = 0; i < DL_NW; i++) tot += red[i];
    float rs = rsqrtf(tot / (float)dim + eps);
    dl_q8_by(dim, xq, xds, [&](int i) { return __ldcg(x + i) * rs * nw[i]; });
}

// Plain vector -> int8 blocks (act of the FFN).
__device__ __forceinline__ void dl_q8(const float* a, int len, signed char* xq, float2* xds) {
    dl_q8_by(len, xq, xds, [&](int i) { return __ldcg(a + i); });
}

// One weight row (in shared memory) dotted with the int8 activations:
// mv_q8_r1's per-lane order and xor tree; the sum in every lane.
template <int TY>
__device__ __forceinline__ float dl_row_dot(const u8* row, int k, const signed char* xq,
                                            const float2* xds) {
    int l = threadIdx.x & 31, units = k / 32;
    float acc = 0.0f;
    for (int u = l; u < units; u += 32) {
        int w[8];
        float a0, a1, b;
        decode_unit_q8<TY>(row, u, w, a0, a1, b);
        int i0, i1;
        unit_idot(w, xq + 32 * u, &i0, &i1);
        float2 ds = xds[u];
        float t = fmaf(a0, (float)i0, a1 * (float)i1);
        acc = fmaf(ds.x, t, fmaf(b, ds.y, acc));
    }
#pragma unroll
    for (int s = 16; s >= 1; s >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, s, 32);
    return acc;
}

// The attention unit (kv head g, split s of S) of one layer; see the top.
// q, k, v: raw projections (scratch); qs: (G, hd) shared; wpart: shared
// (DL_NW, G, hd + 2); parts: global (n_heads, S, hd + 2).
template <int HD>
__device__ __noinline__ void dl_attention(const DlShape& P, const DlLayer& L, int g, int s, int S,
                             const float* q, const float* k, const float* v,
                             const u32* __restrict__ table, u32 pos, u32 slot,
                             const float* __restrict__ inv_freq, float* qs, float* kn,
                             float* wpart, float* parts) {
    const int G = P.n_heads / P.n_kv, half = P.rope_dim / 2;
    const int t = threadIdx.x, l = t & 31, wp = t >> 5;
    const int n_keys = (int)pos + 1;
    int per = (n_keys + S - 1) / S;
    per = (per + 31) & ~31;
    const int k0 = s * per, k1 = min(n_keys, k0 + per);
    const bool own = k0 <= (int)pos && (int)pos < k1;
    // Rope of the G query heads (and, where this unit writes the new K/V
    // cell, of the new key, in kn) with rope_kv_write's arithmetic; values
    // past rope_dim copied.
    for (int i = t; i < (own ? G + 1 : G) * HD; i += DL_NW * 32) {
        int h = i / HD, e = i % HD;
        const float* src = h < G ? q + (long long)(g * G + h) * HD : k + (long long)g * HD;
        float* dst = h < G ? qs + h * HD : kn;
        if (e >= P.rope_dim) {
            dst[e] = __ldcg(src + e);
            continue;
        }
        int pi = P.neox ? (e % half) : (e / 2);
        int a = P.neox ? pi : 2 * pi, b = P.neox ? pi + half : 2 * pi + 1;
        float sn, cs;
        q_sin_cos(q_mul(__uint2float_rn(pos), inv_freq[pi]), &sn, &cs);
        float x0 = __ldcg(src + a), x1 = __ldcg(src + b);
        dst[e] = e == a ? q_sub(q_mul(x0, cs), q_mul(x1, sn)) : q_add(q_mul(x0, sn), q_mul(x1, cs));
    }
    dl_sync();
    const long long cell_len = (long long)P.n_kv * HD;
    if (own && (long long)slot < P.n_cells) {
        for (int e = t; e < HD; e += DL_NW * 32) {
            L.kc[(long long)slot * cell_len + (long long)g * HD + e] = kv_f16(kn[e]);
            L.vc[(long long)slot * cell_len + (long long)g * HD + e] =
                kv_f16(__ldcg(v + (long long)g * HD + e));
        }
    }
    dl_sync();
    constexpr int DPL = HD / 32;  // dimensions per lane in the p.V pass
    const float sc = P.scale * 1.4426950408889634f;
    float m[8], lsum[8], acc[8][DPL];
#pragma unroll
    for (int h = 0; h < 8; h++) {
        m[h] = Q_NINF;
        lsum[h] = 0.0f;
#pragma unroll
        for (int d = 0; d < DPL; d++) acc[h][d] = 0.0f;
    }
    for (int j0 = k0 + 32 * wp; j0 < k1; j0 += 32 * DL_NW) {
        int j = j0 + l;
        bool live = j < k1;
        long long cell = 0;
        if (live) cell = (long long)table[j / P.block_size] * P.block_size + j % P.block_size;
        const u16* kr = L.kc + cell * cell_len + (long long)g * HD;
        float sco[8];
#pragma unroll
        for (int h = 0; h < 8; h++) sco[h] = 0.0f;
        if (live) {
#pragma unroll
            for (int c = 0; c < HD / 8; c++) {
                uint4 raw = *(const uint4*)(kr + 8 * c);
                u32 wds[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    float2 kv2 = q_f16x2(wds[i]);
#pragma unroll
                    for (int h = 0; h < 8; h++) {
                        if (h >= G) break;
                        const float* qh = qs + h * HD + 8 * c + 2 * i;
                        sco[h] = fmaf(qh[0], kv2.x, fmaf(qh[1], kv2.y, sco[h]));
                    }
                }
            }
        }
        float p[8];
#pragma unroll
        for (int h = 0; h < 8; h++) {
            if (h >= G) break;
            float sv = live ? sco[h] * sc : Q_NINF;
            float mx = sv;
#pragma unroll
            for (int st = 16; st >= 1; st >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, st));
            float mn = fmaxf(m[h], mx);
            float corr = exp2f(m[h] - mn);  // m = -inf first: 0
            p[h] = live ? exp2f(sv - mn) : 0.0f;
            float ps = p[h];
#pragma unroll
            for (int st = 16; st >= 1; st >>= 1) ps += __shfl_xor_sync(0xffffffffu, ps, st);
            lsum[h] = lsum[h] * corr + ps;
            m[h] = mn;
#pragma unroll
            for (int d = 0; d < DPL; d++) acc[h][d] *= corr;
        }
        // p.V in groups of 8 keys: the 8 V loads are independent and in
        // flight together (one dependent round trip per group, not per key).
        int nk = min(32, k1 - j0);
        u32 cell32 = (u32)cell;
        for (int k8 = 0; k8 < nk; k8 += 8) {
            u32 raw[8][DPL / 2];
#pragma unroll
            for (int i = 0; i < 8; i++) {
                u32 ck = __shfl_sync(0xffffffffu, cell32, k8 + i);
                const u16* vr = L.vc + (long long)ck * cell_len + (long long)g * HD + DPL * l;
                bool in = k8 + i < nk;
                if (DPL == 2) {
                    raw[i][0] = in ? *(const u32*)vr : 0u;
                } else {
                    uint2 w2 = in ? *(const uint2*)vr : make_uint2(0u, 0u);
                    raw[i][0] = w2.x;
                    raw[i][DPL / 2 - 1] = w2.y;
                }
            }
#pragma unroll
            for (int i = 0; i < 8; i++) {
                float vv[DPL];
#pragma unroll
                for (int d = 0; d < DPL; d += 2) {
                    float2 f = q_f16x2(raw[i][d / 2]);
                    vv[d] = f.x;
                    vv[d + 1] = f.y;
                }
#pragma unroll
                for (int h = 0; h < 8; h++) {
                    if (h >= G) break;
                    // p is 0 past nk (dead lanes), and the loads gave 0.
                    float ph = __shfl_sync(0xffffffffu, p[h], (k8 + i) & 31);
#pragma unroll
                    for (int d = 0; d < DPL; d++) acc[h][d] = fmaf(ph, vv[d], acc[h][d]);
                }
            }
        }
    }
    // The warps' partials to shared memory, then merged in warp order.
    const int PW = HD + 2;
#pragma unroll
    for (int h = 0; h < 8; h++) {
        if (h >= G) break;
        float* wpp = wpart + ((long long)wp * G + h) * PW;
        if (l == 0) {
            wpp[0] = m[h];
            wpp[1] = lsum[h];
        }
#pragma unroll
        for (int d = 0; d < DPL; d++) wpp[2 + DPL * l + d] = acc[h][d];
    }
    dl_sync();
    for (int i = t; i < G * PW; i += DL_NW * 32) {
        int h = i / PW, e = i % PW;
        float M = Q_NINF;
        for (int w2 = 0; w2 < DL_NW; w2++) M = fmaxf(M, wpart[((long long)w2 * G + h) * PW]);
        float val;
        if (e == 0) {
            val = M;
        } else if (M == Q_NINF) {
            val = 0.0f;
        } else {
            val = 0.0f;
            for (int w2 = 0; w2 < DL_NW; w2++) {
                const float* wpp = wpart + ((long long)w2 * G + h) * PW;
                val = fmaf(exp2f(wpp[0] - M), wpp[e], val);
            }
        }
        parts[((long long)(g * G + h) * S + s) * PW + e] = val;
    }
}

// The merged attention output of every head -> int8 blocks (stage 3's
// prologue). Warp w takes 32-blocks w, w + NW, ... of (n_heads * hd).
template <int HD>
__device__ __forceinline__ void dl_merge_q8(const float* parts, int n_heads, int S,
                                            signed char* xq, float2* xds) {
    const int l = threadIdx.x & 31, wp = threadIdx.x >> 5, PW = HD + 2;
    for (int b = wp; b < n_heads * HD / 32; b += DL_NW) {
        int h = (32 * b) / HD, e = (32 * b) % HD + l;
        const float* ph = parts + (long long)h * S * PW;
        // Every partial's loads issued before any is used (S <= 16).
        float ms[16], ls[16], as[16];
#pragma unroll
        for (int s = 0; s < 16; s++) {
            if (s < S) {
                ms[s] = __ldcg(ph + (long long)s * PW);
                ls[s] = __ldcg(ph + (long long)s * PW + 1);
                as[s] = __ldcg(ph + (long long)s * PW + 2 + e);
            }
        }
        float M = Q_NINF;
#pragma unroll
        for (int s = 0; s < 16; s++)
            if (s < S) M = fmaxf(M, ms[s]);
        float num = 0.0f, den = 0.0f;
#pragma unroll
        for (int s = 0; s < 16; s++) {
            if (s < S && ms[s] != Q_NINF) {
                float wgt = exp2f(ms[s] - M);
                den = fmaf(wgt, ls[s], den);
                num = fmaf(wgt, as[s], num);
            }
        }
        float val = num / den;
        q8_block<1>(&val, l, xq + 32 * b, xds + b);
    }
    dl_sync();
}

// What the consumer warps' stage transitions read and write.
struct DlCtx {
    const DlLayer* layers;
    const DlShape* P;
    float *x, *q, *k, *v, *act, *parts;
    signed char* xq;
    float2* xds;
    float *qs, *kn, *wpart, *red;
    u32* ctr;
    const u32* table;
    const float* inv_freq;
    u32 pos, slot, nbar;
    int rank, cs, S;
};

// The consumers' next cluster barrier (the nbar-th: every CTA's counter
// reaches nbar x cs).
__device__ __forceinline__ void dl_next_bar(DlCtx& c) {
    c.nbar++;
    dl_bar(c.ctr, c.cs, c.nbar * c.cs);
}

// The consumers' step into weight stage `st` of layer `li`: the cluster
// barrier that ends the stage before (none before stage 0: the layer's
// end barrier), then the prologue the stage's matvecs need (and before
// stage 1 the whole attention, between its two barriers).
template <int HD>
__device__ __noinline__ void dl_enter(DlCtx& c, int li, int st) {
    const DlShape& P = *c.P;
    if (st > 0) {
        dl_next_bar(c);
    }
    if (DL_SKIP & 4) {
        if (st == 1) dl_next_bar(c);
    } else if (st == 0) {
        dl_norm_q8(c.x, c.layers[li].attn_norm, P.dim, P.eps, c.xq, c.xds, c.red);
    } else if (st == 1) {
        if (!(DL_SKIP & 1)) {
            for (int u = c.rank; u < P.n_kv * c.S; u += c.cs)
                dl_attention<HD>(P, c.layers[li], u / c.S, u % c.S, c.S, c.q, c.k, c.v, c.table,
                                 c.pos, c.slot, c.inv_freq, c.qs, c.kn, c.wpart, c.parts);
        }
        dl_next_bar(c);
        dl_merge_q8<HD>(c.parts, P.n_heads, c.S, c.xq, c.xds);
    } else if (st == 2) {
        dl_norm_q8(c.x, c.layers[li].ffn_norm, P.dim, P.eps, c.xq, c.xds, c.red);
    } else {
        dl_q8(c.act, P.ffn, c.xq, c.xds);
    }
}

// Moves the consumers from (layer, stage) to (li, st), running every
// transition between (a layer's end is a barrier: x is complete).
template <int HD>
__device__ __forceinline__ void dl_advance(DlCtx& c, int* layer, int* stage, int li, int st) {
    while (*layer < li || *stage < st) {
        if (*stage == 3) {
            if (*layer >= 0) {
                dl_next_bar(c);
            }
            ++*layer;
            *stage = 0;
        } else {
            ++*stage;
        }
        dl_enter<HD>(c, *layer, *stage);
    }
}

template <int TY, int HD>
__device__ void decode_layers_body(const DlLayer* __restrict__ layers, const DlShape& P, float* x,
                                   float* scratch, const u32* __restrict__ tables,
                                   const u32* __restrict__ table_off,
                                   const u32* __restrict__ row_seq,
                                   const u32* __restrict__ positions,
                                   const u32* __restrict__ slots,
                                   const float* __restrict__ inv_freq) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    extern __shared__ __align__(128) u8 dl_smem[];
    // Layout: full[slots], empty[slots] mbarriers, the barrier counter,
    // the reduction words, the gate rows of a chunk, the work area, the
    // ring (+16 bytes: ld_words may read 2 bytes past a block).
    u64* full = (u64*)dl_smem;
    u64* empty = full + DL_MAX_SLOTS;
    u32* ctr = (u32*)(empty + DL_MAX_SLOTS);
    float* red = (float*)(dl_smem + 2 * DL_MAX_SLOTS * 8 + 16);  // DL_NW floats
    float* gbuf = red + 32;                                      // gate rows of a chunk
    u8* work = (u8*)(gbuf + 512);
    u8* ring = work + P.work_bytes;
    int rank;
    const int cs = cl_shape(&rank);
    const int t = threadIdx.x, wp = t >> 5, l = t & 31;
    if (t == 0) {
        for (int i = 0; i < P.n_slots; i++) {
            mbar_init(&full[i], 1);
            mbar_init(&empty[i], DL_NW);
        }
        *ctr = 0;
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    GRID_DEP();
    // Every CTA's counter is zero before any CTA adds to it.
    att_cluster_sync();

    DlCur cur = {0, 0, -1, 0};
    DlChunk ch;
    int n = 0;  // chunks copied / consumed
    if (wp == DL_NW) {
        // The producer: lane 0 copies every chunk into the ring in order.
        if (l == 0) {
            while (dl_next<TY>(layers, P, rank, &cur, &ch)) {
                int sl = n % P.n_slots;
                u32 round = (u32)(n / P.n_slots);
                if (round > 0) dl_wait(&empty[sl], (round - 1) & 1, 1, n);
                u32 bytes = (u32)(ch.rows * ch.rb);
                if (!(DL_SKIP & 16)) {
                    mbar_expect(&full[sl], bytes);
                    bulk_g2s(ring + (long long)sl * DL_SLOT, ch.src, bytes, &full[sl]);
                }
                n++;
            }
        }
        __syncwarp();
    } else {
        const int qd = P.n_heads * P.hd, kvd = P.n_kv * P.hd;
        DlCtx c;
        c.layers = layers;
        c.P = &P;
        c.x = x;
        c.q = scratch;
        c.k = c.q + qd;
        c.v = c.k + kvd;
        c.act = c.v + kvd;
        c.parts = c.act + P.ffn;
        c.xq = (signed char*)work;
        int kmax = max(max(P.dim, qd), P.ffn);
        c.xds = (float2*)(work + ((kmax + 15) & ~15));
        const int G = P.n_heads / P.n_kv;
        c.qs = (float*)work;       // (G, hd), attention only
        c.kn = c.qs + G * HD;      // (hd,)
        c.wpart = c.kn + HD;       // (DL_NW, G, hd + 2)
        c.red = red;
        c.ctr = ctr;
        c.table = tables + table_off[row_seq[0]];
        c.inv_freq = inv_freq;
        c.pos = positions[0];
        c.slot = slots[0];
        c.nbar = 0;
        c.rank = rank;
        c.cs = cs;
        c.S = max(1, cs / P.n_kv);
        int layer = -1, stage = 3;
        while (dl_next<TY>(layers, P, rank, &cur, &ch)) {
            dl_advance<HD>(c, &layer, &stage, ch.layer, ch.stage);
            int sl = n % P.n_slots;
            if (!(DL_SKIP & 16)) dl_wait(&full[sl], (u32)(n / P.n_slots) & 1, 2, n);
            const u8* base = ring + (long long)sl * DL_SLOT;
            int k = ch.stage == 1 ? qd : (ch.stage == 3 ? P.ffn : P.dim);
            const bool resid = ch.mat == 3 || ch.mat == 6;
            for (int r = wp; r < ((DL_SKIP & 2) ? 0 : ch.rows); r += DL_NW) {
                int row = ch.row0 + r;
                // The residual's load overlaps the dot.
                float xr = resid && l == 0 ? __ldcg(x + row) : 0.0f;
                float y = dl_row_dot<TY>(base + (long long)r * ch.rb, k, c.xq, c.xds);
                if (l == 0) {
                    if (ch.mat < 3) {
                        float* o = ch.mat == 0 ? c.q : (ch.mat == 1 ? c.k : c.v);
                        o[row] = y;
                    } else if (resid) {
                        x[row] = xr + y;
                    } else if (ch.mat == 4) {
                        gbuf[r] = y;
                    } else {
                        c.act[row] = q_mul(q_silu(gbuf[r]), y);
                    }
                }
            }
            // Row r of an up chunk is row r of the gate chunk before it:
            // the same thread wrote gbuf[r], so no barrier is needed.
            __syncwarp();
            if (l == 0) mbar_arrive(&empty[sl]);
            n++;
        }
        // Stages and layers this CTA had no rows of still take their
        // barriers; then the last layer's end.
        dl_advance<HD>(c, &layer, &stage, P.n_layers - 1, 3);
        dl_next_bar(c);
    }
    // No CTA leaves while another may still add to its counter.
    att_cluster_sync();
#else
    __trap();
#endif
}

#define DL_ENTRY(NAME, TY, HD)                                                                  \
    extern "C" __global__ void __launch_bounds__((DL_NW + 1) * 32, 1)                            \
        NAME(const __grid_constant__ DlParams p, float* x, float* scratch,                      \
             const u32* __restrict__ tables, const u32* __restrict__ table_off,                 \
             const u32* __restrict__ row_seq, const u32* __restrict__ positions,                \
             const u32* __restrict__ slots, const float* __restrict__ inv_freq) {               \
        decode_layers_body<TY, HD>(p.layers, p.shape, x, scratch, tables, table_off, row_seq,   \
                                   positions, slots, inv_freq);                                 \
    }

// Only the form checked on a device (check-exact --mode fast-layers,
// docs/PERF.md): the body is written for any 32-value block type and
// head_dim 64 or 128; add an entry (and launch/decode_layers.rs's
// `entry`) once its form has been checked.
DL_ENTRY(decode_layers_q4_0_h64, TY_Q4_0, 64)
