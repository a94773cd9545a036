// The split-KV decode attention's shared part (attention_fast.cu and
// attention_pipe_fast.cu each start with it, ops/kernels.rs): the partition's
// constants and the ordered merge of a row's partials.

#ifndef ATT_MAXD
#define ATT_MAXD 8
#endif

// ---------------------------------------------------------------------------
// Split-KV attention (flash-decoding) for the fast and deterministic modes.
// A row's keys 0..=pos are cut into chunks of ATT_CHUNK by absolute
// position; chunk s belongs to partial p = s % n_parts, and a partial
// folds its chunks in increasing order. paged_attention_split computes
// partials (grid: (row, head) x G; CTA y computes partials y, y + G, ...),
// attention_combine merges a row's partials in order p = 0, 1, .... The
// arithmetic of a row depends only on its own keys, the constants and
// n_parts, never on G or the block layout. `deterministic` passes n_parts =
// ATT_PARTS always: batch- and KV-cache invariant. `fast` passes fewer when
// the batch alone fills the GPU (ops/attention/forms.rs, parts_for_slots), so each
// CTA folds more chunks and fewer partials are written and merged.
//
// Inside a chunk, warp w takes keys w*32 + 0..31 of each group of
// 32*ATT_SPLIT_WARPS keys: lane j scores key j (a whole K row, 16-byte
// loads), the warp runs one online-softmax update per 32 keys, then stages
// the group's V rows in shared memory 16 at a time (all lanes load, 16-byte
// loads in flight together) and accumulates p·V with lanes owning
// dimensions l, l + 32, .... The warps' states are merged in warp order.
#define ATT_SPLIT_WARPS 4
#define ATT_CHUNK (32 * ATT_SPLIT_WARPS)
static_assert(32 * ATT_SPLIT_WARPS == ATT_SPLIT_THREADS,
              "ops/attention/launch.rs launches the split kernels with another CTA size");
#define ATT_PARTS 32
#define ATT_VSTAGE 16


// One warp per (row, head): merges the row's partials in order p = 0, 1,
// .... Lane p loads partial p's (m, l) (ATT_PARTS <= 32), the max is an
// exact warp reduction, and the ordered sums take each partial's weight by
// shuffle. Every load of the first LOADS partials is issued at once, before
// the row's partial count is known (slots below `stride` exist for every
// row; those past its count are loaded but never used), so the kernel waits
// for one round trip instead of a chain of them; later partials LOADS at a
// time. The arithmetic and its order do not depend on LOADS. MAXU: the
// values of head_dim a lane holds (attention_combine: 8, head_dim <= 256;
// attention_combine_d128: 4, head_dim <= 128, twice the loads in flight
// for the same registers; att_pipe_gqa's merges: D32).
// Which dimensions a lane holds: with MAXU 4 (ATT_COMB_CONTIG, the
// default) lane l holds 4 consecutive ones, d = 4 l + u, read by 8-byte
// loads, so a 32-block of the int8 copy is held by 8 lanes and one
// q8_block<4> quantizes every block of the head at once (the strided
// layout, d = l + 32 u, quantizes block by block: up to 4 dependent
// shuffle chains); with 2 or 8 (or ATT_COMB_CONTIG=0, for comparisons)
// the strided one: the contiguous one measured 1% slower on SmolLM2's
// cluster merge (MAXU 2) and 1% faster on the 8B (H200, 2026-11-28,
// docs/PERF.md). Each
// dimension's arithmetic and order are the same in both, and q8_block's
// max and integer sum do not depend on the lanes: the same bits.
// With xq non-null (head_dim a multiple of 32), the output is also
// quantized as quant_q8 would, for the matmul that reads it next.
// CG: partials are read with ld.global.cg (att_pipe_gqa's own merge reads
// what its CTA just wrote, which must not take the read-only path the
// compiler may pick for a const __restrict__ pointer).
#ifndef ATT_COMB_CONTIG
#define ATT_COMB_CONTIG 1
#endif
template <bool CG>
__device__ __forceinline__ float att_ld(const float* p) {
    if (CG) return __ldcg(p);
    return *p;
}
template <bool CG>
__device__ __forceinline__ float2 att_ld2(const float* p) {
    if (CG) return __ldcg((const float2*)p);
    return *(const float2*)p;
}
// prh: the (row, head) slot of `part` (rh in global partials; a local head
// in att_pipe_gqa's cluster merge through shared memory), rh the output's.
// A merged head's output from a warp whose lane l holds the V consecutive
// dimensions V l .. of its sums o (V = 2 or 4, head_dim a multiple of 8):
// out = o / L and, with xq (head_dim a multiple of 32), its int8 copy,
// one q8_block<V> for all the head's 32-blocks (32 / V lanes a block;
// lanes past head_dim are whole groups). att_combine_rh's contiguous
// layout and att_pipe_gqa's row form.
template <int V>
__device__ __forceinline__ void att_out_lanes(const float* o, float L, long long rh, int hd,
                                             float* __restrict__ out,
                                             signed char* __restrict__ xq,
                                             float2* __restrict__ xds) {
    int l = threadIdx.x & 31, d = V * l;
    float r[V];
#pragma unroll
    for (int u = 0; u < V; u++) r[u] = o[u] / L;
    if (d < hd) {
#pragma unroll
        for (int u = 0; u < V; u++) out[rh * hd + d + u] = r[u];
        if (xq) {
            constexpr int LPB = 32 / V;
            long long blk = rh * (hd / 32) + l / LPB;
            q8_block<V>(r, l % LPB, xq + 32 * blk, xds + blk);
        }
    }
}
template <int MAXU, int LOADS, bool CG>
__device__ __forceinline__ void att_combine_rh(const float* __restrict__ part, int prh, int rh,
                                               int pos,
                                               int head_dim, int stride, int n_parts,
                                               float* __restrict__ out,
                                               signed char* __restrict__ xq,
                                               float2* __restrict__ xds) {
    static_assert(ATT_PARTS <= 32, "one lane per partial (n_parts <= ATT_PARTS)");
    constexpr bool CONTIG = ATT_COMB_CONTIG && MAXU == 4;
    int l = threadIdx.x & 31;
    int hd = head_dim;
    const float* pr = part + (long long)prh * stride * (2 + hd);
    float mp = Q_NINF, lp = 0.0f;
    if (l < stride) {
        mp = att_ld<CG>(pr + (long long)l * (2 + hd));
        lp = att_ld<CG>(pr + (long long)l * (2 + hd) + 1);
    }
    // Partial i's values of this lane (zeros past hd or the loaded ones).
    // CONTIG: a lane's values are whole (MAXU a multiple of 2, hd of 8, so
    // all or none are < hd) and 8-byte aligned (2 + hd is even).
    auto load = [&](float(&vi)[MAXU], int i, bool ok) {
        const float* pv = pr + (long long)i * (2 + hd) + 2;
        if constexpr (CONTIG) {
            int d = MAXU * l;
#pragma unroll
            for (int u = 0; u < MAXU; u += 2) {
                float2 x = (ok && d < hd) ? att_ld2<CG>(pv + d + u) : make_float2(0.0f, 0.0f);
                vi[u] = x.x;
                vi[u + 1] = x.y;
            }
        } else {
#pragma unroll
            for (int u = 0; u < MAXU; u++) {
                int d = l + 32 * u;
                vi[u] = (ok && d < hd) ? att_ld<CG>(pv + d) : 0.0f;
            }
        }
    };
    float v[LOADS][MAXU];
#pragma unroll
    for (int i = 0; i < LOADS; i++) load(v[i], i, i < stride);
    int np = min(pos / ATT_CHUNK + 1, n_parts);
    if (l >= np) {
        mp = Q_NINF;
        lp = 0.0f;
    }
    float mx = mp;
#pragma unroll
    for (int st = 16; st >= 1; st >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, st));
    float fp = (l < np) ? __expf(mp - mx) : 0.0f;
    float L = 0.0f;
    float o[MAXU];
#pragma unroll
    for (int u = 0; u < MAXU; u++) o[u] = 0.0f;
    for (int p0 = 0; p0 < np; p0 += LOADS) {
        if (p0 > 0) {
#pragma unroll
            for (int i = 0; i < LOADS; i++) load(v[i], p0 + i, p0 + i < np);
        }
#pragma unroll
        for (int i = 0; i < LOADS; i++) {
            if (p0 + i >= np) break;  // warp-uniform
            float f = __shfl_sync(0xffffffffu, fp, p0 + i);
            L += __shfl_sync(0xffffffffu, lp, p0 + i) * f;
#pragma unroll
            for (int u = 0; u < MAXU; u++) o[u] += v[i][u] * f;
        }
    }
    float* op = out + (long long)rh * hd;
    if constexpr (CONTIG) {
        att_out_lanes<MAXU>(o, L, rh, hd, out, xq, xds);
    } else {
#pragma unroll
        for (int u = 0; u < MAXU; u++) {
            int d = l + 32 * u;
            float r = o[u] / L;
            if (d < hd) op[d] = r;
            if (xq && 32 * u < hd) {  // warp-uniform
                long long blk = (long long)rh * (hd / 32) + u;
                q8_block<1>(&r, l, xq + 32 * blk, xds + blk);
            }
        }
    }
}

// ATT_STAMP (diagnostic knob, QUIRE_CUDA_DEFINES=ATT_STAMP=1; off, none of
// it compiles): thread 0 of each CTA of KV head 0 reads clock64 at the
// kernel's phases (entry, the programmatic wait done, the queries staged,
// the tiles done, the partial written, the cluster barrier, the end) and
// the cycles the tile loop waited for its copies (tw), and prints the
// intervals, with %globaltimer at entry, for rows at positions
// that are multiples of 64 (the combine kernels: their wait and work in
// ns): where a decode step's attention spends its time inside the captured
// graph (docs/PERF.md, 2026-11-27 late night).
#ifndef ATT_STAMP
#define ATT_STAMP 0
#endif

// The K and V maps of the bulk tensor copies the pipelined split kernels
// may take (attention_pipe_fast.cu says how; the tensor-core row form,
// attention_rmma_fast.cu, takes the same arguments and never reads them).
struct AttMaps {
    TmaMap k, v;
};
// The pipelined split kernels' arguments (attention_pipe_fast.cu), which
// the tensor-core row form's entries (attention_rmma_fast.cu) take too,
// followed by the output, so the host launches both alike.
#define ATT_PIPE_ARGS                                                                          \
    const float *__restrict__ q, int n_heads, int n_kv_heads, int head_dim, int block_size,    \
        float scale, const u16 *__restrict__ kc, const u16 *__restrict__ vc,                   \
        const u32 *__restrict__ tables, const u32 *__restrict__ table_off,                     \
        const u32 *__restrict__ row_seq, const u32 *__restrict__ positions, int stride,        \
        int n_parts, float *__restrict__ part, int early,                                      \
        const __grid_constant__ AttMaps maps, int tma
