// The hybrid (Gated DeltaNet, qwen35) ops: one canonical kernel per op,
// the arithmetic of src/backend/cpu/ops/gdn.rs operation for operation
// (common.cuh's explicitly rounded q_* intrinsics, no FMA), so every mode
// is bitwise equal to the cpu backend, batch-invariant and run-to-run
// deterministic by construction.
//
// Reductions over a head are canon::dot32 on a warp: lane l adds the
// terms l, l + 32, ... in order from 0.0f (lanes past the end add nothing:
// adding a 0.0f would turn a -0.0f sum into +0.0f), then q_warp_tree32,
// the result in lane 0 (broadcast where every lane needs it).
//
// State slots: `row_slots` (n,) names each row's slot; a slot's rows are
// consecutive and in position order (a "run"), which the host checks for
// host buffers and the executor guarantees for device ones. A row whose
// slot is >= n_slots reads as NaN (its outputs are NaN) and writes no
// state, so no slot value can reach outside the state array. A slot that
// comes back after another slot's rows breaks the run invariant: its
// results are then unspecified (still within the buffers).

// f32 constants of gdn.rs's ln_ge1 (QC_* bit patterns from the prelude,
// computed from the same Rust expressions).
#define GDN_SOFTPLUS_THRESHOLD 20.0f

// gdn::ln_ge1: ln u for finite u >= 1 from plain IEEE operations.
__device__ __forceinline__ float gdn_ln_ge1(float u) {
    const u32 bits = __float_as_uint(u);
    int e = (int)((bits >> 23) & 0xffu) - 127;
    float m = __uint_as_float((bits & 0x007fffffu) | 0x3f800000u);
    if (m > QF(QC_SQRT_2)) {
        m = q_mul(m, 0.5f);
        e += 1;
    }
    const float s = q_div(q_sub(m, 1.0f), q_add(m, 1.0f));
    const float s2 = q_mul(s, s);
    float p = QF(QC_INV_11);
    p = q_add(q_mul(p, s2), QF(QC_INV_9));
    p = q_add(q_mul(p, s2), QF(QC_INV_7));
    p = q_add(q_mul(p, s2), QF(QC_INV_5));
    p = q_add(q_mul(p, s2), QF(QC_INV_3));
    p = q_add(q_mul(p, s2), 1.0f);
    const float ln_m = q_mul(q_mul(2.0f, s), p);
    const float ef = (float)e;  // exact: |e| < 2^8
    return q_add(q_mul(ef, QF(QC_LN2_HI)), q_add(q_mul(ef, QF(QC_LN2_LO)), ln_m));
}

// gdn::softplus: x above the threshold (and NaN) passes through; else
// ln(1 + e^x) with the log1p correction.
__device__ __forceinline__ float gdn_softplus(float x) {
    if (q_isnan(x) || x > GDN_SOFTPLUS_THRESHOLD) return x;
    const float e = q_exp(x);
    const float u = q_add(1.0f, e);
    if (u == 1.0f) return e;
    return q_mul(gdn_ln_ge1(u), q_div(e, q_sub(u, 1.0f)));
}

// gdn::sigmoid: 1 / (1 + exp(-x)) with the canonical exp.
__device__ __forceinline__ float gdn_sigmoid(float x) {
    return q_div(1.0f, q_add(1.0f, q_exp(-x)));
}

// canon::dot32 of x with itself over `len` values, on a warp: the total
// in every lane.
__device__ __forceinline__ float gdn_warp_sumsq(const float* __restrict__ x, int len) {
    const int lane = threadIdx.x & 31;
    float acc = 0.0f;
    for (int i = lane; i < len; i += 32) acc = q_add(acc, q_mul(x[i], x[i]));
    return __shfl_sync(0xffffffffu, q_warp_tree32(acc), 0);
}

// ---- slot runs ----

// How many rows directly before row r belong to r's run, at most `cap`:
// min(r's index in its run, cap).
__device__ __forceinline__ int gdn_run_back(const u32* __restrict__ row_slots, int r, int cap) {
    const u32 s = row_slots[r];
    int t = 0;
    while (t < cap && r - t > 0 && row_slots[r - t - 1] == s) t++;
    return t;
}

__device__ __forceinline__ bool gdn_run_first(const u32* __restrict__ row_slots, int r) {
    return r == 0 || row_slots[r - 1] != row_slots[r];
}

__device__ __forceinline__ bool gdn_run_last(const u32* __restrict__ row_slots, int r, int n) {
    return r + 1 >= n || row_slots[r + 1] != row_slots[r];
}

#define GDN_NAN __int_as_float(0x7fc00000)

// ---- state gather / scatter (the unfused paths) ----

// scratch (n, len): each row that starts a run gets a copy of its slot's
// state (the rows after it in the run are never read). One thread per
// element; rows of an out-of-range slot are left alone (their compute
// kernel gives NaN without reading them).
extern "C" __global__ void gdn_state_gather(const float* __restrict__ state, int n_slots,
                                            long long len, const u32* __restrict__ row_slots,
                                            int n, float* __restrict__ scratch) {
    GRID_DEP();
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (long long)n * len) return;
    const int r = (int)(idx / len);
    const long long e = idx - (long long)r * len;
    const u32 slot = row_slots[r];
    if (!gdn_run_first(row_slots, r) || slot >= (u32)n_slots) return;
    scratch[idx] = state[(long long)slot * len + e];
}

// state[slot] = scratch (n, len)[r] for every row r that ends a run (its
// slot's final state); one thread per element of scratch.
extern "C" __global__ void gdn_state_scatter(const float* __restrict__ scratch, long long len,
                                             const u32* __restrict__ row_slots, int n,
                                             float* __restrict__ state, int n_slots) {
    GRID_DEP();
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (long long)n * len) return;
    const int r = (int)(idx / len);
    const long long e = idx - (long long)r * len;
    const u32 slot = row_slots[r];
    if (!gdn_run_last(row_slots, r, n) || slot >= (u32)n_slots) return;
    state[(long long)slot * len + e] = scratch[idx];
}

// ---- conv1d_silu ----
//
// Per channel c, the stream of raw inputs of a slot is [its old state
// (K-1 values, element (tau, c) at c (K-1) + tau, tau = 0 the oldest),
// then the x rows of its run]; row r's window is the K stream values
// ending at r; out = silu(sum_i w[c][i] * window[i]) summed for i
// increasing from 0.0f; the new state is the run's last K-1 stream values.

#define GDN_CONV_CH 32  // channels per CTA: one per lane
#define GDN_CONV_RL 8   // row lanes per CTA: one per warp

// conv1d_silu in one launch, the state updated in place (the conv's tap
// folded in: no concatenation buffer). CTA = 32 channels x 8 row lanes;
// each CTA owns its channels' outputs and states over every row and
// slot, so CTAs are independent. Phase 1: each thread computes rows
// ry, ry + 8, ... of its channel, reading a window value from x (a row of
// the same run) or from the slot's old state. Phase 2, after the barrier
// (every read of an old state is done): for each row that ends a run, the
// one thread of that (row, channel) writes the slot's K-1 new values, tau
// increasing; new[tau] is stream value L + tau (L the run's length),
// which for L < K-1 is old state value L + tau > tau, not yet overwritten.
// No other thread touches that (slot, channel) in phase 2.
extern "C" __global__ void __launch_bounds__(GDN_CONV_CH * GDN_CONV_RL)
    gdn_conv_fused(const float* __restrict__ x, const float* __restrict__ w, int channels,
                   int kernel, const u32* __restrict__ row_slots, int n,
                   float* __restrict__ state, int n_slots, float* __restrict__ out) {
    GRID_DEP();
    const int c = blockIdx.x * GDN_CONV_CH + (threadIdx.x & 31);
    const int ry = threadIdx.x >> 5;
    const int ks = kernel - 1;
    const bool live = c < channels;
    if (live) {
        const float* wc = w + (long long)c * kernel;
        for (int r = ry; r < n; r += GDN_CONV_RL) {
            const u32 slot = row_slots[r];
            float v = GDN_NAN;
            if (slot < (u32)n_slots) {
                // t: r's index in its run, exact wherever the state is read
                // (a window value `back` rows before r with back > t).
                const int t = gdn_run_back(row_slots, r, ks);
                const float* st = state + (long long)slot * ks * channels + (long long)c * ks;
                float acc = 0.0f;
                for (int i = 0; i < kernel; i++) {
                    const int back = ks - i;
                    const float xv =
                        back <= t ? x[(long long)(r - back) * channels + c] : st[t + i];
                    acc = q_add(acc, q_mul(wc[i], xv));
                }
                v = q_silu(acc);
            }
            out[(long long)r * channels + c] = v;
        }
    }
    __syncthreads();
    if (!live) return;
    for (int r = ry; r < n; r += GDN_CONV_RL) {
        const u32 slot = row_slots[r];
        if (!gdn_run_last(row_slots, r, n) || slot >= (u32)n_slots) continue;
        // t = min(L - 1, K - 1), exact wherever the old state is read.
        const int t = gdn_run_back(row_slots, r, ks);
        float* st = state + (long long)slot * ks * channels + (long long)c * ks;
        for (int tau = 0; tau < ks; tau++) {
            const int back = ks - 1 - tau;
            st[tau] = back <= t ? x[(long long)(r - back) * channels + c] : st[t + 1 + tau];
        }
    }
}

// Unfused conv, step 2 of 4 (after gdn_state_gather): the unfolded tap,
// win (n, channels, K) = each row's window, its old-state values read from
// the gathered copy at the run's first row. One thread per (row, channel).
extern "C" __global__ void gdn_conv_window(const float* __restrict__ x, int channels, int kernel,
                                           const u32* __restrict__ row_slots, int n,
                                           const float* __restrict__ gathered, int n_slots,
                                           float* __restrict__ win) {
    GRID_DEP();
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (long long)n * channels) return;
    const int r = (int)(idx / channels);
    const int c = (int)(idx - (long long)r * channels);
    const int ks = kernel - 1;
    float* wr = win + idx * kernel;
    if (row_slots[r] >= (u32)n_slots) {
        for (int i = 0; i < kernel; i++) wr[i] = GDN_NAN;
        return;
    }
    const int t = gdn_run_back(row_slots, r, ks);
    // The run's first row (exact where read: t < back <= K - 1).
    const float* st = gathered + (long long)(r - t) * ks * channels + (long long)c * ks;
    for (int i = 0; i < kernel; i++) {
        const int back = ks - i;
        wr[i] = back <= t ? x[(long long)(r - back) * channels + c] : st[t + i];
    }
}

// Unfused conv, step 3 of 4: out = silu(sum_i w[c][i] * win[r][c][i]); a
// row that ends a run writes its slot's new state (its window's last K-1
// values) into scratch row r, out of place (gdn_state_scatter then copies
// it to the slot). One thread per (row, channel).
extern "C" __global__ void gdn_conv_unfolded(const float* __restrict__ win,
                                             const float* __restrict__ w, int channels,
                                             int kernel, const u32* __restrict__ row_slots,
                                             int n, int n_slots, float* __restrict__ out,
                                             float* __restrict__ scratch) {
    GRID_DEP();
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (long long)n * channels) return;
    const int r = (int)(idx / channels);
    const int c = (int)(idx - (long long)r * channels);
    const int ks = kernel - 1;
    const float* wr = win + idx * kernel;
    const float* wc = w + (long long)c * kernel;
    const u32 slot = row_slots[r];
    if (slot >= (u32)n_slots) {
        out[idx] = GDN_NAN;
        return;
    }
    float acc = 0.0f;
    for (int i = 0; i < kernel; i++) acc = q_add(acc, q_mul(wc[i], wr[i]));
    out[idx] = q_silu(acc);
    if (gdn_run_last(row_slots, r, n)) {
        float* st = scratch + (long long)r * ks * channels + (long long)c * ks;
        for (int tau = 0; tau < ks; tau++) st[tau] = wr[1 + tau];
    }
}

// ---- delta_rule ----
//
// One warp per (run, value head h, value column j): lane l holds S[i][j]
// for i = l, l + 32, ... (R registers, d_k <= 32 R) and applies gdn.rs's
// recurrent step for each row of the run in order:
//   S = S * decay; kv = dot32_i(S k); d = beta (v_j - kv);
//   S = S + k d; out_j = dot32_i(S qs), qs = q * rsqrt(d_k).
// A column's update reads only that column, so warps are independent.
// Blocks: GDN_DR_WARPS columns of one (row lane y, head); blockIdx.x = (y *
// h_v + h) * ceil(d_v / GDN_DR_WARPS) + column group, y < ry (the host's
// min(n, 64)). Lane y's warps take the runs that start in its share of the
// rows, [y n / ry, (y + 1) n / ry): a decode step (every row its own run,
// n <= ry) gets a warp per row, runs of a batched prefill spread over the
// lanes, and a long run does not launch a CTA per row that would find
// nothing to do.

#define GDN_DR_WARPS 4

struct GdnDelta {
    const float* qkv;  // (n, 2 h_k d_k + h_v d_v) = [q | k | v]
    const float* g;    // (n, h_v)
    const float* beta; // (n, h_v)
    const u32* row_slots;
    float* out;  // (n, h_v d_v)
    int n, h_k, h_v, d_k, d_v;
    int ry;  // row lanes (grid rows)
};

// The warp's (row lane, head, column); false: past the shape.
__device__ __forceinline__ bool gdn_delta_unit(const GdnDelta& D, int* y, int* h, int* j) {
    const int groups = (D.d_v + GDN_DR_WARPS - 1) / GDN_DR_WARPS;
    const long long b = blockIdx.x;
    *j = (int)(b % groups) * GDN_DR_WARPS + (threadIdx.x >> 5);
    *h = (int)((b / groups) % D.h_v);
    *y = (int)(b / groups / D.h_v);
    return *y < D.ry && *j < D.d_v;
}

// One row's inputs of the recurrence for this lane: k and q * scale at
// i = lane + 32 u, v_j, the decay and beta.
template <int R>
struct GdnRowIn {
    float kr[R], qs[R];
    float vj, decay, b;
};

template <int R>
__device__ __forceinline__ void gdn_delta_load(const GdnDelta& D, int r, int h, int j,
                                               GdnRowIn<R>* in) {
    const int lane = threadIdx.x & 31;
    const int kh = h % D.h_k;
    const long long width = 2LL * D.h_k * D.d_k + (long long)D.h_v * D.d_v;
    const float scale = q_rsqrt((float)D.d_k);
    const float* row = D.qkv + (long long)r * width;
    const float* q = row + (long long)kh * D.d_k;
    const float* k = row + (long long)(D.h_k + kh) * D.d_k;
    in->vj = row[2LL * D.h_k * D.d_k + (long long)h * D.d_v + j];
    in->decay = q_exp(D.g[(long long)r * D.h_v + h]);
    in->b = D.beta[(long long)r * D.h_v + h];
#pragma unroll
    for (int u = 0; u < R; u++) {
        const int i = lane + 32 * u;
        in->kr[u] = i < D.d_k ? k[i] : 0.0f;
        in->qs[u] = i < D.d_k ? q_mul(q[i], scale) : 0.0f;
    }
}

// The rows of r0's run for column j of head h, S in s; returns the run's
// last row. Writes out[r][h][j] from lane 0.
// The next row's inputs are loaded before this row's arithmetic (they do
// not depend on the state), so a long run is not one load latency per row.
// (Three rows ahead was slower on an H200: the registers cost occupancy.)
template <int R>
__device__ __forceinline__ int gdn_delta_rows(const GdnDelta& D, int r0, int h, int j, float* s) {
    const int lane = threadIdx.x & 31;
    const u32 slot = D.row_slots[r0];
    int end = r0 + 1;
    while (end < D.n && D.row_slots[end] == slot) end++;
    GdnRowIn<R> cur, nxt;
    gdn_delta_load<R>(D, r0, h, j, &cur);
    for (int r = r0; r < end; r++) {
        if (r + 1 < end) gdn_delta_load<R>(D, r + 1, h, j, &nxt);
        float acc = 0.0f;
#pragma unroll
        for (int u = 0; u < R; u++) {
            if (lane + 32 * u < D.d_k) {
                s[u] = q_mul(s[u], cur.decay);
                acc = q_add(acc, q_mul(s[u], cur.kr[u]));
            }
        }
        const float kv = __shfl_sync(0xffffffffu, q_warp_tree32(acc), 0);
        const float d = q_mul(cur.b, q_sub(cur.vj, kv));
        float acc2 = 0.0f;
#pragma unroll
        for (int u = 0; u < R; u++) {
            if (lane + 32 * u < D.d_k) {
                s[u] = q_add(s[u], q_mul(cur.kr[u], d));
                acc2 = q_add(acc2, q_mul(s[u], cur.qs[u]));
            }
        }
        const float o = q_warp_tree32(acc2);
        if (lane == 0) D.out[((long long)r * D.h_v + h) * D.d_v + j] = o;
        cur = nxt;
    }
    return end - 1;
}

// Outputs of r0's run for column j of head h as NaN (an out-of-range slot).
__device__ __forceinline__ void gdn_delta_nan(const GdnDelta& D, int r0, int h, int j) {
    const u32 slot = D.row_slots[r0];
    if ((threadIdx.x & 31) != 0) return;
    for (int r = r0; r < D.n && D.row_slots[r] == slot; r++)
        D.out[((long long)r * D.h_v + h) * D.d_v + j] = GDN_NAN;
}

// The fused form: the column of S read from state[slot] into registers,
// the run applied, the column written back in place (only this warp
// touches it).
template <int R>
__device__ __forceinline__ void gdn_delta_fused(const GdnDelta& D, float* __restrict__ state,
                                                int n_slots) {
    int y, h, j;
    if (!gdn_delta_unit(D, &y, &h, &j)) return;
    const int lo = (int)((long long)y * D.n / D.ry), hi = (int)((long long)(y + 1) * D.n / D.ry);
    for (int r0 = lo; r0 < hi; r0++) {
        if (!gdn_run_first(D.row_slots, r0)) continue;
        const u32 slot = D.row_slots[r0];
        if (slot >= (u32)n_slots) {
            gdn_delta_nan(D, r0, h, j);
            continue;
        }
        const int lane = threadIdx.x & 31;
        const long long len = (long long)D.h_v * D.d_k * D.d_v;
        float* col = state + slot * len + ((long long)h * D.d_v + j) * D.d_k;
        float s[R];
#pragma unroll
        for (int u = 0; u < R; u++)
            if (lane + 32 * u < D.d_k) s[u] = col[lane + 32 * u];
        gdn_delta_rows<R>(D, r0, h, j, s);
#pragma unroll
        for (int u = 0; u < R; u++)
            if (lane + 32 * u < D.d_k) col[lane + 32 * u] = s[u];
    }
}

// The unfused form (between gdn_state_gather and gdn_state_scatter): the
// column read from scratch (n, len) at the run's first row, the final
// column written to scratch at its last row (out of place; the same
// warp's column when the run has one row).
template <int R>
__device__ __forceinline__ void gdn_delta_scratch(const GdnDelta& D, float* __restrict__ scratch,
                                                  int n_slots) {
    int y, h, j;
    if (!gdn_delta_unit(D, &y, &h, &j)) return;
    const int lo = (int)((long long)y * D.n / D.ry), hi = (int)((long long)(y + 1) * D.n / D.ry);
    for (int r0 = lo; r0 < hi; r0++) {
        if (!gdn_run_first(D.row_slots, r0)) continue;
        if (D.row_slots[r0] >= (u32)n_slots) {
            gdn_delta_nan(D, r0, h, j);
            continue;
        }
        const int lane = threadIdx.x & 31;
        const long long len = (long long)D.h_v * D.d_k * D.d_v;
        const long long at = ((long long)h * D.d_v + j) * D.d_k;
        const float* col = scratch + r0 * len + at;
        float s[R];
#pragma unroll
        for (int u = 0; u < R; u++)
            if (lane + 32 * u < D.d_k) s[u] = col[lane + 32 * u];
        const int last = gdn_delta_rows<R>(D, r0, h, j, s);
        float* fin = scratch + last * len + at;
#pragma unroll
        for (int u = 0; u < R; u++)
            if (lane + 32 * u < D.d_k) fin[lane + 32 * u] = s[u];
    }
}

#define GDN_DELTA_PARAMS                                                                      \
    const float *__restrict__ qkv, const float *__restrict__ g, const float *__restrict__ beta, \
        int h_k, int h_v, int d_k, int d_v, const u32 *__restrict__ row_slots, int n,         \
        float *__restrict__ st, int n_slots, float *__restrict__ out, int ry
#define GDN_DELTA_ARGS {qkv, g, beta, row_slots, out, n, h_k, h_v, d_k, d_v, ry}

// st: the state array (n_slots, h_v d_k d_v), updated in place.
extern "C" __global__ void __launch_bounds__(32 * GDN_DR_WARPS)
    gdn_delta_fused4(GDN_DELTA_PARAMS) {
    GRID_DEP();
    const GdnDelta D = GDN_DELTA_ARGS;
    gdn_delta_fused<4>(D, st, n_slots);
}
extern "C" __global__ void __launch_bounds__(32 * GDN_DR_WARPS)
    gdn_delta_fused8(GDN_DELTA_PARAMS) {
    GRID_DEP();
    const GdnDelta D = GDN_DELTA_ARGS;
    gdn_delta_fused<8>(D, st, n_slots);
}
// st: the gathered scratch (n, h_v d_k d_v).
extern "C" __global__ void __launch_bounds__(32 * GDN_DR_WARPS)
    gdn_delta_scratch4(GDN_DELTA_PARAMS) {
    GRID_DEP();
    const GdnDelta D = GDN_DELTA_ARGS;
    gdn_delta_scratch<4>(D, st, n_slots);
}
extern "C" __global__ void __launch_bounds__(32 * GDN_DR_WARPS)
    gdn_delta_scratch8(GDN_DELTA_PARAMS) {
    GRID_DEP();
    const GdnDelta D = GDN_DELTA_ARGS;
    gdn_delta_scratch<8>(D, st, n_slots);
}

// ---- the stateless ops ----

#define GDN_ROW_WARPS 8  // warps per CTA of the warp-per-(row, head) kernels

// l2_norm_heads in place: x (n_rows, row_len), heads 0..n_heads of
// head_dim at the start of each row; v *= 1 / max(sqrt(dot32(v, v)), eps)
// with `n < eps` false for NaN (a NaN norm is kept). A warp per (row, head).
extern "C" __global__ void __launch_bounds__(32 * GDN_ROW_WARPS)
    gdn_l2_norm(float* __restrict__ x, int n_rows, int row_len, int n_heads, int head_dim,
                float eps) {
    GRID_DEP();
    const long long wid = (long long)blockIdx.x * GDN_ROW_WARPS + (threadIdx.x >> 5);
    if (wid >= (long long)n_rows * n_heads) return;
    const long long r = wid / n_heads;
    const int h = (int)(wid - r * n_heads);
    float* v = x + r * row_len + (long long)h * head_dim;
    const float ss = gdn_warp_sumsq(v, head_dim);
    const float nrm = __fsqrt_rn(ss);
    const float scale = q_div(1.0f, nrm < eps ? eps : nrm);
    for (int i = threadIdx.x & 31; i < head_dim; i += 32) v[i] = q_mul(v[i], scale);
}

// gated_rms_norm: x, z, out (n_rows, head_dim) (rows are (token, head)),
// w (head_dim,); scale = rsqrt(dot32(x, x) / head_dim + eps);
// out = ((x * scale) * w) * silu(z). A warp per row.
extern "C" __global__ void __launch_bounds__(32 * GDN_ROW_WARPS)
    gdn_gated_rms_norm(const float* __restrict__ x, const float* __restrict__ z,
                       const float* __restrict__ w, long long n_rows, int head_dim, float eps,
                       float* __restrict__ out) {
    GRID_DEP();
    const long long r = (long long)blockIdx.x * GDN_ROW_WARPS + (threadIdx.x >> 5);
    if (r >= n_rows) return;
    const long long o = r * head_dim;
    const float ss = gdn_warp_sumsq(x + o, head_dim);
    const float scale = q_rsqrt(q_add(q_div(ss, (float)head_dim), eps));
    for (int i = threadIdx.x & 31; i < head_dim; i += 32)
        out[o + i] = q_mul(q_mul(q_mul(x[o + i], scale), w[i]), q_silu(z[o + i]));
}

// gdn_gates: a, b, g, beta (len / h_v, h_v); dt_bias, ssm_a (h_v,);
// g = softplus(a + dt_bias) * ssm_a, beta = sigmoid(b). A thread each.
extern "C" __global__ void gdn_gates(const float* __restrict__ a, const float* __restrict__ b,
                                     const float* __restrict__ dt_bias,
                                     const float* __restrict__ ssm_a, long long len, int h_v,
                                     float* __restrict__ g, float* __restrict__ beta) {
    GRID_DEP();
    const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= len) return;
    const int h = (int)(t % h_v);
    g[t] = q_mul(gdn_softplus(q_add(a[t], dt_bias[h])), ssm_a[h]);
    beta[t] = gdn_sigmoid(b[t]);
}

// split_heads: x (rows, 2 head_dim) -> a, b (rows, head_dim) (len = rows
// head_dim values each), the first and second half of each head. A thread
// per value of a.
extern "C" __global__ void gdn_split_heads(const float* __restrict__ x, long long len,
                                           int head_dim, float* __restrict__ a,
                                           float* __restrict__ b) {
    GRID_DEP();
    const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= len) return;
    const long long r = t / head_dim;
    const long long src = t + r * head_dim;  // r * 2 head_dim + (t - r head_dim)
    a[t] = x[src];
    b[t] = x[src + head_dim];
}

// sigmoid_mul: x *= sigmoid(gate), elementwise.
extern "C" __global__ void gdn_sigmoid_mul(float* __restrict__ x,
                                           const float* __restrict__ gate, long long len) {
    GRID_DEP();
    const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= len) return;
    x[t] = q_mul(x[t], gdn_sigmoid(gate[t]));
}
