// The pipelined GQA-grouped split-KV decode attention (fast and
// deterministic modes; the partition, partials and merge of
// attention_split.cuh, which the kernel table (ops/kernels.rs) puts before this file).

// GQA-grouped split-KV decode: the same partition and partials as
// paged_attention_split (so attention_combine merges them), but one CTA per
// (row, KV head) and partial serves all the query heads sharing that KV
// head (up to GM; head_dim <= 32 * D32 <= 128, a multiple of 8), so every
// K/V row is read once instead of once per query head. With W warps, each
// walks its KPW = ATT_CHUNK / W keys of each of the partial's chunks as
// tiles of KT (keys s * ATT_CHUNK + KPW w + KT hf + 0..KT-1, hf < KPW /
// KT) and copies tiles t + 1 .. t + ST - 1's K
// and V rows into shared memory (cp.async, 16-byte copies coalesced along
// each row) while it computes tile t, so a warp always has loads in flight;
// the block table is read a tile ahead of the copies that use it.
//  - scores: lane l takes key l % KT and share l / KT of its NH = 32 / KT
//    shares of dimensions (the 16-byte pieces c = NH i + share; fp32, q in
//    shared memory), a shuffle tree adds the shares; K rows are stored
//    with piece c of row kk at slot c ^ (kk & 7), so the eight lanes of a
//    quarter warp (eight keys) read eight different bank groups;
//  - one online-softmax step per head per tile (max over the KT keys; each
//    lane keeps its own running sum, reduced once at the end);
//  - lane l owns dimensions D32*l .. D32*l + D32 - 1 and accumulates p·V
//    from the staged rows.
// The warps' states are merged in warp order (warp w merges head slots w,
// w + 4, ...). A head's arithmetic depends only on its row's keys and these
// constants: batch- and KV-cache invariant. KT and ST are fixed per entry:
// att_pipe_d*_g* and att_pipe_m_* take 16-key tiles at ATT_STAGES (host
// prelude, att_stages()) stages; att_pipe_w_* (`fast` mode, launches of
// more than one wave: see attention_split) 8-key tiles at ATT_W_STAGES,
// half the shared memory per stage and fewer registers, so more CTAs fit
// per SM (a different tile, so different bits; ATT_W_STAGES also comes
// from the host prelude). The shared memory is dynamic, laid out as
// att_pipe_smem (ops/attention/geometry.rs) computes. FUSE (the att_pipe_m_
// entries, launched with one CTA per (row, KV head)): the CTA then also
// merges its partials, so no attention_combine launch follows.
// Bytes of att_pipe_gqa's shared memory layout (below) for one entry;
// ATT_PIPE_GQA checks them against the host's att_pipe_smem.
__host__ __device__ constexpr int att_pipe_bytes(int d32, int gm, int kt, int st, int w) {
    return 2 * w * st * kt * 32 * d32 * 2 + gm * 32 * d32 * 4 + w * gm * kt * 4 + 2 * w * gm * 4 +
           8 * w * st;
}
// The cluster forms' extra shared memory (after att_pipe_bytes' layout):
// the unit's partials, (ATT_CLUSTER_MAX, GM) slots of 2 + 32 D32 floats,
// which every CTA of the cluster stores into rank 0's copy (cl_peer).
// ATT_CLUSTER_MAX: the host prelude's (ops/attention/geometry.rs).
__host__ __device__ constexpr int att_pipe_cl_bytes(int d32, int gm) {
    return ATT_CLUSTER_MAX * gm * (2 + 32 * d32) * 4;
}
// ATT_CL_DSMEM (default 1): the cluster forms' partials go to rank 0's
// shared memory (remote stores before the cluster barrier, which
// releases them; rank 0 then merges from its own shared memory) instead
// of through L2; 0 for comparisons. The same values and merge: the same
// bits.
#ifndef ATT_CL_DSMEM
#define ATT_CL_DSMEM 1
#endif
// K and V by bulk tensor copies (sm_90+, the host's `tma` flag: head_dim
// 32 * D32 exactly and block_size a multiple of the tile's KT keys, so a
// tile is KT consecutive cells of one page): the cache as 3-D tensors
// (head_dim, n_kv_heads, cells) of u16, one map for K (boxes of (64, 1,
// KT), 128-byte swizzle: the layout att_k_at describes) and one for V
// (boxes of (head_dim, 1, KT), no swizzle: rows as the cp.async path
// stores them). ops/attention/maps.rs att_maps encodes them (AttMaps,
// attention_split.cuh); zeros (never read) when `tma` is 0.
#ifndef ATT_TMA
#define ATT_TMA 1
#endif
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define ATT_TMA_ON ATT_TMA
#else
#define ATT_TMA_ON 0
#endif
// Byte offset, in a K stage of KT rows, of 16-byte piece c of row kk. The
// stage holds head_dim / 64 halves of (KT, 64) f16, 128 bytes a row, and
// piece c % 8 of a row of half c / 8 sits at slot (c % 8) ^ (kk % 8): the
// copy engine's 128-byte swizzle (the XOR of address bits 4-6 with bits
// 7-9), given stages 1024-byte aligned, which the cp.async path writes
// too. So the eight lanes of a quarter warp, reading one piece of eight
// keys, hit eight different bank groups.
template <int KT>
__device__ __forceinline__ int att_k_at(int kk, int c) {
    return (c >> 3) * (KT * 128) + kk * 128 + (((c & 7) ^ (kk & 7)) << 4);
}
// FUSE: ATT_FUSE_NONE (partials only), ATT_FUSE_SELF (one CTA per unit
// merges what it wrote), ATT_FUSE_CLUSTER (a thread-block cluster per unit,
// below).
#define ATT_FUSE_NONE 0
#define ATT_FUSE_SELF 1
#define ATT_FUSE_CLUSTER 2
// ATT_FUSE_ROW (the att_row_* entries, `fast` mode, one CTA per (row, KV
// head)): not the chunk partition at all. Warp w folds tiles w, w + W, w +
// 2W, ... of the whole row (KT keys each), the W warps' states are merged
// in warp order in shared memory and the CTA writes the output (and its
// int8 copy) itself: no partial in global memory, no second launch, no
// cluster barrier. Its bits depend only on the row's keys, W and KT.
#define ATT_FUSE_ROW 3
// ATT_STAMP: attention_split.cuh.
// att_cluster_sync (common.cuh): only the att_pipe_c_* entries use it,
// launched with cluster dimensions (1, gridDim.y, 1).
template <int D32, int GM, int FUSE, int KT = 16, int ST = ATT_STAGES, int W = ATT_SPLIT_WARPS>
__device__ __forceinline__ void att_pipe_gqa(
    const float* __restrict__ q, int n_heads, int n_kv_heads, int hd, int block_size,
    float scale, const u16* __restrict__ kc, const u16* __restrict__ vc,
    const u32* __restrict__ tables, const u32* __restrict__ table_off,
    const u32* __restrict__ row_seq, const u32* __restrict__ positions, int stride,
    int n_parts, float* __restrict__ part, int early, const AttMaps& maps, int tma,
    float* __restrict__ out, signed char* __restrict__ xq, float2* __restrict__ xds) {
    constexpr int HD = 32 * D32;  // the largest head_dim served; the smem row stride
    // KPW keys per warp and chunk, NH = 32 / KT lanes per key, TPC tiles
    // per warp and chunk.
    static_assert(KT == 8 || KT == 16, "KT is 8 or 16");
    constexpr bool ROW = FUSE == ATT_FUSE_ROW;
    constexpr int KPW = ROW ? KT : ATT_CHUNK / W, NH = 32 / KT, TPC = KPW / KT;
    static_assert(ROW || (ATT_CHUNK % W == 0 && KPW % KT == 0),
                  "a warp's keys of a chunk are whole tiles");
    extern __shared__ __align__(16) unsigned char att_smem[];
    // Layout (bytes): kst, vst: (W, ST, KT, HD) u16 each; qs: (GM, HD) f32;
    // wp: (W, GM, KT) f32; wm, wl: (W, GM) f32; bars: (W, ST) u64 (the
    // stages' mbarriers, `tma` only). After the key loop warp w's (GM, HD)
    // f32 accumulators (wacc(w)) alias its own K stages, which no other
    // warp touches, so it stores them without waiting for the others. A K
    // stage's rows are laid out as att_k_at says.
    u16(*kst)[ST][KT][HD] = (u16(*)[ST][KT][HD])att_smem;
    u16(*vst)[ST][KT][HD] = (u16(*)[ST][KT][HD])(att_smem + W * ST * KT * HD * 2);
    float(*qs)[HD] = (float(*)[HD])(att_smem + 2 * W * ST * KT * HD * 2);
    float(*wp)[GM][KT] = (float(*)[GM][KT])(att_smem + 2 * W * ST * KT * HD * 2 + GM * HD * 4);
    float(*wm)[GM] = (float(*)[GM])((unsigned char*)wp + W * GM * KT * 4);
    float(*wl)[GM] = (float(*)[GM])((unsigned char*)wm + W * GM * 4);
    u64(*bars)[ST] = (u64(*)[ST])((unsigned char*)wl + W * GM * 4);
    // The cluster forms' partials (rank 0's copy is the one used): slot
    // (g, p) at (g * ATT_CLUSTER_MAX + p) * (2 + hd).
    float* cpart = (float*)((unsigned char*)bars + 8 * W * ST);
    static_assert((att_pipe_bytes(D32, GM, KT, ST, W) - 8 * W * ST) % 8 == 0,
                  "the mbarriers (the layout's last 8 W ST bytes) are 8-byte aligned");
    static_assert((KT * HD * 2) % 1024 == 0 && (KT * 128) % 1024 == 0,
                  "K stages and halves 1024-byte aligned (the 128-byte swizzle)");
    auto wacc = [&](int i) { return (float(*)[HD])&kst[i][0][0][0]; };
    static_assert(GM * HD * 4 <= ST * KT * HD * 2, "a warp's wacc fits in its K stages");
    int group = n_heads / n_kv_heads;
    int r = blockIdx.x / n_kv_heads, kvh = blockIdx.x % n_kv_heads;
    int h0 = kvh * group;
    int w = threadIdx.x >> 5, l = threadIdx.x & 31;
    int kk = l % KT, hv = l / KT;
    int cpr = hd / 8, d0 = D32 * l;
    long long stamp[7] = {0, 0, 0, 0, 0, 0, 0};  // ATT_STAMP's clock64 per phase
    long long t_wait = 0;  // ATT_STAMP: cycles the tile loop waited for copies
    unsigned long long g_entry = 0;
    if (ATT_STAMP) {
        stamp[0] = clock64();
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(g_entry));
    }
    // Before GRID_DEP()'s wait (the previous kernel may still be running
    // under a programmatic edge) this CTA reads only what no kernel of the
    // step writes: positions, row_seq and the block tables (copied from the
    // host before the step's first kernel) and, with `early` (the host's
    // word that every row is its sequence's only row), K/V of keys before
    // the row's own position: the predecessor (the KV write) writes only
    // the slot at each row's position, and every kernel before it has
    // completed. So a CTA's start-up chain (position, table offset, table,
    // first K/V tiles) overlaps the predecessor's tail; q, the partials and
    // the row's own key are touched after the wait. Same loads, same bits.
    // Both loads issued before either is used (a chain of dependent loads
    // is the start-up latency of every CTA).
    int pos = (int)positions[r];
    u32 seq = row_seq[r];
    int n_chunks = pos / ATT_CHUNK + 1;
    int np = min(n_chunks, n_parts);
    // A cluster's CTAs all reach its barrier; the others may leave.
    if (FUSE != ATT_FUSE_CLUSTER && (int)blockIdx.y >= np) return;
    // The cluster forms' partials in rank 0's slots: one partial per CTA,
    // at most ATT_CLUSTER_MAX CTAs (the host's cluster rule and its
    // chunk bucket promise both; anything else is a launch bug).
    if (FUSE == ATT_FUSE_CLUSTER && ATT_CL_DSMEM &&
        (np > (int)gridDim.y || (int)gridDim.y > ATT_CLUSTER_MAX))
        __trap();
    const u32* table = tables + table_off[seq];
    bool waited = false;
    tma = ATT_TMA_ON ? tma : 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (tma) {
        if (threadIdx.x == 0) {
            // The K stages must sit where the copy engine's swizzle expects
            // them (att_k_at): the shared window's start, 1024-aligned.
            if ((__cvta_generic_to_shared(att_smem) & 1023) != 0) __trap();
        }
        if (l == 0) {
            for (int i = 0; i < ST; i++) mbar_init(&bars[w][i], 1);
            asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        }
        __syncwarp();
    }
#endif
    // `tma`: bit i is the parity of stage i's next barrier phase.
    u32 phase = 0;
    // ROW: one pass over the whole row (its grid has one CTA per unit).
    for (int p = blockIdx.y; p < (ROW ? 1 : np); p += gridDim.y) {
        // Tile t of this warp starts at key tile_k0(t); tiles are in
        // increasing key order, so the first past pos ends the walk.
        auto tile_k0 = [&](int t) {
            if (ROW) return (t * W + w) * KT;
            return (p + (t / TPC) * n_parts) * ATT_CHUNK + KPW * w + KT * (t % TPC);
        };
        int n_tiles = 0;
        while (tile_k0(n_tiles) <= pos) n_tiles++;
        // Lane kk's key of tile t: its K/V offset (0 past pos or the last
        // tile). `tma`: the cell of the tile's first key (every lane the
        // same; the tile's KT cells are consecutive in one page).
        auto tile_off = [&](int t) {
            long long off = 0;
            int j = tile_k0(t) + (tma ? 0 : kk);
            if (t < n_tiles && j <= pos) {
                long long cell = (long long)table[j / block_size] * block_size + j % block_size;
                off = tma ? cell : (cell * n_kv_heads + kvh) * hd;
            }
            return off;
        };
        // Copies tile t (lane kk's key at off) into stage t % ST: one commit
        // group, empty past the last tile. `tma`: lane 0 queues the tile's
        // whole K and V boxes (cells past pos too: never used) on the
        // stage's barrier.
        auto issue = [&](int t, long long off) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
            if (tma) {
                if (t < n_tiles && l == 0) {
                    int st = t % ST;
                    u64* bar = &bars[w][st];
                    mbar_expect(bar, 2 * KT * HD * 2);
#pragma unroll
                    for (int hf = 0; hf < HD / 64; hf++)
                        tma_3d_g2s((unsigned char*)&kst[w][st][0][0] + hf * KT * 128, &maps.k,
                                   64 * hf, kvh, (int)off, bar);
                    tma_3d_g2s(&vst[w][st][0][0], &maps.v, 0, kvh, (int)off, bar);
                }
                return;
            }
#endif
            if (t < n_tiles) {
                int k0 = tile_k0(t), st = t % ST;
                for (int base = 0; base < KT * cpr; base += 32) {
                    int idx = base + l;
                    int row = min(idx / cpr, KT - 1), c = idx - row * cpr;
                    long long ro = __shfl_sync(0xffffffffu, off, row);
                    if (idx < KT * cpr && k0 + row <= pos) {
                        cp_async16((unsigned char*)&kst[w][st][0][0] + att_k_at<KT>(row, c),
                                   kc + ro + 8 * c, 16);
                        cp_async16(&vst[w][st][row][8 * c], vc + ro + 8 * c, 16);
                    }
                }
            }
            cp_async_commit();
        };
        float m[GM], ls[GM], acc[GM][D32];
#pragma unroll
        for (int g = 0; g < GM; g++) {
            m[g] = Q_NINF;
            ls[g] = 0.0f;
#pragma unroll
            for (int u = 0; u < D32; u++) acc[g][u] = 0.0f;
        }
        // The block table is read one tile ahead of the copies that use it,
        // so its latency hides behind a tile's compute (off_next: tile t +
        // ST - 1's offset at the top of iteration t).
        long long off_next = tile_off(0);
        // The first ST - 1 tiles go out before the wait when all their keys
        // precede pos (tiles are in increasing key order).
        if (!waited && !(early && tile_k0(ST - 2) + KT - 1 < pos)) {
            GRID_DEP();
            waited = true;
        }
#pragma unroll
        for (int t = 0; t < ST - 1; t++) {
            long long o = off_next;
            off_next = tile_off(t + 1);
            issue(t, o);
        }
        if (!waited) {
            GRID_DEP();
            waited = true;
        }
        if (ATT_STAMP && p == (int)blockIdx.y) stamp[1] = clock64();
        if (p == (int)blockIdx.y) {  // the queries, once, while the first tiles load
            // By float4 (hd a multiple of 8, q 16-byte aligned): every load
            // of the CTA's share issued before any is stored (the scalar
            // loop made the 8B's 512 values four L2 round trips).
            constexpr int NQ = (GM * HD / 4 + 32 * W - 1) / (32 * W);
            float4 qv[NQ];
#pragma unroll
            for (int j = 0; j < NQ; j++) {
                int i = 4 * (threadIdx.x + 32 * W * j), g = i / HD, d = i % HD;
                qv[j] = (i < GM * HD && g < group && d < hd)
                            ? *(const float4*)(q + ((long long)r * n_heads + h0 + g) * hd + d)
                            : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            }
#pragma unroll
            for (int j = 0; j < NQ; j++) {
                int i = 4 * (threadIdx.x + 32 * W * j), g = i / HD, d = i % HD;
                if (i < GM * HD)
                    *(float4*)&qs[g][d] = make_float4(qv[j].x * scale, qv[j].y * scale,
                                                      qv[j].z * scale, qv[j].w * scale);
            }
            __syncthreads();
            if (ATT_STAMP) stamp[2] = clock64();
        }
        for (int t = 0; t < n_tiles; t++) {
            long long o = off_next;
            off_next = tile_off(t + ST);
            issue(t + ST - 1, o);
            int st = t % ST, k0 = tile_k0(t);
            long long tw0 = ATT_STAMP ? clock64() : 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
            if (tma) {
                mbar_wait(&bars[w][st], (phase >> st) & 1);
                phase ^= 1u << st;
            } else
#endif
                cp_async_wait_group<ST - 1>();  // tile t's copies are done
            if (ATT_STAMP) t_wait += clock64() - tw0;
            __syncwarp();
            bool ok = k0 + kk <= pos;
            int nk = min(KT, pos - k0 + 1);
            float sc[GM];
#pragma unroll
            for (int g = 0; g < GM; g++) sc[g] = 0.0f;
#pragma unroll
            for (int i = 0; i < HD / (8 * NH); i++) {
                int c = NH * i + hv;
                if (c < cpr) {
                    uint4 kv = *(const uint4*)((const unsigned char*)&kst[w][st][0][0] +
                                               att_k_at<KT>(kk, c));
                    float2 k0f = q_f16x2(kv.x), k1f = q_f16x2(kv.y);
                    float2 k2f = q_f16x2(kv.z), k3f = q_f16x2(kv.w);
#pragma unroll
                    for (int g = 0; g < GM; g++) {
                        float4 qa = *(const float4*)&qs[g][8 * c];
                        float4 qb = *(const float4*)&qs[g][8 * c + 4];
                        float a = fmaf(qa.x, k0f.x, sc[g]);
                        a = fmaf(qa.y, k0f.y, a);
                        a = fmaf(qa.z, k1f.x, a);
                        a = fmaf(qa.w, k1f.y, a);
                        a = fmaf(qb.x, k2f.x, a);
                        a = fmaf(qb.y, k2f.y, a);
                        a = fmaf(qb.z, k3f.x, a);
                        sc[g] = fmaf(qb.w, k3f.y, a);
                    }
                }
            }
#pragma unroll
            for (int g = 0; g < GM; g++) {
                float sj = sc[g];
#pragma unroll
                for (int o = KT; o < 32; o <<= 1) sj += __shfl_xor_sync(0xffffffffu, sj, o);
                sj = ok ? sj : Q_NINF;
                float mr = sj;
#pragma unroll
                for (int o = KT / 2; o >= 1; o >>= 1)
                    mr = fmaxf(mr, __shfl_xor_sync(0xffffffffu, mr, o));
                float m_new = fmaxf(m[g], mr);
                float alpha = (m[g] == Q_NINF) ? 0.0f : __expf(m[g] - m_new);
                float pj = ok ? __expf(sj - m_new) : 0.0f;
                // Both halves hold key kk's weight; half 0 counts it.
                ls[g] = fmaf(ls[g], alpha, hv == 0 ? pj : 0.0f);
#pragma unroll
                for (int u = 0; u < D32; u++) acc[g][u] *= alpha;
                if (hv == 0) wp[w][g][kk] = pj;
                m[g] = m_new;
            }
            __syncwarp();
            // p·V over the tile's keys in key order. A whole tile (every
            // tile but a row's last) is unrolled, so its shared-memory loads
            // can issue together: at batch 1 a CTA's four warps are alone on
            // their SM's schedulers, each tile about 2,400 cycles (ATT_STAMP,
            // H200, 2026-11-27). Unrolled, the 8B's tiles took 7,140 cycles
            // a CTA against 7,650, SmolLM2's no fewer; with the query
            // staging (above), decode +1-5% (docs/PERF.md). Same order,
            // same bits.
            auto pv = [&](int tt) {
                float v[D32];
                if constexpr (D32 == 4) {
                    uint2 x = *(const uint2*)&vst[w][st][tt][d0];
                    float2 a = q_f16x2(x.x), b = q_f16x2(x.y);
                    v[0] = a.x, v[1] = a.y, v[2] = b.x, v[3] = b.y;
                } else {
                    static_assert(D32 == 2, "D32 is 2 or 4");
                    float2 a = q_f16x2(*(const u32*)&vst[w][st][tt][d0]);
                    v[0] = a.x, v[1] = a.y;
                }
#pragma unroll
                for (int g = 0; g < GM; g++) {
                    float pt = wp[w][g][tt];
#pragma unroll
                    for (int u = 0; u < D32; u++) acc[g][u] = fmaf(pt, v[u], acc[g][u]);
                }
            };
            if (d0 < hd) {
                if (nk == KT) {
#pragma unroll
                    for (int tt = 0; tt < KT; tt++) pv(tt);
                } else {
                    for (int tt = 0; tt < nk; tt++) pv(tt);
                }
            }
            __syncwarp();  // the next issue rewrites this stage and wp
        }
        cp_async_wait_all();
        if (ATT_STAMP && p == (int)blockIdx.y) stamp[3] = clock64();
#pragma unroll
        for (int g = 0; g < GM; g++) {
#pragma unroll
            for (int o = 16; o >= 1; o >>= 1) ls[g] += __shfl_xor_sync(0xffffffffu, ls[g], o);
            if (l == 0) {
                wm[w][g] = m[g];
                wl[w][g] = ls[g];
            }
        }
        // This warp's copies are all complete (waited above), so its K
        // stages are free for its accumulators.
        if (d0 < hd) {
#pragma unroll
            for (int g = 0; g < GM; g++) {
#pragma unroll
                for (int u = 0; u < D32; u++) wacc(w)[g][d0 + u] = acc[g][u];
            }
        }
        __syncthreads();
        for (int g = w; g < GM && g < group; g += W) {
            float mx = Q_NINF;
#pragma unroll
            for (int i = 0; i < W; i++)
                if (wl[i][g] != 0.0f) mx = fmaxf(mx, wm[i][g]);
            float L = 0.0f, o[D32];
#pragma unroll
            for (int u = 0; u < D32; u++) o[u] = 0.0f;
#pragma unroll
            for (int i = 0; i < W; i++) {
                if (wl[i][g] == 0.0f) continue;  // a warp that saw no key
                float f = __expf(wm[i][g] - mx);
                L = fmaf(wl[i][g], f, L);
                if (d0 < hd) {
#pragma unroll
                    for (int u = 0; u < D32; u++) o[u] = fmaf(wacc(i)[g][d0 + u], f, o[u]);
                }
            }
            if constexpr (ROW) {
                // The row's output and, for the next matmul, its int8 copy
                // (lane l holds dimensions d0 = D32 l ..).
                att_out_lanes<D32>(o, L, (long long)r * n_heads + h0 + g, hd, out, xq, xds);
                continue;
            }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
            if constexpr (FUSE == ATT_FUSE_CLUSTER && ATT_CL_DSMEM) {
                // Into rank 0's shared memory (the cluster is (1,
                // gridDim.y, 1): rank = blockIdx.y = p, one partial a CTA).
                u32 pa = cl_peer(cpart + (g * ATT_CLUSTER_MAX + p) * (2 + hd), 0);
                if (l == 0)
                    asm volatile("st.shared::cluster.v2.f32 [%0], {%1, %2};" ::"r"(pa), "f"(mx),
                                 "f"(L)
                                 : "memory");
                if (d0 < hd) {
#pragma unroll
                    for (int u = 0; u < D32; u++)
                        asm volatile("st.shared::cluster.f32 [%0], %1;" ::"r"(
                                         pa + 4 * (2 + d0 + u)),
                                     "f"(o[u])
                                     : "memory");
                }
                continue;
            }
#endif
            float* pp = part + (((long long)r * n_heads + h0 + g) * stride + p) * (2 + hd);
            if (l == 0) {
                pp[0] = mx;
                pp[1] = L;
            }
            if (d0 < hd) {
#pragma unroll
                for (int u = 0; u < D32; u++) pp[2 + d0 + u] = o[u];
            }
        }
        // Before the next partial reuses the shared state: its bulk copies
        // (async proxy) overwrite kst, which wacc (generic stores) aliases.
        // Also before att_pipe_m_'s merge, which reads what other warps
        // just stored; the cluster form's barrier orders its own.
        if (FUSE == ATT_FUSE_SELF || (!ROW && p + (int)gridDim.y < np)) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
            if (tma) asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
            __syncthreads();
        }
        if (ATT_STAMP && p == (int)blockIdx.y) stamp[4] = clock64();
    }
    if constexpr (FUSE == ATT_FUSE_CLUSTER) {
        // att_pipe_c_*: the CTAs of a unit (gridDim.y of them, 2..=16) form
        // one cluster. Each stored its partial into rank 0's shared memory
        // (ATT_CL_DSMEM), and the barrier's release / acquire makes them
        // visible there; rank 0's warps then merge the heads with
        // attention_combine's arithmetic and order: the combine's bits
        // without its launch or an L2 round trip, and no second barrier
        // (nothing reads a peer's memory after this one: the peers
        // leave). Pulling the partials from the peers' shared memory
        // needed that second barrier and measured no faster; this push
        // form +1.7% on SmolLM2's decode after 512 tokens (H200,
        // 2026-11-28, docs/PERF.md). With ATT_CL_DSMEM=0 the partials go
        // through L2 (read with ld.global.cg, so never from this SM's
        // L1) and the cluster's W * gridDim.y warps merge, warp W * y + w
        // taking heads W * y + w, + W * gridDim.y, .... A CTA past the
        // row's partials took no tile, so it waits here for the previous
        // kernel before writing out.
        if (!waited) GRID_DEP();
        att_cluster_sync();
        if (ATT_STAMP) stamp[5] = clock64();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        if (ATT_CL_DSMEM) {
            // Rank 0 holds every partial: its warps merge, warp w heads w,
            // w + W, ... (the others leave; nothing reads their memory).
            if (blockIdx.y == 0)
                for (int g = w; g < group; g += W)
                    att_combine_rh<D32, 8, false>(cpart, g, r * n_heads + h0 + g, pos, hd,
                                                  ATT_CLUSTER_MAX, n_parts, out, xq, xds);
        } else
#endif
        {
            int cw = W * (int)blockIdx.y + w;
            for (int g = cw; g < group; g += W * (int)gridDim.y)
                att_combine_rh<D32, 8, true>(part, r * n_heads + h0 + g, r * n_heads + h0 + g,
                                             pos, hd, stride, n_parts, out, xq, xds);
        }
    }
    if constexpr (FUSE == ATT_FUSE_SELF) {
        // att_pipe_m_*: the grid has one CTA per (row, KV head) (gridDim.y
        // == 1, so this CTA wrote every partial of its heads, and the
        // barrier ending the loop made them visible to all its threads):
        // it merges them itself, warp w taking heads w, w + W, ..., with
        // attention_combine's arithmetic and order (8 partials' loads in
        // flight per lane: the key loop's registers bound it).
        for (int g = w; g < group; g += W)
            att_combine_rh<D32, 8, true>(part, r * n_heads + h0 + g, r * n_heads + h0 + g, pos,
                                         hd, stride, n_parts, out, xq, xds);
    }
    if (ATT_STAMP && threadIdx.x == 0 && kvh == 0 && pos % 64 == 0) {
        stamp[6] = clock64();
        for (int i = 1; i < 7; i++)
            if (stamp[i] == 0) stamp[i] = stamp[i - 1];
        printf("ATT_STAMP fuse=%d y=%d/%d pos=%d entry_ns=%llu wait=%lld q=%lld tiles=%lld "
               "part=%lld bar=%lld end=%lld tw=%lld\n",
               FUSE, (int)blockIdx.y, (int)gridDim.y, pos, g_entry, stamp[1] - stamp[0],
               stamp[2] - stamp[1], stamp[3] - stamp[2], stamp[4] - stamp[3],
               stamp[5] - stamp[4], stamp[6] - stamp[5], t_wait);
    }
}

// ATT_PIPE_ARGS: attention_split.cuh.
#define ATT_PIPE_PASS                                                                          \
    q, n_heads, n_kv_heads, head_dim, block_size, scale, kc, vc, tables, table_off, row_seq,   \
        positions, stride, n_parts, part, early, maps, tma
// att_pipe_d*_g*: partials only (attention_combine merges them);
// GRID_DEP() is inside att_pipe_gqa (some loads go before its wait);
// att_pipe_m_d*_g*: one CTA per (row, KV head) that also merges them and
// writes the output (and its int8 copy, as attention_combine does);
// att_pipe_c_d*_g*: a cluster of CTAs per (row, KV head) that merge
// them after the cluster barrier (sm_90+);
// att_pipe_w_d*_g*: partials only, 8-key tiles (see att_pipe_gqa);
// att_pipe_m3_d*_g*: att_pipe_m_'s merging form at ATT_M3_STAGES stages,
// for launches where one CTA per (row, KV head) folds rows of several
// chunks (`fast`: ops/attention/forms.rs, deep_rule).
// ATT_SMEM_<name> (host prelude): the bytes ops/attention/launch.rs launches
// each entry with (att_pipe_smem); it must equal the kernel's layout.
#define ATT_PIPE_CHECK(NAME, D32, GM, KT, ST, W)                                               \
    static_assert(att_pipe_bytes(D32, GM, KT, ST, W) == ATT_SMEM_##NAME,                       \
                  "ops/attention/geometry.rs disagrees on " #NAME "'s shared memory");
// The partials, merging and cluster entries of prefix PRE (att_pipe_ or
// att_pipe8_) at W warps per CTA, 16-key tiles at ATT_STAGES stages.
#define ATT_PIPE_SPLIT(PRE, D32, GM, W)                                                         \
    ATT_PIPE_CHECK(PRE##d##D32##_g##GM, D32, GM, 16, ATT_STAGES, W)                             \
    ATT_PIPE_CHECK(PRE##m_d##D32##_g##GM, D32, GM, 16, ATT_STAGES, W)                           \
    static_assert(att_pipe_bytes(D32, GM, 16, ATT_STAGES, W) + att_pipe_cl_bytes(D32, GM) ==    \
                      ATT_SMEM_##PRE##c_d##D32##_g##GM,                                         \
                  "ops/attention/geometry.rs disagrees on the cluster form's shared memory");         \
    extern "C" __global__ void __launch_bounds__(32 * W) PRE##d##D32##_g##GM(ATT_PIPE_ARGS) {   \
        att_pipe_gqa<D32, GM, ATT_FUSE_NONE, 16, ATT_STAGES, W>(ATT_PIPE_PASS, nullptr, nullptr, \
                                                               nullptr);                        \
    }                                                                                           \
    extern "C" __global__ void __launch_bounds__(32 * W)                                        \
        PRE##m_d##D32##_g##GM(ATT_PIPE_ARGS, float* __restrict__ out,                           \
                              signed char* __restrict__ xq, float2* __restrict__ xds) {         \
        att_pipe_gqa<D32, GM, ATT_FUSE_SELF, 16, ATT_STAGES, W>(ATT_PIPE_PASS, out, xq, xds);   \
    }                                                                                           \
    extern "C" __global__ void __launch_bounds__(32 * W)                                        \
        PRE##c_d##D32##_g##GM(ATT_PIPE_ARGS, float* __restrict__ out,                           \
                              signed char* __restrict__ xq, float2* __restrict__ xds) {         \
        att_pipe_gqa<D32, GM, ATT_FUSE_CLUSTER, 16, ATT_STAGES, W>(ATT_PIPE_PASS, out, xq, xds); \
    }
#define ATT_PIPE_GQA(D32, GM)                                                                   \
    ATT_PIPE_SPLIT(att_pipe_, D32, GM, ATT_SPLIT_WARPS)                                         \
    ATT_PIPE_CHECK(att_pipe_w_d##D32##_g##GM, D32, GM, 8, ATT_W_STAGES, ATT_SPLIT_WARPS)        \
    ATT_PIPE_CHECK(att_pipe_m3_d##D32##_g##GM, D32, GM, 16, ATT_M3_STAGES, ATT_SPLIT_WARPS)     \
    extern "C" __global__ void __launch_bounds__(32 * ATT_SPLIT_WARPS)                          \
        att_pipe_w_d##D32##_g##GM(ATT_PIPE_ARGS) {                                              \
        att_pipe_gqa<D32, GM, ATT_FUSE_NONE, 8, ATT_W_STAGES>(ATT_PIPE_PASS, nullptr, nullptr,  \
                                                              nullptr);                         \
    }                                                                                           \
    extern "C" __global__ void __launch_bounds__(32 * ATT_SPLIT_WARPS)                          \
        att_pipe_m3_d##D32##_g##GM(ATT_PIPE_ARGS, float* __restrict__ out,                      \
                                   signed char* __restrict__ xq, float2* __restrict__ xds) {    \
        att_pipe_gqa<D32, GM, ATT_FUSE_SELF, 16, ATT_M3_STAGES>(ATT_PIPE_PASS, out, xq, xds);   \
    }
// att_pipe8_{d,m_,c_}d*_g*: the partials, merging and cluster forms with
// ATT_PIPE8_WARPS warps per CTA, so each warp folds one 16-key tile of a
// 128-key chunk instead of two (`fast` mode, launches of at most about two
// CTAs per SM: ops/attention/forms.rs, eight_rule). At batch 1 a
// CTA's warps are alone on their SM and a tile is about 2,200 cycles of
// dependent shared-memory loads, FMAs and shuffles (ATT_STAMP, H200,
// 2026-11-28): two warps per scheduler, each with half the tiles, end the
// tile loop in 2,200 cycles instead of 5,300. The warps' states are merged
// in warp order as in the 4-warp forms, over 16-key runs instead of 32:
// other bits (a function of the launch shape, as `fast` allows).
// ATT_PIPE8_WARPS: the host prelude's (ops/attention/geometry.rs).
#define ATT_PIPE_GQA8(D32, GM) ATT_PIPE_SPLIT(att_pipe8_, D32, GM, ATT_PIPE8_WARPS)
// att_row_d*_g*: ATT_FUSE_ROW (above) at ATT_ROW_WARPS warps (head_dim
// <= 64) or ATT_ROW_WARPS_D4 (<= 128) per CTA, 8-key tiles at
// ATT_ROW_STAGES (ATT_ROW_STAGES_D4) stages (host prelude, ops/attention/geometry.rs:
// row_rule picks it for `fast` launches of few (row, KV head) units).
#define ATT_ROW(D32, GM, W, ST)                                                                 \
    ATT_PIPE_CHECK(att_row_d##D32##_g##GM, D32, GM, 8, ST, W)                                    \
    extern "C" __global__ void __launch_bounds__(32 * W)                                        \
        att_row_d##D32##_g##GM(ATT_PIPE_ARGS, float* __restrict__ out,                          \
                               signed char* __restrict__ xq, float2* __restrict__ xds) {        \
        att_pipe_gqa<D32, GM, ATT_FUSE_ROW, 8, ST, W>(ATT_PIPE_PASS, out, xq, xds);             \
    }
// GM = 3: groups of three query heads (SmolLM2's 9 over 3) would run the
// 4-head entry with a quarter of its arithmetic on a zero head, and the
// batch-1 tile loop is bound by that arithmetic (ATT_STAMP).
// The kernel table compiles this file once per (head_dim class, group
// class) part, ATT_PART_D32 and ATT_PART_GM defined before it
// (ops/kernels.rs): ten translation units of nine entries that NVRTC
// compiles in parallel, where the one unit of all ninety took 45 s on a
// cold kernel cache. ATT_PART's arguments are expanded before they reach
// the token pasting of the entry names.
#if !defined(ATT_PART_D32) || !defined(ATT_PART_GM)
#error "attention_pipe_fast.cu: define ATT_PART_D32 and ATT_PART_GM (ops/kernels.rs)"
#endif
#define ATT_PART(D32, GM, RW, RS)                                                               \
    ATT_PIPE_GQA(D32, GM)                                                                       \
    ATT_PIPE_GQA8(D32, GM)                                                                      \
    ATT_ROW(D32, GM, RW, RS)
#if ATT_PART_D32 == 2
ATT_PART(2, ATT_PART_GM, ATT_ROW_WARPS, ATT_ROW_STAGES)
#else
ATT_PART(4, ATT_PART_GM, ATT_ROW_WARPS_D4, ATT_ROW_STAGES_D4)
#endif
