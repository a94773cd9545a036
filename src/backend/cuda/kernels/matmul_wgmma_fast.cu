// Prefill GEMM on Hopper tensor cores (wgmma, sm_90a; `fast` mode only) for
// the 32-value block types: out (n, m) (=, or +=) x16 (n, k) · wᵀ with the
// quantized weights dequantized to f16 tile by tile in shared memory, never
// to device memory (the cuBLAS path writes and re-reads a whole f16 copy of
// every matrix per call: about a quarter of an 8B model's prefill).
//
// Warp-specialized CTA over 128 weight rows and BN = 128 or 256 activation
// rows (tokens), of four warpgroups (512 threads) at BN = 128 and three at
// BN = 256 (WG_NPT):
//   - the first two (one at BN = 256), the producers, copy raw weights and
//     activations into shared memory (cp.async, 16-byte pieces) and decode
//     the weights to f16 tiles (unit_f16_regs: the same f16 values as
//     dequant_f16, so the cuBLAS path's products up to the summation order);
//   - the last two, the consumers, run wgmma.m64n<BN>k16 (f16 in, f32
//     accumulate, both operands K-major in shared memory) on weight rows
//     64 i .. 64 i + 63 (consumer i), and store the accumulators.
// Status: opt-in (QUIRE_WGMMA=1; compiled only then). Correct (ops
// mat_muls against the cpu at both BN), but on an H100 (2026-11-24,
// evening) 8B Q4_0 pp512 ran at 15.4-15.8k tokens/s against the cuBLAS
// path's 20.7-20.9k; with the producers' copies and decode left out
// (timing only) 23.1-24.7k, the F16 model's cuBLAS path 28.3k: the
// producers bind first, the consumers' pipeline next (docs/PERF.md). An
// earlier form had every warp copy, decode and multiply in turn (13.3k);
// both forms had every wgmma serialized by ptxas (advisory C7515, a
// zero-trip loop path), fixed here.
//
// The k range runs in chunks of WG_BK = 64 values (one 128-byte row of f16
// per weight row or token). Raw weights go in superchunks of 256 values
// (four chunks): eight 32-blocks, a multiple of 16 bytes for every type (rows
// start 16-byte aligned when k is a multiple of 256), two superchunks in
// flight. f16 weight tiles: SW stages; activation tiles: SX stages, copied
// A = SX - 3 chunks ahead (1 when SX <= 4), see wg_stages.
// Producer at chunk c: wait for its copies of activations c and (at a
// superchunk start) raw superchunk c / 4, the latter shared through named
// barrier 1 (producers only), which also frees the other raw buffer;
// queue activations c + A (once the consumers released the slot's last
// chunk, c + A - SX) and raw superchunk c / 4 + 1; decode chunk c into
// weight stage c % SW (once chunk c - SW was released); fence the writes
// for the async proxy and arrive on full[c % SW]. Consumer at chunk c:
// wait full[c % SW], issue the four wgmma of the chunk, wait for chunk
// c - 1's and release its stages (one arrival per consumer warp on
// empty_w / empty_x). The consumers release chunk j at their step j + 1,
// so a producer that waits only for chunks c - 3 and older never waits on
// the consumers' latest step (with SX = 6 and SW = 4 it waits for c - 4).
// f16 tiles use the 128-byte swizzle: 16-byte piece p of row r is stored at
// piece p ^ (r % 8) (tiles 1024-byte aligned), so the decoder's stores and
// the tensor cores' reads spread over all banks.
//
// Shared memory (dynamic, wg_smem_bytes): alignment slack, sw (SW x 128 rows
// x 128 B), sx (SX x BN rows x 128 B), raw (2 x (128 rows x 8 blocks + 16
// bytes of slack for ld_words)), mbarriers.
//
// Grid: (ceil(n / BN), CTA rows of the job table J (128 weight rows each),
// 1); block WG_THREADS(BN) threads. Requirements (launch/matmul_wgmma.rs): k a
// multiple of 256, weights 16-byte aligned, x16 (n, k) f16.

typedef unsigned long long u64;
#define WG_BK 64
#define WG_SMEM_MAX 232448
__host__ __device__ constexpr int wg_raw_bytes(int bs) { return 128 * 8 * bs + 16; }
__host__ __device__ constexpr int wg_smem_bytes(int bs, int bn, int sw, int sx) {
    return 1024 + sw * 128 * 128 + sx * bn * 128 + 2 * wg_raw_bytes(bs) + 128;
}
// Stage counts (weight tiles sw, activation tiles sx): the first of (4, 6),
// (4, 5), (4, 4), (3, 4), (3, 3) that fits; launch/matmul_wgmma.rs makes
// the same choice (WG_ENTRY checks it at compile time). Encoded as 8 sw +
// sx.
__host__ __device__ constexpr int wg_stages(int bs, int bn) {
    const int c[5][2] = {{4, 6}, {4, 5}, {4, 4}, {3, 4}, {3, 3}};
    for (int i = 0; i < 5; i++)
        if (wg_smem_bytes(bs, bn, c[i][0], c[i][1]) <= WG_SMEM_MAX) return 8 * c[i][0] + c[i][1];
    return 8 * 3 + 3;
}
// Timing-only knobs (wrong results; QUIRE_WG_DEFINES): leave out the
// weight decode (producers' here, consumers' in mm_wr_*), activation
// copies or raw weight copies.
#ifndef WG_NO_DECODE
#define WG_NO_DECODE 0
#endif
#ifndef WG_NO_XCOPY
#define WG_NO_XCOPY 0
#endif
#ifndef WG_NO_WCOPY
#define WG_NO_WCOPY 0
#endif

// Shared-memory matrix descriptor of a K-major f16 tile with 128-byte rows
// in the 128-byte swizzle: start address, leading offset 1 (unused by this
// layout), stride 1024 bytes between groups of 8 rows, swizzle mode 1.
__device__ __forceinline__ unsigned long long wg_desc(u32 saddr) {
    return (unsigned long long)((saddr & 0x3FFFF) >> 4) | (1ull << 16) |
           ((unsigned long long)(1024 >> 4) << 32) | (1ull << 62);
}

__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wg_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
// Ordinary shared-memory stores (and completed cp.async copies) made
// visible to the tensor cores' async proxy; each writing thread, before the
// barrier that publishes them.
__device__ __forceinline__ void fence_proxy_async() {
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
// Keeps the compiler from moving accumulator reads or writes across the
// asynchronous wgmma window.
__device__ __forceinline__ void wg_reg_fence(float& r) { asm volatile("" : "+f"(r)::"memory"); }

// Operand text and constraints of the accumulators d[0..63] (and d[64..127]
// for N = 256): the same registers in both instruction shapes.
#define WG_R64                                                                        \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, "     \
    "%17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "     \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, "     \
    "%47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, "     \
    "%62, %63"
#define WG_R128                                                                       \
    WG_R64 ", %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, "      \
           "%77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, "   \
           "%91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, "    \
           "%104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, " \
           "%116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define WG_ACC8(i)                                                                    \
    "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]),       \
        "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define WG_ACC64(i)                                                                   \
    WG_ACC8(i), WG_ACC8(i + 8), WG_ACC8(i + 16), WG_ACC8(i + 24), WG_ACC8(i + 32),    \
        WG_ACC8(i + 40), WG_ACC8(i + 48), WG_ACC8(i + 56)

// d (64 x N f32, the wgmma accumulator layout) += A (64 x 16, desc a) ·
// B (16 x N, desc b), both K-major f16 in shared memory; N = 128 or 256.
__device__ __forceinline__ void wgmma_n128(float* d, unsigned long long a, unsigned long long b) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {" WG_R64
                 "}, %64, %65, p, 1, 1, 0, 0;\n}\n"
                 : WG_ACC64(0)
                 : "l"(a), "l"(b), "r"(1));
}
__device__ __forceinline__ void wgmma_n256(float* d, unsigned long long a, unsigned long long b) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 {" WG_R128
                 "}, %128, %129, p, 1, 1, 0, 0;\n}\n"
                 : WG_ACC64(0), WG_ACC64(64)
                 : "l"(a), "l"(b), "r"(1));
}

template <int BN>
__device__ __forceinline__ void wgmma_bn(float* d, unsigned long long a, unsigned long long b) {
    if (BN == 256)
        wgmma_n256(d, a, b);
    else
        wgmma_n128(d, a, b);
}

__device__ __forceinline__ void mbar_init(u64* bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"((u32)__cvta_generic_to_shared(bar)),
                 "r"(count)
                 : "memory");
}
__device__ __forceinline__ void mbar_arrive(u64* bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(
                     (u32)__cvta_generic_to_shared(bar))
                 : "memory");
}
// Waits until the phase of parity `par` of the barrier has completed.
__device__ __forceinline__ void mbar_wait(u64* bar, u32 par) {
    u32 a = (u32)__cvta_generic_to_shared(bar), done;
    do {
        asm volatile(
            "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
            "selp.u32 %0, 1, 0, p;\n}\n"
            : "=r"(done)
            : "r"(a), "r"(par)
            : "memory");
    } while (!done);
}
// Producer threads: two warpgroups at BN = 128 (one measured
// producer-bound on an H100: 8B Q4_0 pp512 14.0k tokens/s, against 24.7k
// with the producer's copies and decode left out), one at BN = 256 (twice
// the tensor work per chunk; the 128 accumulators per consumer thread do
// not fit the 128 registers a 512-thread CTA leaves). Consumer threads:
// two warpgroups.
#define WG_NPT(BN) ((BN) == 128 ? 256 : 128)
#define WG_THREADS(BN) (WG_NPT(BN) + 256)
template <int NPT>
__device__ __forceinline__ void wg_producer_sync() {
    asm volatile("bar.sync 1, %0;" ::"n"(NPT) : "memory");
}

// Queues activation chunk c (BN tokens x 8 pieces of 16 bytes; zeros past
// n) into stage sx. Producer thread t copies piece t % 8 of tokens
// t / 8 + 32 p.
template <int BN, int NPT>
__device__ __forceinline__ void wg_issue_x(const u16* __restrict__ xb, int n, int k, int c,
                                           u8* sx, int t) {
    constexpr int TS = NPT / 8;  // tokens per pass
    const int q = t & 7, t0 = t >> 3;
    const int kk = WG_BK * c + 8 * q;
    u8* dst = sx + t0 * 128 + ((q ^ (t0 & 7)) << 4);
    const u16* src = xb + (long long)t0 * k + kk;
#pragma unroll
    for (int p = 0; p < BN / TS; p++) {
        bool ok = t0 + TS * p < n;
        cp_async16(dst + TS * 128 * p,
                   ok ? (const void*)(src + (long long)TS * p * k) : (const void*)xb, ok ? 16 : 0);
    }
}

// Queues raw superchunk s (128 rows x 8 blocks = BS / 2 pieces of 16
// bytes per row) into `raw` (row stride 8 BS). Producer thread t copies
// pieces t, t + NPT, ... of the 128 BS / 2; rows past the job's are
// copied from its first row (never stored).
template <int TY, int NPT>
__device__ __forceinline__ void wg_issue_w(const u8* __restrict__ w, long long row_bytes, int row0,
                                           int m, int s, u8* raw, int t) {
    constexpr int BS = gr_type_size(TY), P = BS / 2;
#pragma unroll
    for (int q = 0; q < (128 * P + NPT - 1) / NPT; q++) {
        int i = t + NPT * q, r = i / P, pc = i - r * P;
        if (i >= 128 * P) break;
        int gr = row0 + r < m ? row0 + r : row0;
        cp_async16(raw + r * 8 * BS + 16 * pc,
                   w + (long long)gr * row_bytes + (long long)s * 8 * BS + 16 * pc, 16);
    }
}

// Decodes chunk c of row t % 128 of the raw superchunk (units 2 (c % 4)
// and 2 (c % 4) + 1) into the f16 tile sw: with 256 producers, thread t
// the unit t / 128 of the two.
template <int TY, int NPT>
__device__ __forceinline__ void wg_decode(const u8* raw, int c, u8* sw, int t) {
    constexpr int BS = gr_type_size(TY);
    const int r = t & 127;
    u8* row = sw + 128 * r;
#pragma unroll
    for (int jj = 0; jj < 256 / NPT; jj++) {
        const int j = NPT == 256 ? t >> 7 : jj;
        u32 h[16];
        unit_f16_regs<TY>(raw + 8 * BS * r, 2 * (c & 3) + j, true, h);
#pragma unroll
        for (int i = 0; i < 4; i++)
            *(uint4*)(row + (((4 * j + i) ^ (r & 7)) << 4)) =
                make_uint4(h[4 * i], h[4 * i + 1], h[4 * i + 2], h[4 * i + 3]);
    }
}

template <int TY, int BN>
__device__ __forceinline__ void wg_body(const MmJobs& J, const u16* __restrict__ x16, int n_all,
                                        int k) {
    constexpr int BS = gr_type_size(TY), NACC = BN / 2, NPT = WG_NPT(BN);
    constexpr int SW = wg_stages(BS, BN) / 8, SX = wg_stages(BS, BN) % 8;
    constexpr int A = SX > 4 ? SX - 3 : 1, RAW = wg_raw_bytes(BS);
    extern __shared__ __align__(16) u8 wg_smem[];
    u32 s0 = (u32)__cvta_generic_to_shared(wg_smem);
    u8* sm = wg_smem + ((1024 - (s0 & 1023)) & 1023);
    u8* sw = sm;                   // SW x 128 x 128 B
    u8* sx = sw + SW * 128 * 128;  // SX x BN x 128 B
    u8* sraw = sx + SX * BN * 128;    // 2 x RAW
    u64* bars = (u64*)(sraw + 2 * RAW);
    u64* full = bars;              // [SW], NPT producer arrivals
    u64* empty_w = bars + SW;      // [SW], 8 consumer warps
    u64* empty_x = bars + 2 * SW;  // [SX], 8 consumer warps
    const MmJob jb = mm_job(J, blockIdx.y);
    const int m = jb.m, units = k / 32;
    const long long row_bytes = (long long)units * BS;
    const int row0 = jb.by * 128;
    const int n0 = blockIdx.x * BN;
    const int n = min(BN, n_all - n0);
    const u16* xb = x16 + (long long)n0 * k;
    const int nk = k / WG_BK;
    const int tid = threadIdx.x, wg = tid >> 7, t = tid;
#define SX_(c) (sx + ((c) % SX) * BN * 128)
#define SR_(s) (sraw + ((s) & 1) * RAW)
#define SW_(c) (sw + ((c) % SW) * 128 * 128)

    if (tid == 0) {
        for (int i = 0; i < SW; i++) {
            mbar_init(full + i, NPT);
            mbar_init(empty_w + i, 8);
        }
        for (int i = 0; i < SX; i++) mbar_init(empty_x + i, 8);
    }
    __syncthreads();

    if (t < NPT) {
        // Producer. Groups: G(-A) = raw 0 + activations 0, G(j - A) =
        // activations j for 0 < j < A, then G(c) = activations c + A (+ raw
        // c / 4 + 1 when c % 4 == 0): activations c are in G(c - A), raw
        // superchunk s in G(4 s - 4) (s > 0).
        wg_issue_w<TY, NPT>(jb.w, row_bytes, row0, m, 0, SR_(0), t);
        for (int j = 0; j < A; j++) {
            if (j < nk) wg_issue_x<BN, NPT>(xb, n, k, j, SX_(j), t);
            cp_async_commit();
        }
        for (int c = 0; c < nk; c++) {
            cp_async_wait_group<A - 1>();
            if ((c & 3) == 0) wg_producer_sync<NPT>();
            if (c + A < nk) {
                // The slot's last chunk: released by the consumers at
                // their step c + A - SX + 1 <= c - 1 (c - 2 when SX > 4).
                const int p = c + A - SX;
                if (p >= 0) mbar_wait(empty_x + p % SX, (p / SX) & 1);
                if (!WG_NO_XCOPY) wg_issue_x<BN, NPT>(xb, n, k, c + A, SX_(c + A), t);
            }
            if (!WG_NO_WCOPY && (c & 3) == 0 && c + 4 < nk)
                wg_issue_w<TY, NPT>(jb.w, row_bytes, row0, m, c / 4 + 1, SR_(c / 4 + 1), t);
            cp_async_commit();
            if (c >= SW) mbar_wait(empty_w + c % SW, ((c - SW) / SW) & 1);
            if (!WG_NO_DECODE) wg_decode<TY, NPT>(SR_(c / 4), c, SW_(c), t);
            fence_proxy_async();
            mbar_arrive(full + c % SW);
        }
        cp_async_wait_all();
        return;
    }

    // Consumers.
    const int cw = wg - NPT / 128;
    float acc[NACC];
#pragma unroll
    for (int e = 0; e < NACC; e++) acc[e] = 0.0f;
    // A do-while (nk >= 4): a zero-trip path would join zeroed
    // accumulators with the loop's, and ptxas then serializes every wgmma
    // (its advisory C7515).
    int c = 0;
    do {
        mbar_wait(full + c % SW, (c / SW) & 1);
        const u32 a0 = (u32)__cvta_generic_to_shared(SW_(c)) + cw * 64 * 128;
        const u32 b0 = (u32)__cvta_generic_to_shared(SX_(c));
#pragma unroll
        for (int e = 0; e < NACC; e++) wg_reg_fence(acc[e]);
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < WG_BK / 16; kk++)
            wgmma_bn<BN>(acc, wg_desc(a0 + 32 * kk), wg_desc(b0 + 32 * kk));
        wg_commit();
        wg_wait<1>();
#pragma unroll
        for (int e = 0; e < NACC; e++) wg_reg_fence(acc[e]);
        if (c >= 1 && (tid & 31) == 0) {
            mbar_arrive(empty_w + (c - 1) % SW);
            mbar_arrive(empty_x + (c - 1) % SX);
        }
    } while (++c < nk);
    wg_wait<0>();
#pragma unroll
    for (int e = 0; e < NACC; e++) wg_reg_fence(acc[e]);
#undef SX_
#undef SR_
#undef SW_

    // Accumulator layout of m64nNk16: warp v of the warpgroup holds rows
    // 16 v + lane / 4 (+ 8 for elements 2, 3 of each group of four) and, in
    // group j, columns 8 j + 2 (lane % 4) (+ 1 for odd elements).
    const int v = (tid >> 5) & 3, lane = tid & 31;
    const int rbase = row0 + 64 * cw + 16 * v + (lane >> 2);
#pragma unroll
    for (int j = 0; j < BN / 8; j++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int row = rbase + 8 * (e >> 1);
            int tk = 8 * j + 2 * (lane & 3) + (e & 1);
            if (tk < n && row < m)
                mm_store(jb.out + (long long)(n0 + tk) * m + row, acc[4 * j + e], jb.add);
        }
    }
}

// WG_SMEM_<name> (host prelude): the bytes launch/matmul_wgmma.rs launches
// the entry with, from its mirror of wg_stages; the two must agree.
#define WG_ENTRY(NAME, TY, BN)                                                              \
    static_assert(wg_smem_bytes(gr_type_size(TY), BN, wg_stages(gr_type_size(TY), BN) / 8,  \
                                wg_stages(gr_type_size(TY), BN) % 8) == WG_SMEM_##NAME,     \
                  "launch/matmul_wgmma.rs disagrees on " #NAME "'s shared memory");         \
    extern "C" __global__ void __launch_bounds__(WG_THREADS(BN), 1)                                    \
        NAME(MmJobs J, const u16* __restrict__ x16, int n, int k) {                         \
        GRID_DEP();                                                                         \
        wg_body<TY, BN>(J, x16, n, k);                                                      \
    }
WG_ENTRY(mm_wg_q4_0_n128, TY_Q4_0, 128)
WG_ENTRY(mm_wg_q4_0_n256, TY_Q4_0, 256)
WG_ENTRY(mm_wg_q4_1_n128, TY_Q4_1, 128)
WG_ENTRY(mm_wg_q4_1_n256, TY_Q4_1, 256)
WG_ENTRY(mm_wg_q5_0_n128, TY_Q5_0, 128)
WG_ENTRY(mm_wg_q5_0_n256, TY_Q5_0, 256)
WG_ENTRY(mm_wg_q5_1_n128, TY_Q5_1, 128)
WG_ENTRY(mm_wg_q5_1_n256, TY_Q5_1, 256)
WG_ENTRY(mm_wg_q8_0_n128, TY_Q8_0, 128)
WG_ENTRY(mm_wg_q8_0_n256, TY_Q8_0, 256)

// ---------------------------------------------------------------------------
// Register-A form (mm_wr_*): the weights decoded straight into the wgmma A
// fragments in the consumers' registers, no f16 weight tile. The smem form
// above spends its producers on the decode and its consumers wait for them;
// here the producers only copy, and each consumer thread decodes the 8
// values per row and block that its own fragment holds (a few ALU
// instructions per wgmma the tensor cores take hundreds of clocks for).
//
// CTA: 128 + 256 MT threads, warpgroup 0 the producer (cp.async of raw
// weight superchunks and activation chunks; setmaxnreg down to 40
// registers), warpgroups 1 .. 2 MT the consumers (setmaxnreg up to 232 at
// MT = 1, 104 at MT = 2: 64 f32 accumulators plus one block's fragments).
// Rows per CTA 128 MT: consumer cw owns rows 64 cw .. 64 cw + 63; tokens
// per CTA 128 (wgmma m64n128k16, B = the activation chunk, K-major in the
// 128-byte swizzle as above). More consumers hide more of each one's
// decode and wgmma latency (each retires its group before decoding the
// next); taller tiles also read fewer L2 bytes per FLOP.
//
// Fragment of A (the mma.m16n8k16 layout, per warp v of a warpgroup over
// rows 16 v .. 16 v + 15 of its m64 tile): lane (g = lane / 4, q = lane %
// 4) holds rows g and g + 8, columns 2q, 2q + 1 (registers 0, 1) and 2q +
// 8, 2q + 9 (registers 2, 3) of each k16 step. A 32-block is two k16
// steps, so per row and block a lane needs values 2q, 2q + 1, 2q + 8, 2q +
// 9 and the same + 16: for the 4- and 5-bit types the low and high nibbles
// of four qs bytes, for Q8_0 eight qs bytes (wr_frag).
//
// Pipeline: activations in SX chunk stages, raw weights in SR superchunk
// stages (256 values of MT x 128 rows), each with a full barrier (128
// producer arrivals once the producer's own copies landed, after
// fence.proxy.async) and an empty barrier (one arrival per consumer warp
// once its wgmma of the stage completed). The producer queues chunk c + P
// (and at a superchunk start that superchunk's raw rows) at its step c and
// publishes chunk c; raw superchunks go L chunks earlier than their first
// chunk's activations. Consumers commit one wgmma group per GB blocks (2 GB
// instructions) and retire it before decoding the next group (C7513
// below); the consumer warpgroups' groups interleave on the tensor cores.

#define WR_BN 128
#define WR_THREADS(MT) (128 + 256 * (MT))
// Registers per thread after setmaxnreg: 40 for the producer, these for
// the consumers. An increase waits until the CTA's pool (the launch's
// registers per thread, 65,536 / threads rounded down to 8, times the
// threads) has them, so both must fit it: 112 at MT = 2 hung.
__host__ __device__ constexpr int wr_consumer_regs(int mt) { return mt == 1 ? 232 : 104; }
__host__ __device__ constexpr bool wr_regs_fit(int mt) {
    return 128 * 40 + 256 * mt * wr_consumer_regs(mt) <=
           WR_THREADS(mt) * ((65536 / WR_THREADS(mt)) & ~7);
}
static_assert(wr_regs_fit(1) && wr_regs_fit(2), "setmaxnreg exceeds the CTA's registers");
__host__ __device__ constexpr int wr_raw_bytes(int bs, int mt) { return 128 * mt * 8 * bs; }
__host__ __device__ constexpr int wr_smem_bytes(int bs, int mt, int sr, int sx) {
    return 1024 + sx * WR_BN * 128 + sr * wr_raw_bytes(bs, mt) + 256;
}
// Stage counts (raw superchunks sr, activation chunks sx): the first of
// (3, 6), (3, 5), (2, 6), (2, 5), (2, 4) that fits; encoded as 8 sr + sx
// (launch/matmul_wgmma.rs mirrors it; WR_ENTRY checks at compile time).
__host__ __device__ constexpr int wr_stages(int bs, int mt) {
    const int c[5][2] = {{3, 6}, {3, 5}, {2, 6}, {2, 5}, {2, 4}};
    for (int i = 0; i < 5; i++)
        if (wr_smem_bytes(bs, mt, c[i][0], c[i][1]) <= WG_SMEM_MAX) return 8 * c[i][0] + c[i][1];
    return 8 * 2 + 4;
}

// d (64 x 128 f32) += A (64 x 16 f16, fragment registers a0..a3) · B (16 x
// 128, desc b, K-major in shared memory).
__device__ __forceinline__ void wgmma_ra_n128(float* d, u32 a0, u32 a1, u32 a2, u32 a3,
                                              unsigned long long b) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {" WG_R64
                 "}, {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
                 : WG_ACC64(0)
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(b), "r"(1));
}

__device__ __forceinline__ u32 ld_u16s(const u8* p) { return *(const u16*)p; }

// Values 2q, 2q + 1 (h[0]), 2q + 8, 2q + 9 (h[1]), 16 + 2q, 16 + 2q + 1
// (h[2]) and 24 + 2q, 24 + 2q + 1 (h[3]) of the 32-block at blk (shared
// memory) as f16 pairs: the same f16 values as unit_f16_regs (the integer
// made exactly in f16, then one f16 FMA with the block's scale and
// offset), hence as dequant_f16.
template <int TY>
__device__ __forceinline__ void wr_frag(const u8* blk, int q, u32* h) {
    u32 d = ld_u16s(blk);
    d |= d << 16;
    if (TY == TY_Q8_0) {
        const u32 w0 = ld_u16s(blk + 2 + 2 * q) | (ld_u16s(blk + 10 + 2 * q) << 16);
        const u32 w1 = ld_u16s(blk + 18 + 2 * q) | (ld_u16s(blk + 26 + 2 * q) << 16);
        const u32 bias = 0x64806480u;  // 1152 = 1024 + 128, the signed bytes' bias
        const u32 x0 = w0 ^ 0x80808080u, x1 = w1 ^ 0x80808080u;
        h[0] = h2_fma(h2_sub(h2_bytes01(x0), bias), d, 0);
        h[1] = h2_fma(h2_sub(h2_bytes23(x0), bias), d, 0);
        h[2] = h2_fma(h2_sub(h2_bytes01(x1), bias), d, 0);
        h[3] = h2_fma(h2_sub(h2_bytes23(x1), bias), d, 0);
    } else {
        // qs offset, integer bias (1024 + the type's offset), additive term.
        constexpr int QS = TY == TY_Q4_0 ? 2 : TY == TY_Q4_1 ? 4 : TY == TY_Q5_0 ? 6 : 8;
        const u32 bias = TY == TY_Q4_0 ? 0x64086408u : TY == TY_Q5_0 ? 0x64106410u : 0x64006400u;
        u32 m = 0;
        if (TY == TY_Q4_1 || TY == TY_Q5_1) {
            m = ld_u16s(blk + 2);
            m |= m << 16;
        }
        const u32 w = ld_u16s(blk + QS + 2 * q) | (ld_u16s(blk + QS + 8 + 2 * q) << 16);
        u32 lo = w & 0x0F0F0F0Fu, hi = (w >> 4) & 0x0F0F0F0Fu;
        if (TY == TY_Q5_0 || TY == TY_Q5_1) {
            // Bit j of qh is value j's fifth bit: bits 2q, 2q + 1, 2q + 8,
            // 2q + 9 (and + 16) to bit 4 of bytes 0..3.
            constexpr int QH = TY == TY_Q5_0 ? 2 : 4;
            const u32 qh = ld_u16s(blk + QH) | (ld_u16s(blk + QH + 2) << 16);
            const u32 a = qh >> (2 * q), b = a >> 16;
            lo |= ((a & 1u) << 4) | ((a & 2u) << 11) | ((a & 0x100u) << 12) | ((a & 0x200u) << 19);
            hi |= ((b & 1u) << 4) | ((b & 2u) << 11) | ((b & 0x100u) << 12) | ((b & 0x200u) << 19);
        }
        h[0] = h2_fma(h2_sub(h2_bytes01(lo), bias), d, m);
        h[1] = h2_fma(h2_sub(h2_bytes23(lo), bias), d, m);
        h[2] = h2_fma(h2_sub(h2_bytes01(hi), bias), d, m);
        h[3] = h2_fma(h2_sub(h2_bytes23(hi), bias), d, m);
    }
}

// Queues raw superchunk s (128 MT rows x 8 blocks = BS / 2 pieces of 16
// bytes per row) into `raw` (row stride 8 BS); rows past the job's are
// copied from its first row (never stored).
template <int TY, int MT>
__device__ __forceinline__ void wr_issue_w(const u8* __restrict__ w, long long row_bytes, int row0,
                                           int m, int s, u8* raw, int t) {
    constexpr int BS = gr_type_size(TY), P = BS / 2, R = 128 * MT;
    // Not unrolled: the producer runs in 40 registers (setmaxnreg).
#pragma unroll 1
    for (int i0 = 0; i0 < R * P; i0 += 128) {
        const int i = i0 + t, r = i / P, pc = i - r * P;
        if (R * P % 128 != 0 && i >= R * P) break;
        const int gr = row0 + r < m ? row0 + r : row0;
        cp_async16(raw + r * 8 * BS + 16 * pc,
                   w + (long long)gr * row_bytes + (long long)s * 8 * BS + 16 * pc, 16);
    }
}

template <int TY, int MT>
__device__ __forceinline__ void wr_body(const MmJobs& J, const u16* __restrict__ x16, int n_all,
                                        int k) {
    constexpr int BS = gr_type_size(TY);
    constexpr int SR = wr_stages(BS, MT) / 8, SX = wr_stages(BS, MT) % 8;
    // Blocks per consumer wgmma group (GB: the fragments of 4 at MT = 1
    // take 32 registers; 104 registers at MT = 2 leave room for one),
    // activation chunks copied ahead (P) and raw superchunks' extra lead in
    // chunks (L). The producer at its step c waits for the consumers' group
    // that finishes chunk c + P - SX (and superchunk (c + P + L) / 4 - SR)
    // before it publishes chunk c, so that group must end before chunk c:
    // P <= SX - 2 with GB <= 4, and L = 4 only with three raw stages.
    constexpr int GB = MT == 1 ? 4 : 1;
    constexpr int P = SX >= 5 ? SX - 3 : SX - 2;
    constexpr int L = SR >= 3 ? 4 : 0;
    constexpr int RAW = wr_raw_bytes(BS, MT);
    extern __shared__ __align__(16) u8 wg_smem[];
    u32 s0 = (u32)__cvta_generic_to_shared(wg_smem);
    u8* sm = wg_smem + ((1024 - (s0 & 1023)) & 1023);
    u8* sx = sm;                     // SX x 128 tokens x 128 B
    u8* sraw = sx + SX * WR_BN * 128;  // SR x RAW
    u64* bars = (u64*)(sraw + SR * RAW);
    u64* full_x = bars;             // [SX], 128 producer arrivals
    u64* empty_x = bars + SX;       // [SX], 8 MT consumer warps
    u64* full_r = bars + 2 * SX;    // [SR], 128 producer arrivals
    u64* empty_r = full_r + SR;     // [SR], 8 MT consumer warps
    const MmJob jb = mm_job(J, blockIdx.y);
    const int m = jb.m, units = k / 32;
    const long long row_bytes = (long long)units * BS;
    const int row0 = jb.by * 128 * MT;
    const int n0 = blockIdx.x * WR_BN;
    const int n = min(WR_BN, n_all - n0);
    const u16* xb = x16 + (long long)n0 * k;
    const int nk = k / WG_BK;
    const int tid = threadIdx.x, wg = tid >> 7;
#define SX_(c) (sx + ((c) % SX) * WR_BN * 128)
#define SR_(s) (sraw + ((s) % SR) * RAW)

    if (tid == 0) {
        for (int i = 0; i < SX; i++) {
            mbar_init(full_x + i, 128);
            mbar_init(empty_x + i, 8 * MT);
        }
        for (int i = 0; i < SR; i++) {
            mbar_init(full_r + i, 128);
            mbar_init(empty_r + i, 8 * MT);
        }
    }
    __syncthreads();

    if (wg == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;" ::: "memory");
        const int t = tid;
        // Copy group j: activations j, raw superchunk 0 (j = 0) and raw
        // superchunk (j + L) / 4 when j + L is a multiple of 4.
        const int ns = nk / 4;
        auto issue = [&](int j) {
            if (!WG_NO_XCOPY) wg_issue_x<WR_BN, 128>(xb, n, k, j, SX_(j), t);
            const int s = (j + L) / 4;
            if ((j + L) % 4 == 0 && s >= 1 && s < ns) {
                // The slot's superchunk s - SR was released after the
                // consumers' group holding its last chunk, 4 s - 4 SR + 3.
                if (s >= SR) mbar_wait(empty_r + s % SR, ((s - SR) / SR) & 1);
                if (!WG_NO_WCOPY) wr_issue_w<TY, MT>(jb.w, row_bytes, row0, m, s, SR_(s), t);
            }
        };
        if (!WG_NO_WCOPY) wr_issue_w<TY, MT>(jb.w, row_bytes, row0, m, 0, SR_(0), t);
        for (int j = 0; j < P; j++) {
            issue(j);
            cp_async_commit();
        }
        for (int c = 0; c < nk; c++) {
            const int cc = c + P;
            if (cc < nk) {
                // The slot's chunk cc - SX was released after the
                // consumers' group holding it.
                if (cc >= SX) mbar_wait(empty_x + cc % SX, ((cc - SX) / SX) & 1);
                issue(cc);
            }
            cp_async_commit();
            cp_async_wait_group<P>();
            fence_proxy_async();
            mbar_arrive(full_x + c % SX);
            if ((c & 3) == 0) mbar_arrive(full_r + (c / 4) % SR);
        }
        cp_async_wait_all();
        return;
    }

    // Consumers: warpgroup cw < 2 MT owns rows 64 cw .. 64 cw + 63.
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(wr_consumer_regs(MT)) : "memory");
    const int cw = wg - 1, v = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2, q = lane & 3;
    float acc[64];
#pragma unroll
    for (int e = 0; e < 64; e++) acc[e] = 0.0f;
    // Raw row offsets of this lane's rows 64 cw + 16 v + g + 8 h.
    const int roff0 = (64 * cw + 16 * v + g) * 8 * BS, roff1 = roff0 + 8 * 8 * BS;
    // Blocks (32 values, two per chunk) in GB-block groups. A do-while (nk
    // >= 4): see the consumer loop above (ptxas C7515).
    int b = 0;
    do {
        u32 f[GB][2][4];
#pragma unroll
        for (int i = 0; i < GB; i++) {
            const int bb = b + i, cc = bb >> 1;
            if ((bb & 1) == 0) {
                if ((cc & 3) == 0) mbar_wait(full_r + (cc / 4) % SR, ((cc / 4) / SR) & 1);
                mbar_wait(full_x + cc % SX, (cc / SX) & 1);
            }
            const u8* rb = SR_(cc / 4) + (bb & 7) * BS;
            if (WG_NO_DECODE) {
#pragma unroll
                for (int e = 0; e < 4; e++) f[i][0][e] = f[i][1][e] = 0x3C003C00u ^ (u32)(bb & 1);
            } else {
                wr_frag<TY>(rb + roff0, q, f[i][0]);
                wr_frag<TY>(rb + roff1, q, f[i][1]);
            }
        }
#pragma unroll
        for (int e = 0; e < 64; e++) wg_reg_fence(acc[e]);
        wg_fence();
#pragma unroll
        for (int i = 0; i < GB; i++) {
            const int bb = b + i;
            const u32 b0 = (u32)__cvta_generic_to_shared(SX_(bb >> 1)) + 64 * (bb & 1);
#pragma unroll
            for (int s = 0; s < 2; s++)
                wgmma_ra_n128(acc, f[i][0][2 * s], f[i][1][2 * s], f[i][0][2 * s + 1],
                              f[i][1][2 * s + 1], wg_desc(b0 + 32 * s));
        }
        wg_commit();
        // Retire the group before the next one's fragments are made: ptxas
        // serializes every wgmma (advisory C7513) when registers feeding a
        // wgmma are written while an earlier one is in flight. The other
        // consumer warpgroups' wgmma overlap this one's decode.
        wg_wait<0>();
#pragma unroll
        for (int e = 0; e < 64; e++) wg_reg_fence(acc[e]);
        if (lane == 0) {
#pragma unroll
            for (int i = 0; i < GB; i++) {
                const int bb = b + i, cc = bb >> 1;
                if ((bb & 1) == 1) {
                    mbar_arrive(empty_x + cc % SX);
                    if ((cc & 3) == 3) mbar_arrive(empty_r + (cc / 4) % SR);
                }
            }
        }
        b += GB;
    } while (b < 2 * nk);
#undef SX_
#undef SR_

    // Accumulator layout as above: element 4 j + e is row 64 cw + 16 v + g
    // (+ 8 for e >= 2), token 8 j + 2 q (+ 1 for odd e).
    const int rbase = row0 + 64 * cw + 16 * v + g;
#pragma unroll
    for (int j = 0; j < WR_BN / 8; j++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int row = rbase + 8 * (e >> 1);
            int tk = 8 * j + 2 * q + (e & 1);
            if (tk < n && row < m)
                mm_store(jb.out + (long long)(n0 + tk) * m + row, acc[4 * j + e], jb.add);
        }
    }
}

#define WR_ENTRY(NAME, TY, MT)                                                               \
    static_assert(wr_smem_bytes(gr_type_size(TY), MT, wr_stages(gr_type_size(TY), MT) / 8,   \
                                wr_stages(gr_type_size(TY), MT) % 8) == WG_SMEM_##NAME,      \
                  "launch/matmul_wgmma.rs disagrees on " #NAME "'s shared memory");          \
    extern "C" __global__ void __launch_bounds__(WR_THREADS(MT), 1)                            \
        NAME(MmJobs J, const u16* __restrict__ x16, int n, int k) {                          \
        GRID_DEP();                                                                          \
        wr_body<TY, MT>(J, x16, n, k);                                                       \
    }
WR_ENTRY(mm_wr_q4_0_m1, TY_Q4_0, 1)
WR_ENTRY(mm_wr_q4_0_m2, TY_Q4_0, 2)
WR_ENTRY(mm_wr_q4_1_m1, TY_Q4_1, 1)
WR_ENTRY(mm_wr_q4_1_m2, TY_Q4_1, 2)
WR_ENTRY(mm_wr_q5_0_m1, TY_Q5_0, 1)
WR_ENTRY(mm_wr_q5_0_m2, TY_Q5_0, 2)
WR_ENTRY(mm_wr_q5_1_m1, TY_Q5_1, 1)
WR_ENTRY(mm_wr_q5_1_m2, TY_Q5_1, 2)
WR_ENTRY(mm_wr_q8_0_m1, TY_Q8_0, 1)
WR_ENTRY(mm_wr_q8_0_m2, TY_Q8_0, 2)
