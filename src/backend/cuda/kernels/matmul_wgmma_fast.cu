// Prefill GEMM on Hopper tensor cores (wgmma, sm_90a; `fast` mode only) for
// the 32-value block types: out (n, m) (=, or +=) x16 (n, k) · wᵀ with the
// quantized weights dequantized to f16 tile by tile in shared memory, never
// to device memory (the cuBLAS path writes and re-reads a whole f16 copy of
// every matrix per call: about a quarter of an 8B model's prefill).
//
// Status: opt-in (QUIRE_WGMMA=1; compiled only then). Correct (ops
// mat_muls against the cpu), but on an H100 (2026-11-24) it ran 8B Q4_0
// pp512 at 13.3k tokens/s against the cuBLAS path's 21.0k (0.63x); in
// timing-only builds, 19.9k with the weight copies left out and 28.1k with
// every copy and the decode left out (the F16 model's cuBLAS speed). The per-thread 4-byte cp.async copies of
// the raw weights bind it, not the tensor cores: the next step is bulk
// tensor copies (TMA) for both operands (docs/PERF.md).
//
// CTA: two warpgroups (256 threads) own 128 weight rows (warpgroup g: rows
// 64 g .. 64 g + 63) and BN = 128 or 256 activation rows (tokens). The k
// range runs in chunks of WG_BK = 64 values (two quant blocks per weight
// row; one 128-byte row of f16 per weight row or token). At step c:
//   - wgmma(c): each warpgroup runs 4 wgmma.m64n<BN>k16 (f16 in, f32
//     accumulate, both operands K-major in shared memory) on the f16 weight
//     tile sw[c % 3] and the activation stage sx[c % WG_SX], and keeps them
//     in flight across the next step's barrier (wait_group 1), so the tensor
//     cores do not idle while the CTA synchronizes;
//   - meanwhile every thread decodes one 32-value unit of raw chunk c + 1
//     into sw[(c + 1) % 3] (unit_f16_regs: the same f16 values as
//     dequant_f16, so the cuBLAS path's products up to the summation order)
//     and queues the cp.async copies of activation chunk c + 2 (16-byte
//     pieces) and raw weight chunk c + 3 (4-byte words; WG_SR stages).
// The copies of one step form one commit group, so a step waits for the
// group of two steps back: activations c and raw weights c + 1.
// f16 tiles use the 128-byte swizzle: 16-byte piece p of row r is stored at
// piece p ^ (r % 8) (tiles 1024-byte aligned), so the decoder's stores and
// the tensor cores' reads spread over all banks.
//
// Shared memory (dynamic, WG_SMEM(BN) bytes): alignment slack, sw (3 x 128
// rows x 128 B), sx (WG_SX x BN rows x 128 B), raw (WG_SR x WG_RAW).
//
// Grid: (ceil(n / BN), CTA rows of the job table J (128 weight rows each),
// 1); block 256 threads. Requirements (launch/matmul_wgmma.rs): k a
// multiple of 32, every weight row a multiple of 4 bytes, x16 (n, k) f16.

#define WG_BK 64
#define WG_SX 4
#define WG_SR 3
// Raw bytes of one stage: 128 rows x 2 blocks of at most 34 bytes (Q8_0),
// plus slack for ld_words' reads up to 2 bytes past a block.
#define WG_RAW (128 * 68 + 128)
#define WG_SMEM(BN) (1024 + 3 * 128 * 128 + WG_SX * (BN) * 128 + WG_SR * WG_RAW)

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

// d (64 x 128 f32, the wgmma accumulator layout) += A (64 x 16, desc a) ·
// B (16 x 128, desc b), both K-major f16 in shared memory.
__device__ __forceinline__ void wgmma_n128(float* d, unsigned long long a, unsigned long long b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, "
        "%17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, "
        "%47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, "
        "%62, %63 "
        "}, %64, %65, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
          "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]),
          "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]),
          "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
          "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]),
          "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]),
          "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]),
          "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
          "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]),
          "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]),
          "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(a), "l"(b), "r"(1));
}

// d (64 x 256 f32, the wgmma accumulator layout) += A (64 x 16, desc a) ·
// B (16 x 256, desc b), both K-major f16 in shared memory.
__device__ __forceinline__ void wgmma_n256(float* d, unsigned long long a, unsigned long long b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, "
        "%17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, "
        "%47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, "
        "%62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, "
        "%77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, "
        "%92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, "
        "%106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, "
        "%118, %119, %120, %121, %122, %123, %124, %125, %126, %127 "
        "}, %128, %129, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
          "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]),
          "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]),
          "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
          "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]),
          "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]),
          "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]),
          "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
          "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]),
          "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]),
          "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]),
          "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]),
          "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]),
          "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]),
          "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]),
          "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]),
          "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]),
          "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]),
          "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]),
          "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]),
          "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]),
          "+f"(d[127])
        : "l"(a), "l"(b), "r"(1));
}

template <int BN>
__device__ __forceinline__ void wgmma_bn(float* d, unsigned long long a, unsigned long long b) {
    if (BN == 256)
        wgmma_n256(d, a, b);
    else
        wgmma_n128(d, a, b);
}

// Queues activation chunk c (BN tokens x 8 pieces of 16 bytes; zeros past
// n or k) into stage sx. Thread t copies piece t % 8 of tokens t / 8 + 32 p.
template <int BN>
__device__ __forceinline__ void wg_issue_x(const u16* __restrict__ xb, int n, int k, int c,
                                           u8* sx) {
    const int tid = threadIdx.x, q = tid & 7, t0 = tid >> 3;
    const int kk = WG_BK * c + 8 * q;
    u8* dst = sx + t0 * 128 + ((q ^ (t0 & 7)) << 4);
    const u16* src = xb + (long long)t0 * k + kk;
#pragma unroll
    for (int p = 0; p < BN / 32; p++) {
        bool ok = t0 + 32 * p < n && kk < k;
        cp_async16(dst + 4096 * p, ok ? (const void*)(src + (long long)32 * p * k) : (const void*)xb,
                   ok ? 16 : 0);
    }
}

// Queues raw weight chunk c (this thread's half of row t / 2's WPR words;
// zeros past the job's rows or past k) into stage raw. `wrow`: the row's
// bytes (clamped to a valid row), `row_ok`: whether the row exists.
template <int TY>
__device__ __forceinline__ void wg_issue_w(const u8* __restrict__ wrow, bool row_ok, int units,
                                           int c, u8* raw_bytes) {
    u32* raw = (u32*)raw_bytes;
    constexpr int BS = gr_type_size(TY), WPR = 2 * BS / 4, H = (WPR + 1) / 2;
    const int tid = threadIdx.x, r = tid >> 1, w0 = (tid & 1) * H;
    const int valid = row_ok ? min(2, units - 2 * c) * BS : 0;  // bytes of the chunk
    const u8* src = wrow + (long long)c * 2 * BS;
#pragma unroll
    for (int i = 0; i < H; i++) {
        int wd = w0 + i;
        if (WPR % 2 != 0 && wd >= WPR) break;
        int bytes = max(0, min(4, valid - 4 * wd));
        cp_async4(raw + r * WPR + wd, bytes > 0 ? (const void*)(src + 4 * wd) : (const void*)wrow,
                  bytes);
    }
}

// Decodes this thread's unit of the raw chunk (row t / 2, unit t % 2) into
// the f16 tile sw.
template <int TY>
__device__ __forceinline__ void wg_decode(const u8* raw, u8* sw) {
    constexpr int WPR = 2 * gr_type_size(TY) / 4;
    const int r = threadIdx.x >> 1, j = threadIdx.x & 1;
    u32 h[16];
    unit_f16_regs<TY>(raw + 4 * WPR * r, j, true, h);
    u8* row = sw + 128 * r;
#pragma unroll
    for (int i = 0; i < 4; i++)
        *(uint4*)(row + (((4 * j + i) ^ (r & 7)) << 4)) =
            make_uint4(h[4 * i], h[4 * i + 1], h[4 * i + 2], h[4 * i + 3]);
}

template <int TY, int BN>
__device__ __forceinline__ void wg_body(const MmJobs& J, const u16* __restrict__ x16, int n_all,
                                        int k) {
    constexpr int BS = gr_type_size(TY), NACC = BN / 2;
    extern __shared__ __align__(16) u8 wg_smem[];
    u32 s0 = (u32)__cvta_generic_to_shared(wg_smem);
    u8* sm = wg_smem + ((1024 - (s0 & 1023)) & 1023);
    u8* sw = sm;                        // 3 x 128 x 128 B
    u8* sx = sw + 3 * 128 * 128;        // WG_SX x BN x 128 B
    u8* sraw = sx + WG_SX * BN * 128;   // WG_SR x WG_RAW
    const MmJob jb = mm_job(J, blockIdx.y);
    const int m = jb.m, units = k / 32;
    const long long row_bytes = (long long)units * BS;
    const int row0 = jb.by * 128;
    const int n0 = blockIdx.x * BN;
    const int n = min(BN, n_all - n0);
    const u16* xb = x16 + (long long)n0 * k;
    const int nk = (units + 1) / 2;
    const int tid = threadIdx.x, wg = tid >> 7;
    const int my_row = row0 + (tid >> 1);
    const bool row_ok = my_row < m;
    const u8* wrow = jb.w + (long long)(row_ok ? my_row : row0) * row_bytes;
#define SX(c) (sx + ((c) % WG_SX) * BN * 128)
#define SR(c) (sraw + ((c) % WG_SR) * WG_RAW)
#define SW(c) (sw + ((c) % 3) * 128 * 128)

    float acc[NACC];
#pragma unroll
    for (int e = 0; e < NACC; e++) acc[e] = 0.0f;

    // Group A: raw 0, activations 0, raw 1; group B: activations 1, raw 2.
    wg_issue_w<TY>(wrow, row_ok, units, 0, SR(0));
    wg_issue_x<BN>(xb, n, k, 0, SX(0));
    if (1 < nk) wg_issue_w<TY>(wrow, row_ok, units, 1, SR(1));
    cp_async_commit();
    if (1 < nk) wg_issue_x<BN>(xb, n, k, 1, SX(1));
    if (2 < nk) wg_issue_w<TY>(wrow, row_ok, units, 2, SR(2));
    cp_async_commit();
    cp_async_wait_group<1>();
    __syncthreads();
    wg_decode<TY>(SR(0), SW(0));

    for (int c = 0; c < nk; c++) {
        // This thread's copies of activations c and raw weights c + 1
        // landed; its stores to sw[c % 3] are ordered before the tensor
        // cores' reads. After the barrier every thread's are, and every
        // warpgroup has finished wgmma(c - 2): sw[(c + 1) % 3] and
        // activation stage (c + 2) % WG_SX are free, as is raw stage c % WG_SR
        // (decoded at step c - 1).
        cp_async_wait_group<1>();
        fence_proxy_async();
        __syncthreads();
        if (c + 2 < nk) wg_issue_x<BN>(xb, n, k, c + 2, SX(c + 2));
        if (c + 3 < nk) wg_issue_w<TY>(wrow, row_ok, units, c + 3, SR(c + 3));
        cp_async_commit();
        const u32 a0 = (u32)__cvta_generic_to_shared(SW(c)) + wg * 64 * 128;
        const u32 b0 = (u32)__cvta_generic_to_shared(SX(c));
#pragma unroll
        for (int e = 0; e < NACC; e++) wg_reg_fence(acc[e]);
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < WG_BK / 16; kk++)
            wgmma_bn<BN>(acc, wg_desc(a0 + 32 * kk), wg_desc(b0 + 32 * kk));
        wg_commit();
        if (c + 1 < nk) wg_decode<TY>(SR(c + 1), SW(c + 1));
        wg_wait<1>();
#pragma unroll
        for (int e = 0; e < NACC; e++) wg_reg_fence(acc[e]);
    }
    wg_wait<0>();
#pragma unroll
    for (int e = 0; e < NACC; e++) wg_reg_fence(acc[e]);
    cp_async_wait_all();
#undef SX
#undef SR
#undef SW

    // Accumulator layout of m64nNk16: warp v of the warpgroup holds rows
    // 16 v + lane / 4 (+ 8 for elements 2, 3 of each group of four) and, in
    // group j, columns 8 j + 2 (lane % 4) (+ 1 for odd elements).
    const int v = (tid >> 5) & 3, lane = tid & 31;
    const int rbase = row0 + 64 * wg + 16 * v + (lane >> 2);
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

#define WG_ENTRY(NAME, TY, BN)                                                              \
    extern "C" __global__ void __launch_bounds__(256, 1)                                    \
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
