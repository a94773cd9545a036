// Batch-1 decode attention on tensor cores, one CTA per (row, KV head)
// folding the whole row, or a cluster of them (CL below) (`fast` mode only;
// ops/attention/rmma.rs, rmma_rule and rmma_cluster_rule).
//
// Why: at batch 1 the split forms (attention_pipe_fast.cu) are bound by the
// latency of their tile arithmetic (ATT_STAMP, H200, 2026-11-28: about
// 2,200 cycles per 16-key tile of dependent shared-memory loads, FMA chains
// and shuffles), so a row of 512 keys needs five CTAs and then a merge of
// their partials (a cluster barrier or a second launch: 2,000-4,000 cycles
// more). Here a KV head's query heads are the M rows of m16n8k16 f16 MMAs
// (rows past the group are padding: zero queries, never stored; rows 8-15
// are zeros), so a 16-key tile is a handful of ldmatrix + MMA steps (S =
// Q·Kᵀ, the online softmax on the accumulator fragments in base 2, O +=
// P·V with P reused in registers as the A operand), and one SM folds the
// whole row; the W warps' states are merged in warp order in shared memory
// and the CTA writes the output and its int8 copy itself: no partials, no
// combine, no cluster barrier.
//
// Warp w folds the row's 16-key tiles w, w + W, w + 2W, ... (tile i: keys
// 16 i .. 16 i + 15), each copied by cp.async into one of its own ST
// stages while it computes an earlier one. With `early` (the host's word
// that the row is its sequence's only row), those of a warp's first ST
// tiles whose keys all precede the row's own position go out before the
// programmatic wait (the KV write just before writes only that slot). K
// and V rows are stored with 16-byte chunk c of row kk at slot c ^ (kk &
// 7) of its group of 8 (rm_at), so the eight rows one ldmatrix phase reads
// hit eight bank groups without padding. Keys past the row's position are
// copied as zeros (so P·V never meets stale bits) and masked to -inf.
//
// Bits: a head's result depends on its row's keys, head_dim, W, the f16
// rounding of q·scale·log2(e), K, V and P, and the MUFU's ex2; not on the
// grid, the batch or the block layout. Other bits than the split forms
// (`fast` allows a function of the launch shape).
//
// CL (the att_rmma_c_* entries, sm_90+): a thread-block cluster of C =
// gridDim.y (2..=ATT_RMMA_CL_MAX) CTAs per unit, for rows whose K and V one
// SM would read too slowly (it reads at about its L2 port's rate): warp w
// of CTA y is warp y W + w of C W, taking the row's tiles in the same
// round-robin; each CTA merges its warps as above and stores (m, l, o) of
// every head into rank 0's shared memory (DSMEM), the cluster barrier's
// release / acquire makes them visible, and rank 0's warps merge the C
// states in rank order and write the output. Other bits than C = 1 (a
// function of the launch shape, as `fast` allows).
//
// ATT_RMMA_WARPS / ATT_RMMA_STAGES (head_dim 64) and _D4 (head_dim 128),
// ATT_RMMA_CL_MAX: the host prelude's (ops/attention/geometry.rs,
// att_rmma_shape).

// Byte offset of 16-byte chunk c of row kk in a (16, HD) f16 tile.
template <int HD>
__device__ __forceinline__ int rm_at(int kk, int c) {
    return kk * (HD * 2) + 16 * (c ^ (kk & 7));
}

// 2^x by the MUFU's approximation (2 ulp; +0 for -inf): the tile loop is
// bound by its instruction issue at batch 1 (16 warps on an SM), and the
// accurate exp2f is several instructions more per value.
__device__ __forceinline__ float rm_ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// Bytes of the dynamic shared memory of one entry: (W, ST, 2, 16, HD) f16
// stages; the merge state (per warp: m, l (16 each), o (GM, HD) f32)
// aliases each warp's own stages after its last tile. The cluster entries
// add rank 0's slots for the CTAs' states: (GM, ATT_RMMA_CL_MAX) of 2 + HD
// f32 (m, l, o).
#define ATT_RMMA_BYTES(D32, W, ST) ((W) * (ST) * 2 * 16 * 32 * (D32) * 2)
#define ATT_RMMA_CL_BYTES(D32, GM) ((GM) * ATT_RMMA_CL_MAX * (2 + 32 * (D32)) * 4)

template <int D32, int GM, int W, int ST, bool CL>
__device__ __forceinline__ void att_rmma(
    const float* __restrict__ q, int n_heads, int n_kv_heads, int hd, int block_size,
    float scale, const u16* __restrict__ kc, const u16* __restrict__ vc,
    const u32* __restrict__ tables, const u32* __restrict__ table_off,
    const u32* __restrict__ row_seq, const u32* __restrict__ positions, int early,
    float* __restrict__ out, signed char* __restrict__ xq, float2* __restrict__ xds) {
    constexpr int HD = 32 * D32;  // head_dim exactly (the host's rule)
    constexpr int TB = 16 * HD * 2;  // bytes of one K (or V) tile
    constexpr int CPR = HD / 8;      // 16-byte chunks per row
    constexpr int NKC = HD / 16;     // k16 steps of S
    static_assert(GM <= 8, "query heads per KV head: rows g < 8 of the MMA");
    static_assert(2 * 16 + GM * HD <= ST * 2 * TB / 4, "a warp's merge state fits its stages");
    extern __shared__ __align__(128) unsigned char att_smem[];
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    int mq = lane >> 3, mr = lane & 7;  // ldmatrix: lanes 8m .. 8m + 7 address matrix m
    int group = n_heads / n_kv_heads;
    int r = blockIdx.x / n_kv_heads, kvh = blockIdx.x % n_kv_heads;
    int h0 = kvh * group;
    // The cluster's CTAs (CL): y's warps are warps y W .. of C W. Every
    // CTA arrives now (relaxed) and waits before its first remote store,
    // so no store reaches a CTA that has not started.
    const int C = CL ? (int)gridDim.y : 1, y = CL ? (int)blockIdx.y : 0;
    const int gw = y * W + w, GW = C * W;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (CL) asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
#endif
    // Read before the wait: what no kernel of the step writes (positions,
    // row_seq and the block tables, copied before the step's first kernel).
    int pos = (int)positions[r];
    const u32* table = tables + table_off[row_seq[r]];
    int n_row = pos / 16 + 1;                               // the row's tiles
    int nt = n_row > gw ? (n_row - gw + GW - 1) / GW : 0;   // this warp's
    unsigned char* wst = att_smem + (size_t)w * ST * 2 * TB;
    // Pages of a power-of-two size (the usual 16) by a shift, not a
    // division per key.
    int bs_shift = (block_size & (block_size - 1)) == 0 ? __ffs(block_size) - 1 : -1;
    // Lane kk < 16's key of tile tt of this warp: its K/V offset (0 past
    // pos or the warp's last tile). The block table is read a tile ahead of
    // the copies that use it (off_next below), so its latency hides behind a
    // tile's compute instead of preceding every copy.
    auto tile_off = [&](int tt) {
        int j = (gw + GW * tt) * 16 + (lane & 15);
        long long off = 0;
        if (tt < nt && j <= pos) {
            int bi = bs_shift >= 0 ? j >> bs_shift : j / block_size;
            long long cell = (long long)table[bi] * block_size + (j - bi * block_size);
            off = (cell * n_kv_heads + kvh) * HD;
        }
        return off;
    };
    // Tile tt (lane kk's key at off) into stage tt % ST: one commit group
    // (empty past the warp's last tile); keys past pos as zeros.
    // The shuffles stay outside the (warp-uniform) tile test, so the
    // compiler emits no divergent-shuffle path for them.
    auto issue = [&](int tt, long long off) {
        int k0 = (gw + GW * tt) * 16;
        unsigned char* ks = wst + (tt % ST) * 2 * TB;
        unsigned char* vs = ks + TB;
#pragma unroll
        for (int i = 0; i < 16 * CPR / 32; i++) {
            int idx = lane + 32 * i, kk = idx / CPR, c = idx % CPR;
            long long ro = __shfl_sync(0xffffffffu, off, kk);
            int n = k0 + kk <= pos ? 16 : 0;
            if (tt < nt) {
                cp_async16(ks + rm_at<HD>(kk, c), kc + ro + 8 * c, n);
                cp_async16(vs + rm_at<HD>(kk, c), vc + ro + 8 * c, n);
            }
        }
        cp_async_commit();
    };
    // The first ST tiles: every offset looked up at once, then the copies.
    // With `early`, the leading ones whose keys all precede pos go out
    // before the wait (tiles are in increasing key order, so they are a
    // prefix and the commit groups stay in tile order).
    long long off0[ST];
#pragma unroll
    for (int s = 0; s < ST; s++) off0[s] = tile_off(s);
    int npre = 0;
    if (early)
        while (npre < ST && npre < nt && (gw + GW * npre) * 16 + 15 < pos) npre++;
#pragma unroll
    for (int s = 0; s < ST; s++)
        if (s < npre) issue(s, off0[s]);
    GRID_DEP();
#pragma unroll
    for (int s = 0; s < ST; s++)
        if (s >= npre) issue(s, off0[s]);
    long long off_next = tile_off(ST);
    // Q fragments (A: rows g and g + 8 = query heads h0 + g, h0 + g + 8 of
    // the group; dims 16 kc + 2 t (+1) and + 8), scaled by scale * log2 e,
    // f16; rows past the group zero. Every load issued before any is used.
    const float qsc = scale * 1.4426950408889634f;
    u32 qa[NKC][4];
    {
        const float* qr = q + ((long long)r * n_heads + h0 + g) * HD;
        float2 lo[NKC], hi[NKC];
#pragma unroll
        for (int kc = 0; kc < NKC; kc++) {
            int d = 16 * kc + 2 * t;
            lo[kc] = g < group ? *(const float2*)(qr + d) : make_float2(0.0f, 0.0f);
            hi[kc] = g < group ? *(const float2*)(qr + d + 8) : make_float2(0.0f, 0.0f);
        }
#pragma unroll
        for (int kc = 0; kc < NKC; kc++) {
            qa[kc][0] = pack_f16x2(lo[kc].x * qsc, lo[kc].y * qsc);
            qa[kc][1] = 0u;  // row g + 8: past any group of at most 8
            qa[kc][2] = pack_f16x2(hi[kc].x * qsc, hi[kc].y * qsc);
            qa[kc][3] = 0u;
        }
    }
    // Online softmax state of row g (row g + 8 is empty): m in base 2, this
    // lane's share of l, and O's fragments (dims 8 dn + 2 t (+1)).
    float m = Q_NINF, ls = 0.0f, o[HD / 8][2];
#pragma unroll
    for (int dn = 0; dn < HD / 8; dn++) o[dn][0] = o[dn][1] = 0.0f;
    bool live = g < group;
    for (int tt = 0; tt < nt; tt++) {
        cp_async_wait_group<ST - 1>();  // tile tt's copies are done
        __syncwarp();
        const unsigned char* ks = wst + (tt % ST) * 2 * TB;
        const unsigned char* vs = ks + TB;
        int k0 = (gw + GW * tt) * 16;
        // S (16 rows x 16 keys) as two n-tiles of 8 keys; per 16 dims one
        // ldmatrix.x4 gives both tiles' B fragments (matrix m: keys 8 (m /
        // 2) .., dims 8 (m % 2) ..); each tile's sum runs over dims in order.
        float s[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
        for (int kc = 0; kc < NKC; kc++) {
            u32 b[4];
            ldsm_x4(b, ks + rm_at<HD>(8 * (mq >> 1) + mr, 2 * kc + (mq & 1)));
            mma_f16_16816(qa[kc], b[0], b[1], s[0]);
            mma_f16_16816(qa[kc], b[2], b[3], s[1]);
        }
        // Row g's keys k0 + 8 nt + 2 t (+1): masked past pos, which only
        // the row's last tile holds (a warp-uniform test). A padding row's
        // scores are zeros (its Q is), finite, and never stored.
        if (k0 + 15 > pos) {
#pragma unroll
            for (int n8 = 0; n8 < 2; n8++)
#pragma unroll
                for (int e = 0; e < 2; e++)
                    if (k0 + 8 * n8 + 2 * t + e > pos) s[n8][e] = Q_NINF;
        }
        float mx = fmaxf(fmaxf(m, fmaxf(s[0][0], s[0][1])), fmaxf(s[1][0], s[1][1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        float alpha = (m == Q_NINF) ? 0.0f : rm_ex2(m - mx);
        m = mx;
        float sum = 0.0f;
#pragma unroll
        for (int n8 = 0; n8 < 2; n8++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                float p = (s[n8][e] == Q_NINF) ? 0.0f : rm_ex2(s[n8][e] - m);
                s[n8][e] = p;
                sum += p;
            }
        ls = fmaf(ls, alpha, sum);
        // P as the A operand (rows g + 8 zero): keys 2 t (+1) and 8 + 2 t (+1).
        u32 pa[4] = {pack_f16x2(s[0][0], s[0][1]), 0u, pack_f16x2(s[1][0], s[1][1]), 0u};
        // V's B fragments, two 8-dim tiles per ldmatrix.x4.trans (matrix m:
        // keys 8 (m % 2) .., dims 8 (dn + m / 2) ..).
#pragma unroll
        for (int dn = 0; dn < HD / 8; dn += 2) {
            u32 b[4];
            ldsm_x4_trans(b, vs + rm_at<HD>(8 * (mq & 1) + mr, dn + (mq >> 1)));
            float c0[4] = {o[dn][0] * alpha, o[dn][1] * alpha, 0.0f, 0.0f};
            float c1[4] = {o[dn + 1][0] * alpha, o[dn + 1][1] * alpha, 0.0f, 0.0f};
            mma_f16_16816(pa, b[0], b[1], c0);
            mma_f16_16816(pa, b[2], b[3], c1);
            o[dn][0] = c0[0], o[dn][1] = c0[1];
            o[dn + 1][0] = c1[0], o[dn + 1][1] = c1[1];
        }
        __syncwarp();  // the next issue rewrites this stage
        long long o_ = off_next;
        off_next = tile_off(tt + ST + 1);
        issue(tt + ST, o_);
    }
    cp_async_wait_all();
    __syncwarp();
    ls += __shfl_xor_sync(0xffffffffu, ls, 1);
    ls += __shfl_xor_sync(0xffffffffu, ls, 2);
    // This warp's state into its own (now idle) stages: m, l per head, then
    // O (GM, HD).
    float* ws = (float*)wst;
    if (live) {
        if (t == 0) {
            ws[g] = m;
            ws[16 + g] = ls;
        }
        float* wo = ws + 32 + g * HD;
#pragma unroll
        for (int dn = 0; dn < HD / 8; dn++)
            *(float2*)&wo[8 * dn + 2 * t] = make_float2(o[dn][0], o[dn][1]);
    }
    __syncthreads();
    // Rank 0's slots (CL), past the stages; every CTA of the cluster has
    // started once this wait returns (the arrive at the top).
    float* cpart = (float*)(att_smem + (size_t)W * ST * 2 * TB);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (CL) asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
#endif
    // Warp w merges heads w, w + W, ... over the W warps in warp order
    // (base 2, as the states); lane l holds dims D32 l .. D32 l + D32 - 1.
    for (int gh = w; gh < group; gh += W) {
        float mxx = Q_NINF;
#pragma unroll
        for (int i = 0; i < W; i++) {
            const float* wi = (const float*)(att_smem + (size_t)i * ST * 2 * TB);
            if (wi[16 + gh] != 0.0f) mxx = fmaxf(mxx, wi[gh]);
        }
        float L = 0.0f, acc[D32];
#pragma unroll
        for (int u = 0; u < D32; u++) acc[u] = 0.0f;
#pragma unroll
        for (int i = 0; i < W; i++) {
            const float* wi = (const float*)(att_smem + (size_t)i * ST * 2 * TB);
            float li = wi[16 + gh];
            if (li == 0.0f) continue;  // a warp that saw no key
            float f = rm_ex2(wi[gh] - mxx);
            L = fmaf(li, f, L);
            const float* oi = wi + 32 + gh * HD + D32 * lane;
#pragma unroll
            for (int u = 0; u < D32; u++) acc[u] = fmaf(oi[u], f, acc[u]);
        }
        if constexpr (!CL) {
            att_out_lanes<D32>(acc, L, (long long)r * n_heads + h0 + gh, hd, out, xq, xds);
        } else {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
            // Into rank 0's slot (gh, y).
            u32 pa = cl_peer(cpart + (gh * ATT_RMMA_CL_MAX + y) * (2 + HD), 0);
            if (lane == 0)
                asm volatile("st.shared::cluster.v2.f32 [%0], {%1, %2};" ::"r"(pa), "f"(mxx),
                             "f"(L)
                             : "memory");
#pragma unroll
            for (int u = 0; u < D32; u++)
                asm volatile("st.shared::cluster.f32 [%0], %1;" ::"r"(pa + 4 * (2 + D32 * lane + u)),
                             "f"(acc[u])
                             : "memory");
#endif
        }
    }
    if constexpr (CL) {
        att_cluster_sync();
        // Rank 0 merges the C states of each head in rank order (the
        // others leave: nothing reads their memory now).
        if (y == 0) {
            for (int gh = w; gh < group; gh += W) {
                const float* sl = cpart + gh * ATT_RMMA_CL_MAX * (2 + HD);
                float mxx = Q_NINF;
                for (int i = 0; i < C; i++)
                    if (sl[i * (2 + HD) + 1] != 0.0f) mxx = fmaxf(mxx, sl[i * (2 + HD)]);
                float L = 0.0f, acc[D32];
#pragma unroll
                for (int u = 0; u < D32; u++) acc[u] = 0.0f;
                for (int i = 0; i < C; i++) {
                    const float* si = sl + i * (2 + HD);
                    if (si[1] == 0.0f) continue;  // a CTA that saw no key
                    float f = rm_ex2(si[0] - mxx);
                    L = fmaf(si[1], f, L);
#pragma unroll
                    for (int u = 0; u < D32; u++) acc[u] = fmaf(si[2 + D32 * lane + u], f, acc[u]);
                }
                att_out_lanes<D32>(acc, L, (long long)r * n_heads + h0 + gh, hd, out, xq, xds);
            }
        }
    }
}

// The entries take the pipelined split kernel's arguments (ATT_PIPE_ARGS,
// attention_split.cuh: the partials and bulk-copy maps are unused here)
// and the output, so the host launches them as it launches att_row_*.
#define ATT_RMMA_ENTRY(NAME, D32, GM, W, ST, CL)                                                \
    extern "C" __global__ void __launch_bounds__(32 * W) NAME(                                  \
        ATT_PIPE_ARGS, float* __restrict__ out, signed char* __restrict__ xq,                   \
        float2* __restrict__ xds) {                                                             \
        att_rmma<D32, GM, W, ST, CL>(q, n_heads, n_kv_heads, head_dim, block_size, scale, kc,   \
                                     vc, tables, table_off, row_seq, positions, early, out, xq, \
                                     xds);                                                      \
    }
#define ATT_RMMA(D32, GM, W, ST)                                                                \
    static_assert(ATT_RMMA_BYTES(D32, W, ST) == ATT_SMEM_att_rmma_d##D32##_g##GM,               \
                  "att_rmma_d" #D32 "_g" #GM ": the host's shared memory (att_pipe_smem)");     \
    static_assert(ATT_RMMA_BYTES(D32, W, ST) + ATT_RMMA_CL_BYTES(D32, GM) ==                    \
                      ATT_SMEM_att_rmma_c_d##D32##_g##GM,                                       \
                  "att_rmma_c_d" #D32 "_g" #GM ": the host's shared memory (att_pipe_smem)");   \
    ATT_RMMA_ENTRY(att_rmma_d##D32##_g##GM, D32, GM, W, ST, false)                              \
    ATT_RMMA_ENTRY(att_rmma_c_d##D32##_g##GM, D32, GM, W, ST, true)
ATT_RMMA(2, 1, ATT_RMMA_WARPS, ATT_RMMA_STAGES)
ATT_RMMA(2, 2, ATT_RMMA_WARPS, ATT_RMMA_STAGES)
ATT_RMMA(2, 3, ATT_RMMA_WARPS, ATT_RMMA_STAGES)
ATT_RMMA(2, 4, ATT_RMMA_WARPS, ATT_RMMA_STAGES)
ATT_RMMA(2, 8, ATT_RMMA_WARPS, ATT_RMMA_STAGES)
ATT_RMMA(4, 1, ATT_RMMA_WARPS_D4, ATT_RMMA_STAGES_D4)
ATT_RMMA(4, 2, ATT_RMMA_WARPS_D4, ATT_RMMA_STAGES_D4)
ATT_RMMA(4, 3, ATT_RMMA_WARPS_D4, ATT_RMMA_STAGES_D4)
ATT_RMMA(4, 4, ATT_RMMA_WARPS_D4, ATT_RMMA_STAGES_D4)
ATT_RMMA(4, 8, ATT_RMMA_WARPS_D4, ATT_RMMA_STAGES_D4)
