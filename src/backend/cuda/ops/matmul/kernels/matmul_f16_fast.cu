// The f16 side of the `deterministic` and `fast` modes' matmuls (not the
// canonical arithmetic; see matmul.cu for `exact`): weights and
// activations converted to f16 for cuBLAS's prefill GEMMs (dequant_f16,
// to_f16), batched decode on f16 tensor-core tiles (mm_f16_tile), and the
// split-K partial sums of the split GEMMs (split_sum, split_sum_jobs). The
// int8 and float matvecs of decode are matmul_fast.cu's.

// Prefill GEMMs of `fast` mode go through cuBLAS in f16 with f32 accumulation:
// weights (m, k) dequantized to f16 (round to nearest even) for a
// tensor-core GEMM. Quantized types: one thread per 32-value unit, decoded
// in registers (decode_unit; value = A * q + B with the same roundings as
// q_dequant, no FMA) and written as four 16-byte stores. Float types: one
// thread per element.
template <int TY>
__device__ __forceinline__ void dequant_unit_f16(const u8* __restrict__ row, int u, uint4* dst) {
    int w[8];
    float a0, a1, b;
    decode_unit<TY>(row, u, w, a0, a1, b);
    u32 h[16];
#pragma unroll
    for (int i = 0; i < 8; i++) {
        float a = i < 4 ? a0 : a1;
#pragma unroll
        for (int e = 0; e < 4; e += 2) {
            float v0 = __fadd_rn(__fmul_rn(a, (float)(signed char)(w[i] >> (8 * e))), b);
            float v1 = __fadd_rn(__fmul_rn(a, (float)(signed char)(w[i] >> (8 * e + 8))), b);
            h[2 * i + e / 2] = (u32)q_to_f16(v0) | ((u32)q_to_f16(v1) << 16);
        }
    }
#pragma unroll
    for (int i = 0; i < 4; i++) dst[i] = make_uint4(h[4 * i], h[4 * i + 1], h[4 * i + 2], h[4 * i + 3]);
}

// Quantized types: block of 256 threads = 256 consecutive units, whose f16
// output is one contiguous 16 KiB run: staged in shared memory, then
// written with coalesced 16-byte stores.
extern "C" __global__ void dequant_f16(const u8* __restrict__ w, int m, int k,
                                       long long row_bytes, int ty, u16* __restrict__ out) {
    GRID_DEP();
    __shared__ uint4 st[256 * 4];
    long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (ty >= TY_F32) {
        if (t >= (long long)m * k) return;
        int r = (int)(t / k), e = (int)(t % k);
        out[t] = q_to_f16(q_dequant(w + (long long)r * row_bytes, e, ty));
        return;
    }
    int units = k / 32;
    long long total = (long long)m * units;
    if (t < total) {
        int r = (int)(t / units), u = (int)(t % units);
        const u8* row = w + (long long)r * row_bytes;
        uint4* dst = st + 4 * threadIdx.x;
#define DEQUANT_UNIT(T) dequant_unit_f16<T>(row, u, dst)
        QTYPE_DISPATCH(ty, DEQUANT_UNIT)
#undef DEQUANT_UNIT
    }
    __syncthreads();
    // Unit t's output starts at 32 * t halves = 4 * t uint4.
    long long base = (long long)blockIdx.x * blockDim.x;
    long long n_here = min((long long)blockDim.x, total - base);
    uint4* o4 = (uint4*)out + 4 * base;
    for (int i = threadIdx.x; i < 4 * n_here; i += blockDim.x) o4[i] = st[i];
}

// f32 -> f16 bits, round to nearest even.
extern "C" __global__ void to_f16(const float* __restrict__ x, long long len,
                                  u16* __restrict__ out) {
    GRID_DEP();
    long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= len) return;
    out[t] = q_to_f16(x[t]);
}

// ---------------------------------------------------------------------------
// Batched decode (fast mode, a few to 64 activation rows): quantized weights
// dequantized tile by tile into shared memory as f16 and multiplied on
// tensor cores with f16 activations, f32 accumulation (the arithmetic of
// the cuBLAS path, without dequantizing the whole matrix to memory first).
//
// A CTA of 8 warps owns TT_ROWS = 128 weight rows (warp w: rows 16w..16w+15)
// and TT_TOK = 64 activation rows (8 tiles of 8), and a range of k (split-K:
// grid z; partial sums then added in split order by split_sum). The k range
// runs in chunks of TT_KC values: each thread decodes one 32-value unit
// (decode_unit) to f16, the activation chunk is copied with 16-byte loads,
// and every warp runs m16n8k16 MMAs on ldmatrix fragments. Weights are read
// from memory once per 64 activation rows; activations once per 128 weight
// rows (from L2).
//
// Shared rows are TT_KC + 8 halves (144 bytes): the 8 row addresses of an
// ldmatrix phase start 4 banks apart, so they never conflict.

#define TT_ROWS 128
#define TT_TOK 64
#define TT_KC 64
#define TT_KU (TT_KC / 32)       // units per chunk
#define TT_XP (TT_KC / 8)        // 16-byte activation pieces per row
#define TT_LD (TT_KC + 8)

// Unit u of weight row `row` (or zeros when `valid` is false) as 32 f16
// values (unit_f16_regs) into dst (16-byte aligned shared memory).
template <int TY>
__device__ __forceinline__ void tile_unit_f16(const u8* __restrict__ row, int u, bool valid,
                                              u16* dst) {
    u32 h[16];
    unit_f16_regs<TY>(row, u, valid, h);
    uint4* d = (uint4*)dst;
#pragma unroll
    for (int i = 0; i < 4; i++) d[i] = make_uint4(h[4 * i], h[4 * i + 1], h[4 * i + 2], h[4 * i + 3]);
}

// acc += the chunk's products: warp w's 16 weight rows x the activation
// tiles below n, four k16 steps of m16n8k16 on ldmatrix fragments.
__device__ __forceinline__ void tile_mma(u16 (*sw)[TT_LD], u16 (*sx)[TT_LD], int n,
                                         float (*acc)[4]) {
    int wid = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int ntiles = (n + 7) / 8;
#pragma unroll
    for (int ks = 0; ks < TT_KC / 16; ks++) {
        u32 a[4];
        ldsm_x4(a, &sw[16 * wid + (lane & 15)][16 * ks + 8 * (lane >> 4)]);
#pragma unroll
        for (int jp = 0; jp < TT_TOK / 16; jp++) {
            if (2 * jp >= ntiles) break;
            u32 b[4];
            int q = lane >> 3;
            ldsm_x4(b, &sx[16 * jp + 8 * (q >> 1) + (lane & 7)][16 * ks + 8 * (q & 1)]);
            mma_f16_16816(a, b[0], b[1], acc[2 * jp]);
            if (2 * jp + 1 < ntiles) mma_f16_16816(a, b[2], b[3], acc[2 * jp + 1]);
        }
    }
}

// 32-value block types with 4-byte aligned rows: a TT_STAGES-deep pipeline
// of cp.async copies (no registers held): the raw weight bytes of a chunk
// (TT_ROWS rows x 2 blocks, contiguous per row; 4-byte copies, coalesced
// along the flattened rows) and its activations (16-byte copies) land in
// stage c % TT_STAGES while earlier chunks are decoded and multiplied.
#define TT_STAGES 3
#define TT_RAW_WORDS (TT_ROWS * 17)  // TT_KU blocks of up to 34 bytes per row

__device__ __forceinline__ void cp_async_wait_stages() {
    asm volatile("cp.async.wait_group %0;" ::"n"(TT_STAGES - 2));
}

// Queues the chunk's activations (TT_TOK rows x TT_KC halves) into sx:
// 16-byte copies, zeros past n rows or the split's end.
__device__ __forceinline__ void tile_issue_x(const u16* __restrict__ x16, int k, int n, int u0,
                                             int ub, u16 (*sx)[TT_LD]) {
#pragma unroll
    for (int s = 0; s < TT_TOK * TT_XP / 256; s++) {
        int i = threadIdx.x + 256 * s;
        int tk = i / TT_XP, kk = 32 * u0 + 8 * (i % TT_XP);
        bool ok = tk < n && kk < 32 * ub;
        cp_async16(&sx[tk][8 * (i % TT_XP)], ok ? (const void*)(x16 + (long long)tk * k + kk) : x16,
                   ok ? 16 : 0);
    }
}

// Any quantized type: each thread decodes its unit straight from global
// memory (the K-quant types' 256-value superblocks do not split into 64-value
// chunks of whole blocks, and rows whose bytes are not 4-byte aligned).
template <int TY>
__device__ __forceinline__ void mm_tile_body(const u8* __restrict__ w, int m, int k,
                                             long long row_bytes, const u16* __restrict__ x16,
                                             int n, int ua, int ub, u16 (*sw)[TT_LD],
                                             u16 (*sx)[TT_LD], float (*acc)[4]) {
    int tid = threadIdx.x;
    int row0 = blockIdx.y * TT_ROWS;
    // This thread's staging unit: row tid / 2, unit tid % 2 of the chunk.
    int sr = tid >> 1, su = tid & 1;
    const u8* wrow = w + (long long)min(row0 + sr, m - 1) * row_bytes;
    for (int u0 = ua; u0 < ub; u0 += TT_KU) {
#pragma unroll
        for (int j = su; j < TT_KU; j += 2)
            tile_unit_f16<TY>(wrow, u0 + j, row0 + sr < m && u0 + j < ub, &sw[sr][32 * j]);
        tile_issue_x(x16, k, n, u0, ub, sx);
        cp_async_commit();
        asm volatile("cp.async.wait_group 0;");
        __syncthreads();
        tile_mma(sw, sx, n, acc);
        __syncthreads();
    }
}

// Queues chunk u0's copies into (raw, sx); bytes past the row, the split or
// n rows are zero-filled (source size 0, or 2 for a split that ends after
// one block mid-word: BS is even).
template <int TY>
__device__ __forceinline__ void tile_issue32(const u8* __restrict__ w, int m, long long row_bytes,
                                             const u16* __restrict__ x16, int k, int n, int u0,
                                             int ub, u32* raw, u16 (*sx)[TT_LD]) {
    constexpr int BS = gr_type_size(TY), WPR = TT_KU * BS / 4;  // words per row per chunk
    int row0 = blockIdx.y * TT_ROWS;
    int valid = min(TT_KU, ub - u0) * BS;
#pragma unroll
    for (int p = 0; p < (TT_ROWS * WPR + 255) / 256; p++) {
        int i = threadIdx.x + 256 * p;
        if (i >= TT_ROWS * WPR) break;
        int r = i / WPR, c = i % WPR;
        const u8* src = w;
        int bytes = 0;
        if (row0 + r < m && 4 * c < valid) {
            src = w + (long long)(row0 + r) * row_bytes + (long long)u0 * BS + 4 * c;
            bytes = min(4, valid - 4 * c);
        }
        cp_async4(raw + i, src, bytes);
    }
    tile_issue_x(x16, k, n, u0, ub, sx);
}

template <int TY>
__device__ __forceinline__ void mm_tile_body32(const u8* __restrict__ w, int m, int k,
                                               long long row_bytes,
                                               const u16* __restrict__ x16, int n, int ua,
                                               int ub, u16 (*sw)[TT_LD], u8* stages,
                                               float (*acc)[4]) {
    constexpr int WPR = TT_KU * gr_type_size(TY) / 4;
    const int STAGE = TT_RAW_WORDS * 4 + TT_TOK * TT_LD * 2;  // bytes per stage
    int tid = threadIdx.x;
    int row0 = blockIdx.y * TT_ROWS;
    int sr = tid >> 1, su = tid & 1;
    int nch = (ub - ua + TT_KU - 1) / TT_KU;
#pragma unroll
    for (int c = 0; c < TT_STAGES - 1; c++) {
        if (c < nch) {
            u8* st = stages + c * STAGE;
            tile_issue32<TY>(w, m, row_bytes, x16, k, n, ua + TT_KU * c, ub, (u32*)st,
                             (u16 (*)[TT_LD])(st + TT_RAW_WORDS * 4));
        }
        cp_async_commit();
    }
    for (int c = 0; c < nch; c++) {
        int u0 = ua + TT_KU * c;
        u8* st = stages + (c % TT_STAGES) * STAGE;
        cp_async_wait_stages();
        // Every thread's copies of chunk c landed, and the MMAs of chunk
        // c - 1 are done with sw and with the stage the next issue reuses.
        __syncthreads();
#pragma unroll
        for (int j = su; j < TT_KU; j += 2)
            tile_unit_f16<TY>(st + 4 * sr * WPR, j, row0 + sr < m && u0 + j < ub, &sw[sr][32 * j]);
        __syncthreads();
        if (c + TT_STAGES - 1 < nch) {
            u8* nx = stages + ((c + TT_STAGES - 1) % TT_STAGES) * STAGE;
            tile_issue32<TY>(w, m, row_bytes, x16, k, n, u0 + TT_KU * (TT_STAGES - 1), ub, (u32*)nx,
                             (u16 (*)[TT_LD])(nx + TT_RAW_WORDS * 4));
        }
        cp_async_commit();
        tile_mma(sw, (u16 (*)[TT_LD])(st + TT_RAW_WORDS * 4), n, acc);
    }
}

// out (n, m) (+ blockIdx.z * part_stride: split z's partial sums) =
// x16 (n, k) · wᵀ over units [z * upc, min((z + 1) * upc, k / 32)).
// Grid: (ceil(n / TT_TOK), ceil(m / TT_ROWS), splits); block 256 threads;
// upc a multiple of TT_KC / 32. Dynamic shared memory: TT_SMEM bytes (sw,
// then TT_STAGES stages of raw weights and activations).
#define TT_SMEM (TT_ROWS * TT_LD * 2 + TT_STAGES * (TT_RAW_WORDS * 4 + TT_TOK * TT_LD * 2))
extern "C" __global__ void __launch_bounds__(256, 2) mm_f16_tile(
    const u8* __restrict__ w, int m, int k, long long row_bytes, int ty,
    const u16* __restrict__ x16, int n_all, int upc, long long part_stride, int add,
    float* __restrict__ out) {
    GRID_DEP();
    extern __shared__ __align__(16) u8 tt_smem[];
    u16 (*sw)[TT_LD] = (u16 (*)[TT_LD])tt_smem;
    u8* stages = tt_smem + TT_ROWS * TT_LD * 2;
    u16 (*sx)[TT_LD] = (u16 (*)[TT_LD])(stages + TT_RAW_WORDS * 4);
    int g0 = blockIdx.x * TT_TOK;
    int n = min(TT_TOK, n_all - g0);
    x16 += (long long)g0 * k;
    out += blockIdx.z * part_stride + (long long)g0 * m;
    int ua = blockIdx.z * upc, ub = min(ua + upc, k / 32);
    float acc[TT_TOK / 8][4];
#pragma unroll
    for (int j = 0; j < TT_TOK / 8; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[j][e] = 0.0f;
#define TT_BODY(T)                                                                  \
    if (T <= TY_Q8_0 && row_bytes % 4 == 0)                                         \
        mm_tile_body32<T <= TY_Q8_0 ? T : TY_Q8_0>(w, m, k, row_bytes, x16, n, ua, ub, sw, \
                                                    stages, acc);                   \
    else                                                                            \
        mm_tile_body<T>(w, m, k, row_bytes, x16, n, ua, ub, sw, sx, acc);
    QTYPE_DISPATCH(ty, TT_BODY)
#undef TT_BODY
    int wid = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int g = lane >> 2, t = lane & 3;
    int ra = blockIdx.y * TT_ROWS + 16 * wid + g, rb = ra + 8;
#pragma unroll
    for (int j = 0; j < TT_TOK / 8; j++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int tk = 8 * j + 2 * t + (e & 1);
            int row = e < 2 ? ra : rb;
            // One split (part_stride 0) stores the product (adding for an
            // adding job); several store partials for split_sum.
            if (tk < n && row < m)
                mm_store(out + (long long)tk * m + row, acc[j][e], add && part_stride == 0);
        }
    }
}

// out[i] (=, or += with add), i < len: the sum over s = 0..splits-1, in
// that order, of part[s * stride + i].
extern "C" __global__ void split_sum(const float* __restrict__ part, int splits, long long len,
                                     long long stride, int add, float* __restrict__ out) {
    GRID_DEP();
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= len) return;
    float v = part[i];
    for (int s = 1; s < splits; s++) v += part[s * stride + i];
    mm_store(out + i, v, add != 0);
}

// split_sum for every job of a MatMuls table in one launch, four outputs per
// thread: the partials of all jobs lie back to back (job j's (n, m_j) block
// at n * (m_0 + .. + m_{j-1}) in each split, split s at s * stride, stride =
// n * (m_0 + ..)), so element i belongs to the job whose range holds it.
// out_j[i - start_j] (=, or += for an adding job) = the sum over s = 0..
// splits-1, in that order, of part[s * stride + i]: the same bits as
// split_sum. Requirements (ops/matmul/mma.rs checks them): every n * m_j
// and stride a multiple of 4, part and every out_j 16-byte aligned.
extern "C" __global__ void split_sum_jobs(const float* __restrict__ part, int splits,
                                          long long stride, int n, MmJobs J) {
    GRID_DEP();
    long long i = 4 * ((long long)blockIdx.x * blockDim.x + threadIdx.x);
    if (i >= stride) return;
    long long start = 0, end = (long long)n * J.m[0];
    float* out = J.out[0];
    bool add = (J.add & 1) != 0;
#pragma unroll
    for (int j = 1; j < MM_JOBS; j++) {
        if (j < J.count && i >= end) {
            start = end;
            end += (long long)n * J.m[j];
            out = J.out[j];
            add = ((J.add >> j) & 1) != 0;
        }
    }
    float4 v = *(const float4*)(part + i);
#pragma unroll 4
    for (int s = 1; s < splits; s++) {
        float4 p = *(const float4*)(part + s * stride + i);
        v.x += p.x;
        v.y += p.y;
        v.z += p.z;
        v.w += p.w;
    }
    float4* o = (float4*)(out + (i - start));
    if (add) {
        float4 p = *o;
        v = make_float4(q_add(p.x, v.x), q_add(p.y, v.y), q_add(p.z, v.z), q_add(p.w, v.w));
    }
    *o = v;
}
