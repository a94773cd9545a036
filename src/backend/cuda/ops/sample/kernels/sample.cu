// Token choice on the device, sampler.rs and sampler/draw.rs operation for
// operation: the host and the device pick the same token from the same
// logits (and, when sampling, the same uniform).
//
// Per row a draw record of DRAW_WORDS u32 (params): temperature (f32
// bits), top_k, top_p (f32 bits), min_p (f32 bits), the step's uniform u
// (f64: low word, high word), and whether mask_rows masked the row (which
// sample_rows does not read). Temperature 0: the greedy rule, the first maximum in id
// order (ties go to the lowest id; -0.0 and +0.0 compare equal). Otherwise
// draw.rs's draw: weights det_exp((l - max) * (1 / T)) in IEEE double operations
// (__d*_rn: never contracted), summed in id order over chunks of
// SAMPLE_CHUNK ids (no top-k, top_p = 1) or over the top-k candidates in
// descending order (found by a radix select on the candidate key, then
// sorted). Top-p without a top-k cut (the nucleus) takes its reference
// mass in id order by chunks, then walks the candidates in descending
// order a batch of SAMPLE_KMAX at a time (each batch the SAMPLE_KMAX
// smallest keys above the previous batch's last, by the same select)
// until the cut; a pick in an earlier batch selects that batch again.
// Which thread scans which ids changes no result: the maximum, the counts
// and the candidate sets are order-free, and every floating sum runs in
// draw.rs's order in one thread.
//
// status: 0 ok; 1 a NaN or +inf logit (the sampler's error); 2 every logit
// -inf at temperature > 0 (the sampler's error); 3 more than SAMPLE_KMAX
// top-k candidates, or an id-order / nucleus row past SAMPLE_MAX_CHUNKS
// chunks (the host draws such rows: ops/sample).
// A cluster of CTAs per row (grid (csize, n); on sm_90, csize up to 8,
// else 1): CTA rank r reads the r-th run of whole chunks of the row; the
// maximum, counts, chunk sums, histograms and candidates meet through
// distributed shared memory, and rank 0 draws. Each CTA: SAMPLE_THREADS.
// logits: (n, vocab) f32; params: (n, 6) u32; tokens, status: (n,) u32.
// ring (may be null): page-locked host memory mapped for the device,
// nslots slots of (tokens (cap), status (cap)); the step's tokens and
// statuses also go to slot steps[0] % nslots (the step's first row's
// position: consecutive steps take consecutive slots, and the host,
// knowing the position, reads the slot once the step has completed).
// steps (with the ring; a decode graph's step words, DevAttnBatch::
// step_words): (4n + 1,) u32, n positions, n slots, n tokens, n statuses,
// a ticket (zero at launch). With the ring the kernel also advances every
// row's position and slot by one, the next chained step's inputs unless
// the host copies others (a step into a new KV block): each row's rank 0
// takes a ticket after reading steps[0], and the last to take one does
// the n increments and zeroes the ticket, so no CTA reads steps[0] after
// it changed. The increments do not depend on the order of the tickets.
// 512 threads: 128 registers each, room for the 16 weights in flight
// of the chunk sums without spilling.
#define SAMPLE_THREADS 512
#define DRAW_WORDS 7
#define SAMPLE_KMAX 1024
#define SAMPLE_CHUNK 256
#define SAMPLE_MAX_CHUNKS 1024
// Nucleus batches: the first NUC_FIRST candidates, then SAMPLE_KMAX at a
// time; at most NUC_MAXB batches over SAMPLE_MAX_CHUNKS chunks.
#define NUC_FIRST 64
#define NUC_MAXB ((SAMPLE_MAX_CHUNKS * SAMPLE_CHUNK - NUC_FIRST) / SAMPLE_KMAX + 2)

// (v, i) replaces (bv, bi) when it comes first in the order: larger value,
// then lower id. A NaN v never does (the comparisons are false).
__device__ __forceinline__ void argmax_take(float& bv, int& bi, float v, int i) {
    if (v > bv || (v == bv && i < bi)) {
        bv = v;
        bi = i;
    }
}

// draw.rs's det_exp: the same constants (bit patterns) and operations.
__device__ __forceinline__ double det_exp(double x) {
    // Branch-free (so the 16 weights of a chunk round interleave): the
    // polynomial of max(x, -708), then 0 where x < -708 (draw.rs returns
    // 0 there first; elsewhere the same operations on x itself).
    const bool live = x >= -708.0;
    x = fmax(x, -708.0);
    // Horner over 1 / i! for i = 10 down to 0, written out (an array of
    // the constants would live in local memory).
    double k = round(__dmul_rn(x, __longlong_as_double(0x3FF71547652B82FEll)));
    double r = __dsub_rn(__dsub_rn(x, __dmul_rn(k, __longlong_as_double(0x3FE62E42FEE00000ll))),
                         __dmul_rn(k, __longlong_as_double(0x3DEA39EF35793C76ll)));
#define DEXP_STEP(bits) p = __dadd_rn(__dmul_rn(p, r), __longlong_as_double(bits))
    double p = __longlong_as_double(0x3E927E4FB7789F5Cll);
    DEXP_STEP(0x3EC71DE3A556C734ll);
    DEXP_STEP(0x3EFA01A01A01A01All);
    DEXP_STEP(0x3F2A01A01A01A01All);
    DEXP_STEP(0x3F56C16C16C16C17ll);
    DEXP_STEP(0x3F81111111111111ll);
    DEXP_STEP(0x3FA5555555555555ll);
    DEXP_STEP(0x3FC5555555555555ll);
    DEXP_STEP(0x3FE0000000000000ll);
    DEXP_STEP(0x3FF0000000000000ll);
    DEXP_STEP(0x3FF0000000000000ll);
#undef DEXP_STEP
    double e = __dmul_rn(p, __longlong_as_double((long long)(k + 1023.0) << 52));
    return live ? e : 0.0;
}

// it: 1 / temperature, one division a row (draw.rs's weight).
__device__ __forceinline__ double sample_weight(float l, double mx, double it) {
    return det_exp(__dmul_rn(__dsub_rn((double)l, mx), it));
}

// Adds one to bin b of the shared histogram h, one atomic per distinct
// bin in the warp (the lanes of a warp often share a bin: without this
// the first radix pass serializes on one address).
__device__ __forceinline__ void hist_add(unsigned* h, unsigned b, bool on) {
    unsigned act = __ballot_sync(0xffffffffu, on);
    if (!on) return;
    unsigned peers = __match_any_sync(act, b);
    if ((threadIdx.x & 31) == __ffs(peers) - 1) atomicAdd(&h[b], __popc(peers));
}

// The sampler's `x + 0.0`: -0.0 becomes +0.0.
__device__ __forceinline__ float pos_zero(float v) { return v == 0.0f ? 0.0f : v; }

// The high word of draw.rs's cand_key: ascending = value descending.
__device__ __forceinline__ unsigned desc_key(float v) {
    unsigned b = __float_as_uint(v);
    unsigned ord = (b >> 31) ? ~b : (b | 0x80000000u);
    return ~ord;
}

// Walks a[0..n) (shared memory) left to right, adding each to cum, eight
// loads ahead of the adds (the same additions in the same order as a plain
// loop): calls f(i, the sum through a[i]) and stops at the first i where
// it returns true, returning i with cum the sum before a[i]; -1 if none,
// with cum the whole sum.
template <class F>
__device__ __forceinline__ int seq_walk(const double* a, int n, double& cum, F f) {
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        double x[8];
#pragma unroll
        for (int j = 0; j < 8; j++) x[j] = a[i + j];
#pragma unroll
        for (int j = 0; j < 8; j++) {
            double nx = __dadd_rn(cum, x[j]);
            if (f(i + j, nx)) return i + j;
            cum = nx;
        }
    }
    for (; i < n; i++) {
        double nx = __dadd_rn(cum, a[i]);
        if (f(i, nx)) return i;
        cum = nx;
    }
    return -1;
}

// Left-to-right sum of a[0..n).
__device__ __forceinline__ double seq_sum(const double* a, int n) {
    double s = 0.0;
    seq_walk(a, n, s, [](int, double) { return false; });
    return s;
}

// The first i in [0, n) whose running sum cum + a[0] + ... + a[i]
// satisfies stop (seq_walk's result and cum).
template <class P>
__device__ __forceinline__ int seq_find(const double* a, int n, double& cum, P stop) {
    return seq_walk(a, n, cum, [&](int, double x) { return stop(x); });
}

// pre[i] = c + a[0] + ... + a[i] for i in [0, n), added left to right.
__device__ __forceinline__ void seq_prefix(const double* a, double* pre, int n, double c) {
    seq_walk(a, n, c, [&](int i, double x) {
        pre[i] = x;
        return false;
    });
}

// The least i in [0, n) with pred(i), or n; every thread of the block
// calls it and gets the answer (slot: a shared int of its own).
template <class P>
__device__ __forceinline__ int block_first(int n, P pred, int* slot) {
    if (threadIdx.x == 0) *slot = n;
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        if (pred(i)) {
            atomicMin(slot, i);
            break;
        }
    __syncthreads();
    int r = *slot;
    __syncthreads();
    return r;
}

// The greatest i in [0, n) with pred(i), or -1 (as block_first).
template <class P>
__device__ __forceinline__ int block_last(int n, P pred, int* slot) {
    if (threadIdx.x == 0) *slot = -1;
    __syncthreads();
    int best = -1;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        if (pred(i)) best = i;
    if (best >= 0) atomicMax(slot, best);
    __syncthreads();
    int r = *slot;
    __syncthreads();
    return r;
}

// Block-wide exclusive prefix sum of v (blockDim.x threads); tot gets the
// sum. Uses ws (blockDim.x / 32 u32 of shared memory).
__device__ __forceinline__ unsigned block_excl_scan(unsigned v, unsigned* ws, unsigned& tot) {
    int l = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    unsigned x = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        unsigned y = __shfl_up_sync(0xffffffffu, x, o);
        if (l >= o) x += y;
    }
    __syncthreads();
    if (l == 31) ws[w] = x;
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned s = 0;
        for (int i = 0; i < nw; i++) {
            unsigned t = ws[i];
            ws[i] = s;
            s += t;
        }
        ws[nw] = s;
    }
    __syncthreads();
    tot = ws[nw];
    return ws[w] + x - v;
}

// Calls f(v, e, live) for every id e of [lo, hi), whole warps per round
// (live is false past the end, where f must still run for its warp-wide
// intrinsics, with v = -inf); four loads in flight per lane, 16-byte ones
// when lo, hi and vocab are multiples of 4 (rows then start 16-byte
// aligned). The order of the calls is unspecified: f must be order-free
// (counts, maxima).
template <class F>
__device__ __forceinline__ void row_rounds(const float* __restrict__ row, int vocab, int lo,
                                           int hi, F f) {
    const int nt = blockDim.x, lane = threadIdx.x & 31, wb = threadIdx.x - lane;
    if ((vocab & 3) == 0 && (lo & 3) == 0 && (hi & 3) == 0) {
        const float4* r4 = (const float4*)row + lo / 4;
        const int n4 = (hi - lo) / 4;
        for (int b = wb; b < n4; b += 4 * nt) {
            float4 v[4];
#pragma unroll
            for (int j = 0; j < 4; j++) {
                int ix = b + j * nt + lane;
                v[j] = ix < n4 ? r4[ix] : make_float4(Q_NINF, Q_NINF, Q_NINF, Q_NINF);
            }
#pragma unroll
            for (int j = 0; j < 4; j++) {
                int ix = b + j * nt + lane, e = lo + 4 * ix;
                bool live = ix < n4;
                f(v[j].x, e, live);
                f(v[j].y, e + 1, live);
                f(v[j].z, e + 2, live);
                f(v[j].w, e + 3, live);
            }
        }
    } else {
        for (int b = lo + wb; b < hi; b += 4 * nt) {
            float v[4];
#pragma unroll
            for (int j = 0; j < 4; j++) {
                int ix = b + j * nt + lane;
                v[j] = ix < hi ? row[ix] : Q_NINF;
            }
#pragma unroll
            for (int j = 0; j < 4; j++) f(v[j], b + j * nt + lane, b + j * nt + lane < hi);
        }
    }
}

// Calls f(v, e) for the ids e of [lo, hi) in increasing order, four loads
// in flight, 16-byte ones when lo and hi are multiples of 4 and the row is
// 16-byte aligned (vocab % 4 == 0).
template <class F>
__device__ __forceinline__ void range_in_order(const float* __restrict__ row, int vocab, int lo,
                                               int hi, F f) {
    if ((vocab & 3) == 0 && (lo & 3) == 0 && (hi & 3) == 0) {
        const float4* r4 = (const float4*)row;
        for (int i = lo; i < hi; i += 16) {
            float4 v[4];
#pragma unroll
            for (int j = 0; j < 4; j++)
                v[j] = i + 4 * j < hi ? r4[(i >> 2) + j] : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
            for (int j = 0; j < 4; j++) {
                if (i + 4 * j >= hi) break;
                f(v[j].x, i + 4 * j);
                f(v[j].y, i + 4 * j + 1);
                f(v[j].z, i + 4 * j + 2);
                f(v[j].w, i + 4 * j + 3);
            }
        }
    } else {
        for (int i = lo; i < hi; i++) f(row[i], i);
    }
}

// The last index of a[0..n) holding a positive value, or -1.
__device__ __forceinline__ int last_positive(const double* a, int n) {
    for (int i = n - 1; i >= 0; i--)
        if (a[i] > 0.0) return i;
    return -1;
}

// csum[c - c0] = the sum of the weights w >= thr (others 0) of chunk c,
// for the chunks c of [c0, c1), each left to right (draw.rs's chunk
// sums), one thread a chunk, 16 weights at a time in flight (past the
// row's end a weight of +0.0, which leaves a non-negative sum unchanged).
__device__ __forceinline__ void chunk_sums(const float* __restrict__ row, int vocab, int c0, int c1,
                                           double mx, double t, double thr, double* csum) {
    const int tid = threadIdx.x, nt = blockDim.x;
    for (int c = c0 + tid; c < c1; c += nt) {
        double s = 0.0;
        int end = min(vocab, (c + 1) * SAMPLE_CHUNK);
        if ((vocab & 3) == 0) {
            const float4* r4 = (const float4*)row;
            for (int i = c * SAMPLE_CHUNK; i < end; i += 16) {
                float4 v[4];
#pragma unroll
                for (int j = 0; j < 4; j++)
                    v[j] = i + 4 * j < end ? r4[(i >> 2) + j]
                                           : make_float4(Q_NINF, Q_NINF, Q_NINF, Q_NINF);
                double w[16];
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    float q[4] = {v[j].x, v[j].y, v[j].z, v[j].w};
#pragma unroll
                    for (int h = 0; h < 4; h++) {
                        double x = sample_weight(pos_zero(q[h]), mx, t);
                        w[4 * j + h] = x >= thr ? x : 0.0;
                    }
                }
#pragma unroll
                for (int j = 0; j < 16; j++) s = __dadd_rn(s, w[j]);
            }
        } else {
            for (int i = c * SAMPLE_CHUNK; i < end; i += 8) {
                double w[8];
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    double x = i + j < end ? sample_weight(pos_zero(row[i + j]), mx, t) : 0.0;
                    w[j] = x >= thr ? x : 0.0;
                }
#pragma unroll
                for (int j = 0; j < 8; j++) s = __dadd_rn(s, w[j]);
            }
        }
        csum[c - c0] = s;
    }
}

__device__ __forceinline__ u32 smp_ld_u32(u32 a) {
    u32 v;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("ld.shared::cluster.u32 %0, [%1];" : "=r"(v) : "r"(a) : "memory");
#else
    asm volatile("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(a) : "memory");
#endif
    return v;
}
__device__ __forceinline__ double smp_ld_f64(u32 a) {
    double v;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("ld.shared::cluster.f64 %0, [%1];" : "=d"(v) : "r"(a) : "memory");
#else
    asm volatile("ld.shared.f64 %0, [%1];" : "=d"(v) : "r"(a) : "memory");
#endif
    return v;
}
__device__ __forceinline__ void smp_st_u64(u32 a, unsigned long long v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("st.shared::cluster.u64 [%0], %1;" ::"r"(a), "l"(v) : "memory");
#else
    asm volatile("st.shared.u64 [%0], %1;" ::"r"(a), "l"(v) : "memory");
#endif
}

// Rank 0 copies every CTA's chunk sums (csum, cper chunks per CTA) into
// call, in chunk order; the other ranks do nothing.
__device__ __forceinline__ void gather_chunk_sums(double* call, const double* csum, int nch,
                                                  int cper, int rank) {
    if (rank == 0)
        for (int c = threadIdx.x; c < nch; c += blockDim.x)
            call[c] = smp_ld_f64(cl_peer(&csum[c % cper], c / cper));
}

extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS)
    sample_rows(const float* __restrict__ logits, int vocab, const unsigned* __restrict__ params,
                unsigned* __restrict__ tokens, unsigned* __restrict__ status,
                unsigned* __restrict__ ring, unsigned* steps, int cap, int nslots) {
    GRID_DEP();
    __shared__ float sv[SAMPLE_THREADS / 32];
    __shared__ int si[SAMPLE_THREADS / 32];
    __shared__ int sbad[SAMPLE_THREADS / 32];
    __shared__ int sfin[SAMPLE_THREADS / 32];
    __shared__ unsigned ws[SAMPLE_THREADS / 32 + 1];
    __shared__ unsigned hist[256];
    __shared__ unsigned hsum[256];
    __shared__ unsigned long long cand[SAMPLE_KMAX];
    __shared__ double wsh[SAMPLE_KMAX];
    __shared__ double csum[SAMPLE_MAX_CHUNKS];
    __shared__ double call[SAMPLE_MAX_CHUNKS];
    __shared__ int s_res[4];
    __shared__ unsigned s_cnt[2];
    __shared__ double s_cum, s_target, s_need;
    // Nucleus batches: the running sum before batch j, and the key below
    // its first candidate (the previous batch's last).
    __shared__ double s_bcum[NUC_MAXB + 1];
    __shared__ unsigned long long s_bkey[NUC_MAXB];
    __shared__ unsigned long long s_ctl[2];
    __shared__ int s_blk;
    int rank;
    const int csize = cl_shape(&rank);
    const int ri = blockIdx.y;
    const float* row = logits + (long long)ri * vocab;
    const unsigned* pr = params + DRAW_WORDS * (long long)ri;
    const float temp = __uint_as_float(pr[0]);
    const unsigned top_k = pr[1];
    const float top_p = __uint_as_float(pr[2]);
    const float min_p = __uint_as_float(pr[3]);
    const double u = __hiloint2double((int)pr[5], (int)pr[4]);
    const int tid = threadIdx.x, nt = blockDim.x;
    // This CTA's run of the row: whole chunks (so 16-byte aligned).
    const int nch = (vocab + SAMPLE_CHUNK - 1) / SAMPLE_CHUNK;
    const int cper = (nch + csize - 1) / csize;
    const int c0 = min(nch, rank * cper), c1 = min(nch, c0 + cper);
    const int s0 = min(vocab, c0 * SAMPLE_CHUNK), s1 = min(vocab, c1 * SAMPLE_CHUNK);

    // Pass 1: the first maximum (-inf with an id past every real one: the
    // first real id of equal value replaces it; an all -inf row gives id
    // 0, as the sampler's greedy rule), bad values, the finite count.
    float bv = Q_NINF;
    int bi = 0x7fffffff;
    int bad = 0, fin = 0;
    row_rounds(row, vocab, s0, s1, [&](float v, int e, bool live) {
        if (!live) return;
        bad |= (v != v) | (v == Q_INF);
        fin += v != Q_NINF;
        argmax_take(bv, bi, v, e);
    });
#pragma unroll
    for (int o = 16; o >= 1; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        argmax_take(bv, bi, ov, oi);
        bad |= __shfl_xor_sync(0xffffffffu, bad, o);
        fin += __shfl_xor_sync(0xffffffffu, fin, o);
    }
    if ((tid & 31) == 0) {
        sv[tid >> 5] = bv;
        si[tid >> 5] = bi;
        sbad[tid >> 5] = bad;
        sfin[tid >> 5] = fin;
    }
    __syncthreads();
    if (tid == 0) {
        for (int k = 1; k < nt >> 5; k++) {
            argmax_take(bv, bi, sv[k], si[k]);
            bad |= sbad[k];
            fin += sfin[k];
        }
        sv[0] = bv;
        si[0] = bi;
        sbad[0] = bad;
        sfin[0] = fin;
    }
    cl_sync(csize);
    if (tid == 0) {
        // Every CTA combines every CTA's part (an order-free result).
        bv = Q_NINF;
        bi = 0x7fffffff;
        bad = 0;
        fin = 0;
        for (int r = 0; r < csize; r++) {
            float v = __uint_as_float(smp_ld_u32(cl_peer(&sv[0], r)));
            int i = (int)smp_ld_u32(cl_peer(&si[0], r));
            argmax_take(bv, bi, v, i);
            bad |= (int)smp_ld_u32(cl_peer(&sbad[0], r));
            fin += (int)smp_ld_u32(cl_peer(&sfin[0], r));
        }
        s_res[0] = bi;
        s_res[1] = bad ? 1 : (temp != 0.0f && fin == 0) ? 2 : 0;
        s_res[2] = fin;
        ws[0] = __float_as_uint(pos_zero(bv));
    }
    // Every peer read of sv..sfin done before any CTA moves on.
    cl_sync(csize);
    unsigned tok = (unsigned)s_res[0];
    int st = s_res[1];
    fin = s_res[2];
    const double mx = (double)__uint_as_float(ws[0]);
    const double t = __ddiv_rn(1.0, (double)temp), mp = (double)min_p;
    if (st == 0 && temp != 0.0f) {
        bool id_order = top_p >= 1.0f && (top_k == 0 || top_k >= (unsigned)fin);
        int K = (top_k > 0 && top_k < (unsigned)fin) ? (int)top_k : fin;
        // Nucleus: top-p without a top-k cut, drawn over batches of
        // SAMPLE_KMAX candidates in descending order until the cut.
        const bool nucleus = !id_order && K == fin;
        if ((id_order || nucleus) && nch > SAMPLE_MAX_CHUNKS) st = 3;
        if (!id_order && !nucleus && K > SAMPLE_KMAX) st = 3;
        if (st == 0 && id_order) {
            // Chunk sums of the kept weights (w >= min_p); rank 0 gathers
            // them in chunk order, then the peers leave. (The nucleus
            // gathers its own below: one shared call site measured 5 us
            // slower, 38.8 against 33.4 us at T 0.7 over 49,152 ids.)
            chunk_sums(row, vocab, c0, c1, mx, t, mp, csum);
            cl_sync(csize);
            gather_chunk_sums(call, csum, nch, cper, rank);
            cl_sync(csize);
            if (rank != 0) return;
            if (tid == 0) {
                double total = seq_sum(call, nch);
                double target = __dmul_rn(u, total), cum = 0.0;
                int fallback = 0;
                int ci = seq_find(call, nch, cum, [&](double x) { return target < x; });
                if (ci < 0) {
                    // u * total rounded up to the total: the last chunk of
                    // positive weight, its last positive token.
                    fallback = 1;
                    ci = last_positive(call, nch);
                }
                s_res[3] = ci;
                s_res[2] = fallback;
                s_cum = cum;
                s_target = target;
            }
            __syncthreads();
            int ci = s_res[3];
            int base = ci * SAMPLE_CHUNK, len = min(SAMPLE_CHUNK, vocab - base);
            if (tid < len) {
                double w = sample_weight(pos_zero(row[base + tid]), mx, t);
                wsh[tid] = w >= mp ? w : 0.0;
            }
            __syncthreads();
            if (tid == 0) {
                // draw.rs adds only the positive weights; adding a zero
                // leaves the running sum (>= 0) and the stop test as they
                // were, so the first stop is the same token.
                double cum = s_cum, target = s_target;
                int pick = s_res[2] ? -1 : seq_find(wsh, len, cum, [&](double x) {
                    return target < x;
                });
                if (pick < 0) pick = last_positive(wsh, len);
                s_res[0] = base + pick;
            }
        } else if (st == 0) {
            if (nucleus) {
                // draw.rs's nucleus mass: every weight, id order, by chunks
                // (no peer's csum is read again: rank 0's reads are done
                // before its first histogram's cluster barrier).
                chunk_sums(row, vocab, c0, c1, mx, t, 0.0, csum);
                cl_sync(csize);
                gather_chunk_sums(call, csum, nch, cper, rank);
                __syncthreads();
                if (rank == 0 && tid == 0) s_need = __dmul_rn((double)top_p, seq_sum(call, nch));
            }
            // The walk over the sorted candidates, in batches: the Kb
            // smallest keys above lo_key (0: below every key; keys of finite
            // logits are at least 2^55) land sorted in rank 0's cand, which
            // finds the cut and the pick. Top-k is one batch of K; the
            // nucleus takes NUC_FIRST, then SAMPLE_KMAX at a time, until the
            // cut (rank 0 writes what comes next into every CTA's s_ctl).
            const int ncand = nucleus ? fin : K;
            unsigned long long lo_key = 0;
            int batch = 0;
            // Rank 0 only (alike in its threads): the walk's state.
            double cum = 0.0, target = 0.0;
            unsigned long long lastpos = 0;
            bool picking = false;
            // Rank 0's running sums of a batch (call is free here: the
            // id-order path alone keeps it, and the nucleus mass is taken).
            double* pre = call;
            for (;;) {
                // The first nucleus batch is short (a peaked distribution's
                // nucleus fits it: a small sort), the later ones full.
                const int base = batch == 0 ? 0 : NUC_FIRST + (batch - 1) * SAMPLE_KMAX;
                const int Kb = !nucleus ? K
                               : min(batch == 0 ? NUC_FIRST : SAMPLE_KMAX, ncand - base);
                // Radix select: the Kb-th smallest high key T among the
                // finite logits above lo_key, 8 bits at a time from the
                // top; every CTA sums the cluster's histograms (in rank
                // order) and decides alike.
                unsigned prefix = 0, pmask = 0, rem = (unsigned)Kb;
                for (int pass = 0; pass < 4; pass++) {
                    int sh = 24 - 8 * pass;
                    for (int i = tid; i < 256; i += nt) hist[i] = 0;
                    __syncthreads();
                    // Whole warps per round (hist_add's ballot); -inf past
                    // the end, which hist_add skips like any -inf.
                    row_rounds(row, vocab, s0, s1, [&](float v, int e, bool) {
                        unsigned kh = desc_key(pos_zero(v));
                        bool above = (((unsigned long long)kh << 32) | (unsigned)e) > lo_key;
                        hist_add(hist, (kh >> sh) & 255u,
                                 v != Q_NINF && (kh & pmask) == prefix && above);
                    });
                    cl_sync(csize);
                    for (int i = tid; i < 256; i += nt) {
                        unsigned h = 0;
                        for (int r = 0; r < csize; r++) h += smp_ld_u32(cl_peer(&hist[i], r));
                        hsum[i] = h;
                    }
                    // Peers' histograms read before any CTA clears its own.
                    cl_sync(csize);
                    // The bin where the running count reaches rem (exactly
                    // one bin: 1 <= rem <= the matching count), by a block
                    // scan.
                    unsigned hb = tid < 256 ? hsum[tid] : 0u, htot;
                    unsigned before = block_excl_scan(hb, ws, htot);
                    if (tid < 256 && before < rem && rem <= before + hb) {
                        s_res[3] = tid;
                        s_res[2] = (int)(rem - before);
                    }
                    __syncthreads();
                    prefix |= (unsigned)s_res[3] << sh;
                    pmask |= 255u << sh;
                    rem = (unsigned)s_res[2];
                    __syncthreads();
                }
                // Every key above lo_key below T, and the rem lowest ids of
                // key T above it, in id order by contiguous ranges
                // (positions by prefix sums over the threads, then over
                // the cluster's CTAs in rank order), stored into rank 0's
                // candidates.
                int per = ((s1 - s0 + nt - 1) / nt + 3) & ~3;
                int lo = min(s1, s0 + tid * per), hi = min(s1, lo + per);
                unsigned nl = 0, ne = 0;
                range_in_order(row, vocab, lo, hi, [&](float v, int i) {
                    if (v == Q_NINF) return;
                    unsigned kh = desc_key(pos_zero(v));
                    if ((((unsigned long long)kh << 32) | (unsigned)i) <= lo_key) return;
                    nl += kh < prefix;
                    ne += kh == prefix;
                });
                unsigned tl, te;
                unsigned ol = block_excl_scan(nl, ws, tl);
                unsigned oe = block_excl_scan(ne, ws, te);
                if (tid == 0) {
                    s_cnt[0] = tl;
                    s_cnt[1] = te;
                }
                cl_sync(csize);
                unsigned lb = 0, eb = 0, ltot = 0;
                for (int r = 0; r < csize; r++) {
                    unsigned a = smp_ld_u32(cl_peer(&s_cnt[0], r));
                    unsigned b = smp_ld_u32(cl_peer(&s_cnt[1], r));
                    if (r < rank) {
                        lb += a;
                        eb += b;
                    }
                    ltot += a;
                }
                ol += lb;
                oe += eb;
                range_in_order(row, vocab, lo, hi, [&](float v, int i) {
                    if (v == Q_NINF) return;
                    unsigned kh = desc_key(pos_zero(v));
                    unsigned long long key = ((unsigned long long)kh << 32) | (unsigned)i;
                    if (key <= lo_key) return;
                    if (kh < prefix) {
                        smp_st_u64(cl_peer(&cand[ol++], 0), key);
                    } else if (kh == prefix) {
                        if (oe < rem) smp_st_u64(cl_peer(&cand[ltot + oe], 0), key);
                        oe++;
                    }
                });
                // Every candidate in rank 0 (and every count read) before
                // rank 0 sorts.
                cl_sync(csize);
                if (rank != 0 && !nucleus) return;
                if (rank == 0) {
                    // Bitonic sort of the Kb keys (padded with the largest
                    // key), their weights, then their running sums (pre,
                    // one thread: draw.rs's additions in its order; every
                    // cut and pick below is a block-wide search of them).
                    int P = 1;
                    while (P < Kb) P <<= 1;
                    for (int i = Kb + tid; i < P; i += nt) cand[i] = ~0ull;
                    __syncthreads();
                    for (int k = 2; k <= P; k <<= 1) {
                        for (int j = k >> 1; j > 0; j >>= 1) {
                            for (int i = tid; i < P; i += nt) {
                                int ij = i ^ j;
                                if (ij > i) {
                                    unsigned long long a = cand[i], b = cand[ij];
                                    bool up = (i & k) == 0;
                                    if ((a > b) == up) {
                                        cand[i] = b;
                                        cand[ij] = a;
                                    }
                                }
                            }
                            __syncthreads();
                        }
                    }
                    for (int i = tid; i < Kb; i += nt)
                        wsh[i] = sample_weight(pos_zero(row[(unsigned)cand[i]]), mx, t);
                    __syncthreads();
                    // The running sum before this batch: the walk's so far
                    // (0 at the first), or the reselected batch's.
                    if (tid == 0) seq_prefix(wsh, pre, Kb, picking ? s_bcum[batch] : cum);
                    __syncthreads();
                }
                unsigned long long next = 0;  // 0: done; else lo_key + 1
                int nbatch = 0;
                if (rank == 0) {
                    // Every thread of rank 0 decides alike (block-wide
                    // searches); thread 0 writes.
                    if (!picking) {
                        // The cut: draw.rs's min-p stop (w < min_p, tested
                        // first at an index) and top-p stop (running sum >=
                        // need: the nucleus mass's share, or top-k's own
                        // sum's; +inf without top-p).
                        if (tid == 0) {
                            s_bcum[batch] = cum;
                            s_bkey[batch] = lo_key;
                        }
                        if (batch == 0) lastpos = cand[0];
                        const double need = nucleus ? s_need
                                            : top_p < 1.0f ? __dmul_rn((double)top_p, pre[K - 1])
                                                           : (double)Q_INF;
                        const int mc = block_first(Kb, [&](int i) { return wsh[i] < mp; }, &s_blk);
                        const int pc = block_first(Kb, [&](int i) { return pre[i] >= need; }, &s_blk);
                        const bool stop = mc < Kb || pc < Kb;
                        const int keep = min(mc, pc + 1);  // Kb without a stop
                        const double total = keep > 0 ? pre[keep - 1] : cum;
                        const int lp = block_last(keep, [&](int i) { return wsh[i] > 0.0; }, &s_blk);
                        if (lp >= 0) lastpos = cand[lp];
                        if (!stop && base + Kb < ncand) {
                            cum = total;
                            next = cand[Kb - 1] + 1;
                            nbatch = batch + 1;
                        } else {
                            target = __dmul_rn(u, total);
                            // The first earlier batch whose running sum
                            // passes the target holds the pick.
                            const int pb = block_first(batch, [&](int jj) {
                                return target < s_bcum[jj + 1];
                            }, &s_blk);
                            if (pb == batch) {
                                int pick = block_first(keep, [&](int i) { return target < pre[i]; }, &s_blk);
                                if (tid == 0) s_res[0] = (int)(unsigned)(pick < keep ? cand[pick] : lastpos);
                            } else {
                                picking = true;
                                next = s_bkey[pb] + 1;
                                nbatch = pb;
                            }
                        }
                    } else {
                        // The reselected batch of the pick (found: its
                        // running sum passes the target).
                        int pick = block_first(Kb, [&](int i) { return target < pre[i]; }, &s_blk);
                        if (tid == 0) s_res[0] = (int)(unsigned)(pick < Kb ? cand[pick] : lastpos);
                    }
                    // Top-k's peers have left: one batch, nothing to tell.
                    if (!nucleus) break;
                    if (tid == 0)
                        for (int r = 0; r < csize; r++) {
                            smp_st_u64(cl_peer(&s_ctl[0], r), next);
                            smp_st_u64(cl_peer(&s_ctl[1], r), (unsigned long long)nbatch);
                        }
                }
                // s_ctl written in every CTA (rank 0 reads no peer's memory
                // after this, and no peer rank 0's).
                cl_sync(csize);
                if (s_ctl[0] == 0) break;
                lo_key = s_ctl[0] - 1;
                batch = (int)s_ctl[1];
            }
            if (rank != 0) return;
        }
        __syncthreads();
        tok = (unsigned)s_res[0];
    }
    if (rank == 0 && tid == 0) {
        if (st != 0) tok = 0;
        tokens[ri] = tok;
        status[ri] = (unsigned)st;
        if (ring) {
            unsigned* sl = ring + (long long)(steps[0] % (unsigned)nslots) * 2 * cap;
            sl[ri] = tok;
            sl[cap + ri] = (unsigned)st;
            const unsigned n = gridDim.y;
            // This CTA's read of steps[0] precedes its ticket.
            __threadfence();
            if (atomicAdd(&steps[4 * n], 1u) == n - 1) {
                __threadfence();
                for (unsigned r = 0; r < 2 * n; r++) steps[r] += 1u;
                atomicExch(&steps[4 * n], 0u);
            }
        }
    }
}

// A grammar's mask over the logits of the rows whose draw record says so
// (word 6 nonzero), in place, before sample_rows reads them: an id whose
// bit is clear in the row's words (masks: (n, mwords) u32, id i at bit
// i % 32 of word i / 32; ids past the words refused) gets -inf, except a
// NaN or +inf, which stays, so that sample_rows refuses the row as the
// host sampler does (it checks the model's logits before masking).
// Allowed ids keep their bits. Other rows are left alone.
// logits: (n, vocab) f32; params: (n, DRAW_WORDS) u32.
// grid (MASK_CTAS, n), MASK_THREADS each: a warp per 32-id word, lane l
// on id 32 w + l (each warp's 128-byte run coalesced).
#define MASK_THREADS 256
extern "C" __global__ void __launch_bounds__(MASK_THREADS)
    mask_rows(float* __restrict__ logits, int vocab, const unsigned* __restrict__ params,
              const unsigned* __restrict__ masks, int mwords) {
    GRID_DEP();
    const int ri = blockIdx.y;
    if (params[DRAW_WORDS * (long long)ri + 6] == 0) return;
    float* row = logits + (long long)ri * vocab;
    const unsigned* m = masks + (long long)ri * mwords;
    const int nw = (vocab + 31) / 32, lane = threadIdx.x & 31, wpb = blockDim.x >> 5;
    for (int w = blockIdx.x * wpb + (threadIdx.x >> 5); w < nw; w += gridDim.x * wpb) {
        const unsigned bits = w < mwords ? m[w] : 0u;
        if (bits == 0xffffffffu) continue;
        const int id = 32 * w + lane;
        if (id < vocab && ((bits >> lane) & 1u) == 0u) {
            const float v = row[id];
            if (!(v != v || v == Q_INF)) row[id] = Q_NINF;
        }
    }
}
