// Prefill GEMM on Hopper tensor cores (wgmma, sm_90a; `fast` mode only) for
// the 32-value block types: out (n, m) (=, or +=) x16 (n, k) · wᵀ with the
// quantized weights decoded straight into the wgmma A fragments in
// registers, never to device memory (the cuBLAS path writes and re-reads a
// whole f16 copy of every matrix per call: about a quarter of an 8B
// model's prefill) nor to a shared f16 tile.
//
// Status: the default prefill GEMM on sm_90 for every type it decodes
// (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0; every shape with the tuning table's
// matmul.wgmma on, none with off: ops/matmul/wr.rs, wg_default_takes).
// On an H100 (2026-11-25) 8B Q4_0 pp512 ran at 27.0-27.3k tokens/s (with k
// splits for o and down) against the cuBLAS path's 20.9k and the F16
// model's 27.7-28.4k; 8B Q8_0 at 22.0k against 20.1k (Q5_0 then ran at
// 0.93x the cuBLAS path at 128 tokens per CTA). With decode and copies
// left out (timing only) 29.7k at 128 x 128: what binds is shared-memory
// bandwidth (the B reads of the wgmma, the activation and raw copies, the
// decode's loads), docs/PERF.md. 2026-11-26, with the thin last wave split
// in k (wr_tail) and the f16 activations written by the kernels before
// (no to_f16_wr in a prefill): 8B Q4_0 pp512 29.2k against F16's 27.8k
// (1.05x), Q8_0 23.4k (H100). Later that morning, with the raw weights
// by bulk tensor copies: Q4_0 31.0k, Q8_0 28.6k, F16 28.4k; Q5_0 27.9k
// and Q5_1 24.9k against their cuBLAS path's 20.8k and 20.7k (H100).
//
// CTA: 128 + 256 MT threads, warpgroup 0 the producer (setmaxnreg down to
// 40 registers at MT = 1, 24 at MT = 2), warpgroups 1 .. 2 MT the consumers
// (setmaxnreg up to 232 at MT = 1, 112 at MT = 2: BN / 2 f32 accumulators
// plus the fragments of NF blocks). Rows per CTA 128 MT: consumer cw owns
// rows 64 cw .. 64 cw + 63; tokens per CTA BN = 128, or 256 at MT = 1
// (wgmma m64nBNk16; each weight block decoded and copied once for 256
// tokens); B = the activation chunk, K-major in the 128-byte swizzle.
//
// Fragment of A (the mma.m16n8k16 layout, per warp v of a warpgroup over
// rows 16 v .. 16 v + 15 of its m64 tile): lane (g = lane / 4, q = lane %
// 4) holds rows g and g + 8, columns 2q, 2q + 1 (registers 0, 1) and 2q +
// 8, 2q + 9 (registers 2, 3) of each k16 step. A 32-block is two k16
// steps, so per row and block a lane needs values 2q, 2q + 1, 2q + 8, 2q +
// 9 and the same + 16: for the 4- and 5-bit types the low and high nibbles
// of four qs bytes, for Q8_0 eight qs bytes (wr_frag).
//
// The k range runs in chunks of WG_BK = 64 values (one 128-byte row of f16
// per token); raw weights in superchunks of 256 values (four chunks: eight
// 32-blocks, a multiple of 16 bytes for every type, so rows start 16-byte
// aligned when k is a multiple of 256). Activations in SX chunk stages,
// written by to_f16_wr in the shared layout so that one bulk copy (the
// copy engine) per 128 tokens moves a chunk; raw weights in SR superchunk
// stages (MT x 128 rows) by one 2-D bulk tensor copy each (a tensor map per
// job, made on the host: JobMaps). The producer's 128 threads copying them
// by cp.async instead (WR_TMA=0) ran 8B Q8_0 prefill 18-22% slower and
// Q4_0 3-5% (H100, 2026-11-26); one bulk copy per 144-byte row ran the
// whole kernel at half speed (2026-11-25). Each stage
// has a full barrier and an empty barrier (one arrival per consumer warp
// once the stage's last reader retired). Consumers commit one wgmma group
// per 32-block (two instructions) and decode later blocks while earlier
// groups run (the loop's comment).
//
// Shared memory (dynamic, wr_smem_bytes): alignment slack, sx (SX x BN
// tokens x 128 B), raw (SR x 128 MT rows x 8 blocks), mbarriers.
// Grid: (ceil(n / BN), CTA rows of the job table J (128 MT weight rows
// each; with a wave tail, its rows once per k range: wr_body), k splits).
// Requirements (ops/matmul/wgmma.rs): k a multiple of 256,
// weights 16-byte aligned, x16 ceil(n / BN) x BN / 128 tiles of 128 tokens
// x k f16 in to_f16_wr's layout, 16-byte aligned.

#define WG_BK 64
#define WG_SMEM_MAX 232448
// Raw weights by one 2-D bulk tensor copy per superchunk (the copy engine,
// a tensor map per job: JobMaps) or, with WR_TMA=0, by the producer's
// cp.async (docs/PERF.md: 2026-11-26, Q8_0 prefill).
#ifndef WR_TMA
#define WR_TMA 1
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
// Keeps the compiler from moving accumulator reads or writes across the
// asynchronous wgmma window.
__device__ __forceinline__ void wg_reg_fence(float& r) { asm volatile("" : "+f"(r)::"memory"); }

// Operand text and constraints of the accumulators d[0..63].
#define WG_R64                                                                        \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, "     \
    "%17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "     \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, "     \
    "%47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, "     \
    "%62, %63"
#define WG_ACC8(i)                                                                    \
    "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]),       \
        "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define WG_ACC64(i)                                                                   \
    WG_ACC8(i), WG_ACC8(i + 8), WG_ACC8(i + 16), WG_ACC8(i + 24), WG_ACC8(i + 32),    \
        WG_ACC8(i + 40), WG_ACC8(i + 48), WG_ACC8(i + 56)

// mbar_init, mbar_arrive, mbar_expect, bulk_g2s and mbar_wait: common.cuh.
// Tokens per tile of to_f16_wr's layout (a CTA takes BN = 128 or 256).
#define WR_BN 128
#define WG_R128 \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, " \
    "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
    "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, " \
    "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
    "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define WG_ACC128(i) WG_ACC64(i), WG_ACC64(i + 64)
#define WR_THREADS(MT) (128 + 256 * (MT))
// Registers per thread after setmaxnreg, producer and consumers. An
// increase waits until the CTA's pool (the launch's registers per thread,
// 65,536 / threads rounded down to 8, times the threads) has them, so both
// must fit it: consumers at 112 with the producer at 40 (MT = 2) hung.
__host__ __device__ constexpr int wr_producer_regs(int mt) { return mt == 1 ? 40 : 24; }
__host__ __device__ constexpr int wr_consumer_regs(int mt) { return mt == 1 ? 232 : 112; }
__host__ __device__ constexpr bool wr_regs_fit(int mt) {
    return 128 * wr_producer_regs(mt) + 256 * mt * wr_consumer_regs(mt) <=
           WR_THREADS(mt) * ((65536 / WR_THREADS(mt)) & ~7);
}
static_assert(wr_regs_fit(1) && wr_regs_fit(2), "setmaxnreg exceeds the CTA's registers");
__host__ __device__ constexpr int wr_raw_bytes(int bs, int mt) { return 128 * mt * 8 * bs; }
__host__ __device__ constexpr int wr_smem_bytes(int bs, int mt, int sr, int sx, int bn) {
    return 1024 + sx * bn * 128 + sr * wr_raw_bytes(bs, mt) + 256;
}
// Stage counts (raw superchunks sr, activation chunks sx): the first of
// (3, 6), (3, 5), (2, 6), (2, 5), (2, 4) that fits; encoded as 8 sr + sx
// (ops/matmul/wr.rs mirrors it; WR_ENTRY checks at compile time).
__host__ __device__ constexpr int wr_stages(int bs, int mt, int bn) {
    const int c[5][2] = {{3, 6}, {3, 5}, {2, 6}, {2, 5}, {2, 4}};
    for (int i = 0; i < 5; i++)
        if (wr_smem_bytes(bs, mt, c[i][0], c[i][1], bn) <= WG_SMEM_MAX)
            return 8 * c[i][0] + c[i][1];
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

// The same with N = 256 tokens (128 accumulators).
__device__ __forceinline__ void wgmma_ra_n256(float* d, u32 a0, u32 a1, u32 a2, u32 a3,
                                              unsigned long long b) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 {" WG_R128
                 "}, {%128, %129, %130, %131}, %132, p, 1, 1, 0;\n}\n"
                 : WG_ACC128(0)
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
            const u32 qh = (u32)ld_i2(blk + QH);
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

// Activations for the kernel: x (n, k) f32 as f16 in the layout of its
// shared chunks (f16wr_off, common.cuh), so that one bulk copy moves a
// chunk; zeros past n. One thread per 16-byte piece, `pieces` = tiles x
// 128 x k / 8 (k a multiple of 256, x 16-byte aligned).
// rms_norm_fast_f16wr, swiglu_f16wr and the prefill attention write the
// same bits for the matmul after them.
extern "C" __global__ void to_f16_wr(const float* __restrict__ x, int n, int k, long long pieces,
                                     u16* __restrict__ out) {
    GRID_DEP();
    f16wr_piece(out, n, k, pieces, [&](long long o, float4* r) {
        const float4* src = (const float4*)(x + o);
        r[0] = src[0];
        r[1] = src[1];
    });
}

template <int TY, int MT, int BN>
__device__ __forceinline__ void wr_body(const MmJobs& J, const JobMaps& maps,
                                        const u16* __restrict__ x16, int n_all, int k,
                                        long long pstride, int tail_from, int tail_sp,
                                        float* __restrict__ tail_part) {
    constexpr int BS = gr_type_size(TY);
    constexpr int SR = wr_stages(BS, MT, BN) / 8, SX = wr_stages(BS, MT, BN) % 8;
    static_assert(BN == 128 || (BN == 256 && MT == 1), "256 tokens: 128 accumulators, MT = 1 only");
    constexpr int RAW = wr_raw_bytes(BS, MT);
    extern __shared__ __align__(16) u8 wg_smem[];
    u32 s0 = (u32)__cvta_generic_to_shared(wg_smem);
    u8* sm = wg_smem + ((1024 - (s0 & 1023)) & 1023);
    u8* sx = sm;                    // SX x BN tokens x 128 B
    u8* sraw = sx + SX * BN * 128;  // SR x RAW
    u64* bars = (u64*)(sraw + SR * RAW);
    u64* full_x = bars;           // [SX], one arrival + BN x 128 bytes of bulk copies
    u64* empty_x = bars + SX;     // [SX], 8 MT consumer warps
    u64* full_r = bars + 2 * SX;  // [SR], 128 producer threads' cp.async (noinc)
    u64* empty_r = full_r + SR;   // [SR], 8 MT consumer warps
    // The wave tail (tail_from < gridDim.y): CTA rows from tail_from on
    // are the launch's last, partly filled wave; the host splits each of
    // their tiles in tail_sp k ranges, grid rows tail_from + z tr .. + tr
    // - 1 (tr = the tail's CTA rows) taking range z of CTA rows tail_from
    // .. + tr - 1. Their partial tiles go to tail_part, tile-local (token
    // tk, row rl at tk x 128 MT + rl), range z's at z x the tail's tiles
    // (wr_tail_sum adds them in z order). Without a tail, tail_from =
    // gridDim.y and tail_sp = 1.
    int by = blockIdx.y, z = blockIdx.z, zs = gridDim.z;
    const bool tail = by >= tail_from;
    float* tail_tile = nullptr;
    if (tail) {
        const int tr = ((int)gridDim.y - tail_from) / tail_sp, t = by - tail_from;
        z = t / tr;
        zs = tail_sp;
        by = tail_from + t % tr;
        tail_tile = tail_part + ((long long)(z * tr + t % tr) * gridDim.x + blockIdx.x) *
                                    (BN * 128 * MT);
    }
    MmJob jb = mm_job(J, by);
    const int m = jb.m, units = k / 32;
    const long long row_bytes = (long long)units * BS;
    const int row0 = jb.by * 128 * MT;
    const int n0 = blockIdx.x * BN;
    const int n = min(BN, n_all - n0);
    // Split k (grid z = splits, or the tail's ranges): this CTA's nk chunks
    // start at chunk c0, a superchunk boundary (the host splits k / 256
    // evenly); grid-z partial sums go to jb.out + z pstride (the host's
    // partial buffer, added in split order by split_sum_jobs; jb.add is
    // then 0).
    const int nk_all = k / WG_BK, nk = nk_all / zs, c0 = z * nk;
    jb.w += (long long)(c0 / 4) * 8 * BS;
    jb.out += (long long)blockIdx.z * pstride;
    // The CTA's BN / 128 tiles of to_f16_wr's layout (chunk c of tile T at
    // T nk_all + c), from chunk c0.
    const u16* xt = x16 + (long long)blockIdx.x * (BN / WR_BN) * nk_all * (WR_BN * 64) +
                    (long long)c0 * (WR_BN * 64);
    const int tid = threadIdx.x, wg = tid >> 7;
#define SX_(c) (sx + ((c) % SX) * BN * 128)
#define SR_(s) (sraw + ((s) % SR) * RAW)

    if (tid == 0) {
        for (int i = 0; i < SX; i++) {
            mbar_init(full_x + i, 1);
            mbar_init(empty_x + i, 8 * MT);
        }
        for (int i = 0; i < SR; i++) {
            mbar_init(full_r + i, WR_TMA ? 1 : 128);
            mbar_init(empty_r + i, 8 * MT);
        }
        // The copy engine (async proxy) completes on these barriers.
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();

    if (wg == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(wr_producer_regs(MT)) : "memory");
        // Raw superchunks by one bulk tensor copy from thread 0 (WR_TMA),
        // or by cp.async from the warpgroup's 128 threads, each arriving on
        // the full barrier once its own copies have landed (arrive.noinc).
        // Activations by bulk copy from thread 0.
        const int t = tid;
        for (int c = 0; c < nk; c++) {
            if ((c & 3) == 0) {
                // Raw superchunk s: 128 MT row pieces of 8 BS bytes. Its
                // slot's superchunk s - SR was released once the consumers
                // had decoded that one's last block.
                const int s = c / 4;
                if (s >= SR) mbar_wait(empty_r + s % SR, ((s - SR) / SR) & 1);
                u8* dst = SR_(s);
                if (WR_TMA) {
                    // Box (BS u64 = 8 blocks, 128 MT rows) at superchunk
                    // c0 / 4 + s, row row0 of the job; rows past the job's
                    // arrive as zeros (never stored).
                    if (t == 0) {
                        mbar_expect(full_r + s % SR, RAW);
                        tma_2d_g2s(dst, &maps.m[jb.j], (c0 / 4 + s) * BS, row0,
                                   full_r + s % SR);
                    }
                } else {
                    const u8* src = jb.w + (long long)s * 8 * BS;
                    constexpr int P = BS / 2;  // 16-byte pieces per row
#pragma unroll 1
                    for (int i = t; i < 128 * MT * P; i += 128) {
                        const int r = i / P, pc = i - r * P;
                        // Rows past the job's: its first row (never stored).
                        const int gr = row0 + r < m ? row0 + r : row0;
                        cp_async16(dst + r * 8 * BS + 16 * pc, src + gr * row_bytes + 16 * pc,
                                   16);
                    }
                    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(
                                     (u32)__cvta_generic_to_shared(full_r + s % SR))
                                 : "memory");
                }
            }
            // Activation chunk c: 16 KiB, already in the shared layout. Its
            // slot's chunk c - SX was released once that one's last wgmma
            // group retired.
            if (c >= SX) mbar_wait(empty_x + c % SX, ((c - SX) / SX) & 1);
            if (t == 0) {
                mbar_expect(full_x + c % SX, BN * 128);
#pragma unroll
                for (int h = 0; h < BN / WR_BN; h++)
                    bulk_g2s(SX_(c) + h * WR_BN * 128,
                             xt + ((long long)h * nk_all + c) * (WR_BN * 64), WR_BN * 128,
                             full_x + c % SX);
            }
        }
        cp_async_wait_all();
        return;
    }

    // Consumers: warpgroup cw < 2 MT owns rows 64 cw .. 64 cw + 63.
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(wr_consumer_regs(MT)) : "memory");
    const int cw = wg - 1, v = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2, q = lane & 3;
    float acc[BN / 2];
#pragma unroll
    for (int e = 0; e < BN / 2; e++) acc[e] = 0.0f;
    // Raw row offsets of this lane's rows 64 cw + 16 v + g + 8 h.
    const int roff0 = (64 * cw + 16 * v + g) * 8 * BS, roff1 = roff0 + 8 * 8 * BS;
    // Blocks b = 0 .. 2 nk - 1 (chunk b / 2, its half b % 2), one wgmma
    // group each (two k16 steps) from fragment array f[b % NF] (rows g and g
    // + 8: 8 registers). After committing block b's group a consumer waits
    // until at most W groups are in flight (block b - W retired), then
    // decodes block b + LA into f[(b + LA) % NF], whose last reader, block
    // b + LA - NF <= b - W, has retired: no register feeding an in-flight
    // wgmma is written, so ptxas keeps the wgmma asynchronous (its advisory
    // C7513 otherwise), and the decode runs while W groups keep the tensor
    // cores busy. MT = 1 (232 registers): four arrays, two blocks ahead, two
    // groups in flight; MT = 2 (112 registers): two, one, one.
    constexpr int NF = MT == 1 ? 4 : 2, LA = NF / 2, W = NF / 2;
    static_assert(LA + W <= NF, "a decode would overwrite an in-flight fragment");
    const int nb = 2 * nk;  // a multiple of NF: nk is a multiple of 4
    u32 f[NF][8];
    auto decode = [&](int b, u32* fr) {
        const int c = b >> 1;
        if ((b & 1) == 0) {
            // Chunk c's raw blocks (at a superchunk start) and activations.
            if ((c & 3) == 0) mbar_wait(full_r + (c / 4) % SR, ((c / 4) / SR) & 1);
            mbar_wait(full_x + c % SX, (c / SX) & 1);
        }
        const u8* rb = SR_(c / 4) + (2 * (c & 3) + (b & 1)) * BS;
        wr_frag<TY>(rb + roff0, q, fr);
        wr_frag<TY>(rb + roff1, q, fr + 4);
    };
#pragma unroll
    for (int j = 0; j < LA; j++) decode(j, f[j]);
#pragma unroll
    for (int e = 0; e < BN / 2; e++) wg_reg_fence(acc[e]);
    // A do-while (nb >= NF): a zero-trip path would join zeroed
    // accumulators with the loop's, and ptxas then serializes every wgmma
    // (its advisory C7515).
    int b0 = 0;
    do {
#pragma unroll
        for (int u = 0; u < NF; u++) {
            const int b = b0 + u;
            const u32 xd = (u32)__cvta_generic_to_shared(SX_(b >> 1)) + 64 * (b & 1);
            const u32* fr = f[u];
            wg_fence();
#pragma unroll
            for (int s = 0; s < 2; s++)
                if (BN == 128)
                    wgmma_ra_n128(acc, fr[2 * s], fr[4 + 2 * s], fr[2 * s + 1],
                                  fr[4 + 2 * s + 1], wg_desc(xd + 32 * s));
                else
                    wgmma_ra_n256(acc, fr[2 * s], fr[4 + 2 * s], fr[2 * s + 1],
                                  fr[4 + 2 * s + 1], wg_desc(xd + 32 * s));
            wg_commit();
            wg_wait<W>();
            // Block b - W retired: at a chunk's second half, the last reader
            // of the chunk's activations (and, at a superchunk's end, of its
            // raw blocks: the decode read those before).
            const int r = b - W;
            if (r >= 0 && (r & 1) && lane == 0) {
                mbar_arrive(empty_x + (r >> 1) % SX);
                if (((r >> 1) & 3) == 3) mbar_arrive(empty_r + ((r >> 1) / 4) % SR);
            }
            if (b + LA < nb) decode(b + LA, f[(u + LA) % NF]);
        }
        b0 += NF;
    } while (b0 < nb);
    wg_wait<0>();
#pragma unroll
    for (int e = 0; e < BN / 2; e++) wg_reg_fence(acc[e]);
#undef SX_
#undef SR_

    // Accumulator layout of m64nNk16: element 4 j + e is row 64 cw + 16 v +
    // g (+ 8 for e >= 2), token 8 j + 2 q (+ 1 for odd e).
    const int rbase = row0 + 64 * cw + 16 * v + g;
    if (tail) {
        // The whole tile, rows and tokens past the job's too (wr_tail_sum
        // skips them).
        const int rl = 64 * cw + 16 * v + g;
#pragma unroll
        for (int j = 0; j < BN / 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                tail_tile[(8 * j + 2 * q + (e & 1)) * (128 * MT) + rl + 8 * (e >> 1)] =
                    acc[4 * j + e];
        return;
    }
#pragma unroll
    for (int j = 0; j < BN / 8; j++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int row = rbase + 8 * (e >> 1);
            int tk = 8 * j + 2 * q + (e & 1);
            if (tk < n && row < m)
                mm_store(jb.out + (long long)(n0 + tk) * m + row, acc[4 * j + e], jb.add);
        }
    }
}

// The wave tail's partial tiles added in k-range order and stored (=, or
// += for an adding job). Tail tile tt = blockIdx.y (CTA row tail_from +
// tt / tiles_x, token tile tt % tiles_x) holds bn tokens x rpc rows (rpc
// = 128 MT), token tk, row rl at tk x rpc + rl; range z's copy of the
// tail at z x len (len = the tail's tiles x bn x rpc). Each thread adds
// four consecutive rows of one token (rpc is a multiple of 4); rows and
// tokens past the job's are skipped. 32-bit index math: the host checks
// that sp x len fits an int.
extern "C" __global__ void wr_tail_sum(const float* __restrict__ part, int len, int sp,
                                       int tail_from, int tiles_x, int bn, int rpc, int n,
                                       MmJobs J) {
    GRID_DEP();
    const int tt = blockIdx.y, e = 4 * (blockIdx.x * blockDim.x + threadIdx.x);
    if (e >= bn * rpc) return;
    const int tk = e / rpc, rl = e - tk * rpc;
    const MmJob jb = mm_job(J, tail_from + tt / tiles_x);
    const int row = jb.by * rpc + rl, tok = (tt % tiles_x) * bn + tk;
    if (row >= jb.m || tok >= n) return;
    const int i = tt * bn * rpc + e;
    float4 v = *(const float4*)(part + i);
    for (int s = 1; s < sp; s++) {
        const float4 p = *(const float4*)(part + s * len + i);
        v.x += p.x;
        v.y += p.y;
        v.z += p.z;
        v.w += p.w;
    }
    float* o = jb.out + (long long)tok * jb.m + row;
    if (row + 4 <= jb.m && (jb.m & 3) == 0 && ((unsigned long long)o & 15) == 0) {
        if (jb.add) {
            const float4 p = *(const float4*)o;
            v = make_float4(q_add(p.x, v.x), q_add(p.y, v.y), q_add(p.z, v.z), q_add(p.w, v.w));
        }
        *(float4*)o = v;
    } else {
        const float w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int r = 0; r < 4; r++)
            if (row + r < jb.m) mm_store(o + r, w[r], jb.add);
    }
}

#define WR_ENTRY(NAME, TY, MT, BN)                                                           \
    static_assert(wr_smem_bytes(gr_type_size(TY), MT, wr_stages(gr_type_size(TY), MT, BN) / 8, \
                                wr_stages(gr_type_size(TY), MT, BN) % 8, BN) ==                \
                      WG_SMEM_##NAME,                                                          \
                  "ops/matmul/wr.rs disagrees on " #NAME "'s shared memory");            \
    extern "C" __global__ void __launch_bounds__(WR_THREADS(MT), 1)                              \
        NAME(MmJobs J, const u16* __restrict__ x16, int n, int k, long long pstride,           \
             int tail_from, int tail_sp, float* __restrict__ tail_part,                        \
             const __grid_constant__ JobMaps maps) {                                            \
        GRID_DEP();                                                                            \
        wr_body<TY, MT, BN>(J, maps, x16, n, k, pstride, tail_from, tail_sp, tail_part);       \
    }
// mm_wr_<type>_m<MT>: 128 MT rows x 128 tokens; _n256: 128 rows x 256.
WR_ENTRY(mm_wr_q4_0_m1, TY_Q4_0, 1, 128)
WR_ENTRY(mm_wr_q4_0_m2, TY_Q4_0, 2, 128)
WR_ENTRY(mm_wr_q4_0_n256, TY_Q4_0, 1, 256)
WR_ENTRY(mm_wr_q4_1_m1, TY_Q4_1, 1, 128)
WR_ENTRY(mm_wr_q4_1_m2, TY_Q4_1, 2, 128)
WR_ENTRY(mm_wr_q4_1_n256, TY_Q4_1, 1, 256)
WR_ENTRY(mm_wr_q5_0_m1, TY_Q5_0, 1, 128)
WR_ENTRY(mm_wr_q5_0_m2, TY_Q5_0, 2, 128)
WR_ENTRY(mm_wr_q5_0_n256, TY_Q5_0, 1, 256)
WR_ENTRY(mm_wr_q5_1_m1, TY_Q5_1, 1, 128)
WR_ENTRY(mm_wr_q5_1_m2, TY_Q5_1, 2, 128)
WR_ENTRY(mm_wr_q5_1_n256, TY_Q5_1, 1, 256)
WR_ENTRY(mm_wr_q8_0_m1, TY_Q8_0, 1, 128)
WR_ENTRY(mm_wr_q8_0_m2, TY_Q8_0, 2, 128)
WR_ENTRY(mm_wr_q8_0_n256, TY_Q8_0, 1, 256)
