// Quire canonical arithmetic for CUDA (see src/backend/cpu/canon.rs, whose
// top doc comment is the definition). Every float operation below is an
// explicitly rounded intrinsic (__fadd_rn, __fmul_rn, ...), which the
// compiler never contracts into an FMA; kernels are also compiled with
// --fmad=false. Constants (QC_*) are injected by the host as exact bit
// patterns taken from the Rust constants.

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef long long i64;
typedef unsigned long long u64;

// First statement of every kernel. On sm_90+ decode graphs link kernel
// nodes by programmatic edges (src/backend/cuda/pdl.rs), so a kernel's CTAs
// may start while the kernel before it still runs: griddepcontrol.wait
// blocks until that grid has completed and its memory is visible (and so,
// transitively, every earlier one), then launch_dependents lets the next
// kernel's CTAs be scheduled while this one runs. Without a programmatic
// edge both are no-ops. tests/cuda_nvrtc.rs checks every entry has it.
// GRID_DEP_TRIGGER_FIRST=1 (tuning knob) triggers before waiting, which
// lets a chain of kernels' CTAs be placed ahead; the wait still orders
// every read and write, so the knob changes no result. Measured slower on
// an H100 (SmolLM2 Q4_0 tg128 fast 1,120 vs 1,248 tok/s, exact 771 vs 815).
#ifndef GRID_DEP_TRIGGER_FIRST
#define GRID_DEP_TRIGGER_FIRST 0
#endif
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define GRID_DEP()                                                                \
    do {                                                                          \
        if (GRID_DEP_TRIGGER_FIRST) asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); \
        asm volatile("griddepcontrol.wait;" ::: "memory");                        \
        if (!GRID_DEP_TRIGGER_FIRST) asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); \
    } while (0)
#else
#define GRID_DEP() \
    do {           \
    } while (0)
#endif

// The parameters of the per-(row, head) paged attention kernels
// (paged_attention, paged_attention_par / _par2, paged_attention_fast):
// the op's fields, in the launch's order.
#define ATT_ROWHEAD_PARAMS                                                                \
    const float *__restrict__ q, int n_rows, int n_heads, int n_kv_heads, int head_dim,   \
        int block_size, float scale, const u16 *__restrict__ kc,                          \
        const u16 *__restrict__ vc, const u32 *__restrict__ tables,                       \
        const u32 *__restrict__ table_off, const u32 *__restrict__ row_seq,               \
        const u32 *__restrict__ positions, float *__restrict__ out

// Hopper thread-block cluster barrier: every thread of every CTA of the
// cluster arrives (release: its earlier writes, global and shared, are
// visible to the cluster) and waits (acquire). The host launches clusters
// only on sm_90+, so the kernels call it only there.
__device__ __forceinline__ void att_cluster_sync() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive.release.aligned;\n"
                 "barrier.cluster.wait.acquire.aligned;" ::: "memory");
#else
    __trap();
#endif
}

// The cluster's size, and this CTA's rank in *rank (1 and 0 before sm_90,
// where the host launches no clusters).
__device__ __forceinline__ int cl_shape(int* rank) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    u32 r, n;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(n));
    *rank = (int)r;
    return (int)n;
#else
    *rank = 0;
    return 1;
#endif
}
// The cluster barrier (att_cluster_sync: shared-memory writes before it
// are visible to every CTA of the cluster after it); a CTA barrier
// without a cluster.
__device__ __forceinline__ void cl_sync(int csize) {
    if (csize > 1)
        att_cluster_sync();
    else
        __syncthreads();
}
// The shared address of p (this kernel's shared memory) in cluster CTA
// `rank` (before sm_90: p's own, the only CTA).
__device__ __forceinline__ u32 cl_peer(const void* p, int rank) {
    u32 a = (u32)__cvta_generic_to_shared(p);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    u32 ra;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(ra) : "r"(a), "r"(rank));
    return ra;
#else
    return a;
#endif
}

// mbarriers and bulk copies (sm_90+: the copy engine, completing on an
// mbarrier's transaction count). Used by the wgmma GEMM and the bulk
// matvec (matmul_fast.cu); kernels of older devices never call them.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
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
// Arrives once and expects `bytes` more bytes of bulk copies this phase.
__device__ __forceinline__ void mbar_expect(u64* bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(
                     (u32)__cvta_generic_to_shared(bar)),
                 "r"(bytes)
                 : "memory");
}
// Bulk copy (the copy engine, async proxy) of `bytes` (a multiple of 16,
// both addresses 16-byte aligned) from global to this CTA's shared memory,
// completing on `bar`'s transaction count.
__device__ __forceinline__ void bulk_g2s(void* dst, const void* src, u32 bytes, u64* bar) {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
            "r"((u32)__cvta_generic_to_shared(dst)),
        "l"(src), "r"(bytes), "r"((u32)__cvta_generic_to_shared(bar))
        : "memory");
}
struct TmaMap;  // below, with the job tables
// Box (x, y) of tensor map `map` (2-D, tile mode) to this CTA's shared
// memory at dst (128-byte aligned), completing on bar's transaction count.
__device__ __forceinline__ void tma_2d_g2s(void* dst, const TmaMap* map, int x, int y, u64* bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%2, %3}], [%4];" ::"r"((u32)__cvta_generic_to_shared(dst)),
        "l"(map), "r"(x), "r"(y), "r"((u32)__cvta_generic_to_shared(bar))
        : "memory");
}
// The same for box (x, y, z) of a 3-D tensor map (the split attention's
// K/V tiles: attention_fast.cu).
__device__ __forceinline__ void tma_3d_g2s(void* dst, const TmaMap* map, int x, int y, int z,
                                           u64* bar) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%2, %3, %4}], [%5];" ::"r"((u32)__cvta_generic_to_shared(dst)),
        "l"(map), "r"(x), "r"(y), "r"(z), "r"((u32)__cvta_generic_to_shared(bar))
        : "memory");
}
// Whether the phase of parity `par` of the barrier has completed (waits
// a system-dependent while first).
__device__ __forceinline__ bool mbar_try(u64* bar, u32 par) {
    u32 a = (u32)__cvta_generic_to_shared(bar), done;
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(a), "r"(par)
        : "memory");
    return done != 0;
}
// Waits until the phase of parity `par` of the barrier has completed.
__device__ __forceinline__ void mbar_wait(u64* bar, u32 par) {
    while (!mbar_try(bar, par)) {
    }
}
#endif

// Data no kernel ever writes (weights) may be read before GRID_DEP()'s
// wait, while the previous kernel drains: prefetch_line fetches 128-byte
// line `line` of [p, p + bytes) into L2 (l2) or L1. Data that a
// predecessor writes must not be touched before the wait (L1 is not
// coherent with its stores). The rms_norm kernels prefetch their norm
// weights into L1 (thread t: line t; RMS_PREFETCH=0 turns it off).
#ifndef RMS_PREFETCH
#define RMS_PREFETCH 1
#endif
__device__ __forceinline__ void prefetch_line(const void* p, long long bytes, int line, bool l2) {
    unsigned long long a = ((unsigned long long)p & ~127ull) + 128ull * line;
    if (a >= (unsigned long long)p + bytes) return;
    if (l2)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(a));
    else
        asm volatile("prefetch.global.L1 [%0];" ::"l"(a));
}

// Float weight loads of the decode matvecs (FW_LOAD, tuning knob): weights
// are read once per step and never written on the device, so they may take
// the non-coherent path and skip L1 (keeping L1 for the activations every
// warp re-reads). 0: plain loads; 1: ld.global.nc.L1::no_allocate; 2: the
// same with an L2::256B prefetch hint (rows are streamed front to back).
// Measured on an H100 (2026-11-23, 8B F16 tg128): 0 / 1 / 2: 156.6 / 158.8
// / 159.3 tok/s. The same loads for the quantized kernels' 4-byte words
// (decode_unit) were far slower (8B Q4_0 366 -> 243), and decode_unit also
// reads weights staged in shared memory, which ld.global must not touch:
// those stay plain. ldw_u4 takes global addresses only. Loads only: no
// result depends on the knob. The default's asm is volatile, which keeps a
// lane's weight loads in program order: the schedule measured above (the
// non-volatile form compiles the float matvecs differently, unmeasured).
#ifndef FW_LOAD
#define FW_LOAD 2
#endif
__device__ __forceinline__ uint4 ldw_u4(const void* p) {
    uint4 v;
#if FW_LOAD == 2
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
#elif FW_LOAD == 1
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
#else
    v = *(const uint4*)p;
#endif
    return v;
}

#define QF(bits) __int_as_float((int)(bits))
#define Q_INF __int_as_float(0x7f800000)
#define Q_NINF __int_as_float((int)0xff800000u)

__device__ __forceinline__ float q_add(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ float q_sub(float a, float b) { return __fsub_rn(a, b); }
__device__ __forceinline__ float q_mul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ float q_div(float a, float b) { return __fdiv_rn(a, b); }
__device__ __forceinline__ bool q_isnan(float x) { return x != x; }

// Rust f32::max: NaN-ignoring maximum (a NaN operand yields the other).
__device__ __forceinline__ float q_max(float a, float b) { return fmaxf(a, b); }

// f16 <-> f32 through PTX (exact widening; round-to-nearest-even narrowing),
// so no header is needed.
__device__ __forceinline__ float q_f16(u16 bits) {
    float r;
    asm("{ .reg .b16 h; mov.b16 h, %1; cvt.f32.f16 %0, h; }" : "=f"(r) : "h"(bits));
    return r;
}
__device__ __forceinline__ u16 q_to_f16(float x) {
    u16 r;
    asm("{ .reg .b16 h; cvt.rn.f16.f32 h, %1; mov.b16 %0, h; }" : "=h"(r) : "f"(x));
    return r;
}
// The wgmma prefill GEMM's activation layout (to_f16_wr, matmul_wgmma_fast.cu;
// also written by rms_norm_fast and swiglu_f16wr for the GEMM after them):
// x (n, k) as f16 in tiles of 128 tokens, each tile k / 64 chunks of 16 KiB
// (chunk c of tile T at (T k / 64 + c) x 16 KiB); token i's 16-byte piece p
// (values 8 p .. 8 p + 7 of the chunk) at i x 128 + (p ^ (i % 8)) x 16 (the
// 128-byte swizzle). Byte offset of piece pk (values 8 pk .. 8 pk + 7 of
// the row) of token t; k a multiple of 64.
__device__ __forceinline__ long long f16wr_off(int t, int k, int pk) {
    const int c = pk >> 3, p = pk & 7, i = t & 127;
    return ((long long)(t >> 7) * (k >> 6) + c) * (128 * 128) + i * 128 + ((p ^ (i & 7)) << 4);
}
// Four values as f16 (q_to_f16), packed low value first.
__device__ __forceinline__ uint2 f16x4(float4 v) {
    return make_uint2((u32)q_to_f16(v.x) | ((u32)q_to_f16(v.y) << 16),
                      (u32)q_to_f16(v.z) | ((u32)q_to_f16(v.w) << 16));
}
// The body of one thread of a kernel that writes the f16 tiles (to_f16_wr,
// swiglu_f16wr: one thread per 16-byte piece, `pieces` = whole tiles of 128
// rows x k / 8): piece pk of row t, its values 8 pk .. 8 pk + 7 made by
// vals(o, r) into r[0], r[1] (o = t k + 8 pk, the row-major index of the
// first) for rows t < n; zeros past n.
template <class F>
__device__ __forceinline__ void f16wr_piece(u16* __restrict__ out, int n, int k, long long pieces,
                                            F vals) {
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= pieces) return;
    const int t = (int)(idx / (k / 8)), pk = (int)(idx % (k / 8));
    uint4 h = make_uint4(0, 0, 0, 0);
    if (t < n) {
        float4 r[2];
        vals((long long)t * k + 8 * pk, r);
        const uint2 a = f16x4(r[0]), b = f16x4(r[1]);
        h = make_uint4(a.x, a.y, b.x, b.y);
    }
    *(uint4*)((u8*)out + f16wr_off(t, k, pk)) = h;
}
__device__ __forceinline__ float q_bf16(u16 bits) { return __uint_as_float(((u32)bits) << 16); }
__device__ __forceinline__ float q_f16_at(const u8* p) {
    return q_f16((u16)p[0] | ((u16)p[1] << 8));
}

// round half away from zero (canon::round_away).
__device__ __forceinline__ float q_round_away(float x) {
    if (q_isnan(x) || fabsf(x) >= 8388608.0f) return x;
    float t = (float)(int)x;
    float f = q_sub(x, t);
    if (f >= 0.5f) return q_add(t, 1.0f);
    if (f <= -0.5f) return q_sub(t, 1.0f);
    return t;
}

__device__ __forceinline__ float q_scale_pow2(float v, int n) {
    if (n > 127) {
        v = q_mul(v, __int_as_float((127 + 127) << 23));
        return q_mul(v, __int_as_float((n - 127 + 127) << 23));
    }
    if (n < -126) {
        v = q_mul(v, __int_as_float((-100 + 127) << 23));
        return q_mul(v, __int_as_float((n + 100 + 127) << 23));
    }
    return q_mul(v, __int_as_float((n + 127) << 23));
}

__device__ __forceinline__ float q_exp(float x) {
    if (q_isnan(x)) return x;
    if (x > 88.8f) return Q_INF;
    if (x < -104.0f) return 0.0f;
    float n = q_round_away(q_mul(x, QF(QC_LOG2E)));
    float r = q_sub(q_sub(x, q_mul(n, QF(QC_LN2_HI))), q_mul(n, QF(QC_LN2_LO)));
    float p = QF(QC_INV_FACT7);
    p = q_add(q_mul(p, r), QF(QC_INV_FACT6));
    p = q_add(q_mul(p, r), QF(QC_INV_FACT5));
    p = q_add(q_mul(p, r), QF(QC_INV_FACT4));
    p = q_add(q_mul(p, r), QF(QC_INV_FACT3));
    p = q_add(q_mul(p, r), 0.5f);
    p = q_add(q_mul(p, r), 1.0f);
    p = q_add(q_mul(p, r), 1.0f);
    return q_scale_pow2(p, (int)n);
}

__device__ __forceinline__ float q_silu(float x) {
    return q_div(x, q_add(1.0f, q_exp(-x)));
}

// canon::tanh: the x^7 series below |x| = 0.125, else (1 - e) / (1 + e)
// with e = exp(-2|x|) and the sign of x.
__device__ __forceinline__ float q_tanh(float x) {
    float a = fabsf(x);
    if (a < 0.125f) {
        float x2 = q_mul(x, x);
        float p = QF(QC_TANH_C7);
        p = q_sub(QF(QC_TANH_C5), q_mul(p, x2));
        p = q_sub(QF(QC_TANH_C3), q_mul(p, x2));
        return q_sub(x, q_mul(q_mul(x, x2), p));
    }
    float e = q_exp(q_mul(-2.0f, a));
    return copysignf(q_div(q_sub(1.0f, e), q_add(1.0f, e)), x);
}

__device__ __forceinline__ float q_rsqrt(float x) { return q_div(1.0f, __fsqrt_rn(x)); }

__device__ __forceinline__ void q_sin_cos(float x, float* so, float* co) {
    if (q_isnan(x) || fabsf(x) == Q_INF) {
        *so = __int_as_float(0x7fc00000);
        *co = __int_as_float(0x7fc00000);
        return;
    }
    float k = q_round_away(q_mul(x, QF(QC_TWO_OVER_PI)));
    float r = q_sub(x, q_mul(k, QF(QC_P1)));
    r = q_sub(r, q_mul(k, QF(QC_P2)));
    r = q_sub(r, q_mul(k, QF(QC_P3)));
    r = q_sub(r, q_mul(k, QF(QC_P4)));
    float r2 = q_mul(r, r);
    float ps = QF(QC_INV_FACT9);
    ps = q_sub(q_mul(ps, r2), QF(QC_INV_FACT7));
    ps = q_add(q_mul(ps, r2), QF(QC_INV_FACT5));
    ps = q_sub(q_mul(ps, r2), QF(QC_INV_FACT3));
    float s = q_add(r, q_mul(r, q_mul(r2, ps)));
    float pc = -QF(QC_INV_FACT10);
    pc = q_add(q_mul(pc, r2), QF(QC_INV_FACT8));
    pc = q_sub(q_mul(pc, r2), QF(QC_INV_FACT6));
    pc = q_add(q_mul(pc, r2), QF(QC_INV_FACT4));
    pc = q_sub(q_mul(pc, r2), 0.5f);
    float c = q_add(1.0f, q_mul(r2, pc));
    switch (((long long)k) & 3) {
        case 0: *so = s; *co = c; break;
        case 1: *so = c; *co = -s; break;
        case 2: *so = -s; *co = -c; break;
        default: *so = -c; *co = s; break;
    }
}

// Canonical 32-lane tree over a warp: lane i holds lane[i]; returns the
// total in lane 0 (for s in 16, 8, 4, 2, 1: lane[i] = lane[i] + lane[i + s]).
__device__ __forceinline__ float q_warp_tree32(float v) {
    for (int s = 16; s >= 1; s >>= 1) {
        float o = __shfl_down_sync(0xffffffffu, v, s, 32);
        v = q_add(v, o);
    }
    return v;
}

// 8-lane tree within aligned groups of 8 threads; result in the group's lane 0.
__device__ __forceinline__ float q_group_tree8(float v) {
    for (int s = 4; s >= 1; s >>= 1) {
        float o = __shfl_down_sync(0xffffffffu, v, s, 8);
        v = q_add(v, o);
    }
    return v;
}

// Tensor-core helpers of the fast-mode kernels (matmul_fast, attention_fast).
// c (16x8 f32) += a (16x16 f16, row) * b (16x8 f16, col), fragments as in
// the PTX ISA's m16n8k16 layout.
// Not volatile: a pure function of its registers, so the compiler may
// schedule the fragment loads of the next MMA ahead of it.
__device__ __forceinline__ void mma_f16_16816(const u32* a, u32 b0, u32 b1, float* c) {
    asm(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two f32 to f16 (round to nearest even) in one instruction (sm_80+): lo
// in the low half.
__device__ __forceinline__ u32 pack_f16x2(float lo, float hi) {
    u32 r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// Four 8x8 b16 matrices from shared memory: lanes 8q..8q+7 give the row
// addresses of matrix q, whose fragment lands in r[q].
__device__ __forceinline__ void ldsm_x4(u32* r, const void* p) {
    u32 a = (u32)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

// The same, transposed: lane l gets rows 2 (l % 4) and 2 (l % 4) + 1 of
// column l / 4 (the B operand of an MMA whose k runs along the rows).
__device__ __forceinline__ void ldsm_x4_trans(u32* r, const void* p) {
    u32 a = (u32)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a)
                 : "memory");
}

// Asynchronous global -> shared copies (sm_80+); src_bytes < size zero-fills
// the rest (0: nothing is read).
__device__ __forceinline__ void cp_async4(void* dst, const void* src, int src_bytes) {
    u32 d = (u32)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(d), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int src_bytes) {
    u32 d = (u32)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }
// Waits until at most N of this thread's most recent commit groups are pending.
template <int N>
__device__ __forceinline__ void cp_async_wait_group() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// A shared-memory word at p, which is 4-byte aligned when ALIGNED, else
// 2-byte aligned (two halves): the raw weight blocks of the int8 MMA
// kernels (matmul_mma_fast.cu, matmul_exact_mma.cu).
template <bool ALIGNED>
__device__ __forceinline__ u32 lds_word(const u8* p) {
    if (ALIGNED) return *(const u32*)p;
    const u16* h = (const u16*)p;
    return (u32)h[0] | ((u32)h[1] << 16);
}

// Two f16 (low half first) to f32.
__device__ __forceinline__ float2 q_f16x2(u32 v) {
    return make_float2(q_f16((u16)(v & 0xFFFF)), q_f16((u16)(v >> 16)));
}

// The canonical matmul's 16-bit activation layout (quant_act32 in
// ops/matmul/kernels/matmul.cu writes it; mv_exact32, mm_q32 and
// mm_exact_mma read it).
// Blocks in block b's tile (32, or fewer in a row's last tile; nb blocks
// a row): see canon_chunk.
__device__ __forceinline__ int canon_tile_blocks(int nb, int b) { return min(32, nb - (b & ~31)); }
// Where quant_act32 keeps a row's 16-bit activations (qs: rows of k): the
// row's 32-blocks in tiles of 32 (the last one tb < 32 blocks when k / 32
// is not a multiple of 32), a tile holding chunk 0 (values 0..7) of each
// of its blocks in block order, then chunk 1, 2 and 3. A warp whose lane l
// takes block 32t + l (mv_exact32) so reads one chunk of 32 blocks as 512
// contiguous bytes: four L1 wavefronts for its 16-byte loads, not the
// sixteen of blocks stored whole (64 bytes apart per lane). Integer dot
// products do not depend on where the values sit: the same bits. Returns
// the offset (in values) of chunk h of block b.
__device__ __forceinline__ int canon_chunk(int nb, int b, int h) {
    int t0 = b & ~31;
    return 32 * t0 + 8 * (h * canon_tile_blocks(nb, b) + (b - t0));
}

// A MatMuls op's job table (ops/matmul/jobs.rs MmJobs, same layout): up to
// MM_JOBS matrices of one type and k applied to one input in one launch.
// Job j owns the CTAs blockIdx.y in [end[j - 1], end[j]) (end[-1] = 0) and
// writes out[j] (n, m[j]); bit j of `add` makes it add into out[j] instead
// (out += product: the finished product added once, as MatMul then Add).
#define MM_JOBS 4
struct MmJobs {
    const u8* w[MM_JOBS];
    float* out[MM_JOBS];
    // The L2 read-ahead's progress word (l2_ahead_fast.cu), or null: the
    // one-row matvecs publish there how far the chain has read (mv_mark).
    int* mark_ptr;
    int m[MM_JOBS];
    int end[MM_JOBS];
    int add;
    int count;
    int prefetch;  // 1: prefetch the weight rows before griddepcontrol.wait
    int mark;      // job 0's first byte in the step's weight stream, in 256-byte units
};

// One CUtensorMap per job of a MatMuls table (cuTensorMapEncodeTiled on
// the host, ops/matmul/jobs.rs job_maps): job j's weights as (m_j rows,
// row_bytes / 8 u64), boxes of (one CTA's rows, 8 blocks of a row), no
// swizzle, rows past m_j filled with zeros. A kernel takes it as a grid
// constant parameter (the copy engine reads it from parameter space);
// zeros where no copy uses it (devices before sm_90).
struct __align__(64) TmaMap {
    unsigned long long v[16];
};
struct JobMaps {
    TmaMap m[MM_JOBS];
};

// The job of CTA row `by`: its weights, output, rows, whether it adds, and
// the CTA's index within the job. Constant indices only (an indexed kernel
// parameter would be copied to local memory).
struct MmJob {
    const u8* w;
    float* out;
    int m;
    bool add;
    int by;
    int j;  // the job's index in the table
};
__device__ __forceinline__ MmJob mm_job(const MmJobs& J, int by) {
    MmJob r = {J.w[0], J.out[0], J.m[0], (J.add & 1) != 0, by, 0};
#pragma unroll
    for (int j = 1; j < MM_JOBS; j++) {
        if (j < J.count && by >= J.end[j - 1]) {
            r.w = J.w[j];
            r.out = J.out[j];
            r.m = J.m[j];
            r.add = ((J.add >> j) & 1) != 0;
            r.by = by - J.end[j - 1];
            r.j = j;
        }
    }
    return r;
}

// The L2 read-ahead's progress (ops/l2_ahead): every 16th CTA of a
// job (thread 0) raises the progress word to where its rows (`row_bytes`
// each, every job's) start in the step's weight stream (jobs are
// consecutive there, in table order), so
// the read-ahead stays a fixed distance ahead of the chain's reads. Only a
// hint: it orders nothing and no result depends on it. Called before
// griddepcontrol.wait (PDL places CTAs early, which only moves it ahead).
__device__ __forceinline__ void mv_mark(const MmJobs& J, const MmJob& jb, int rows_per_cta,
                                        long long row_bytes) {
    if (J.mark_ptr == nullptr || threadIdx.x != 0 || blockIdx.x != 0 || (jb.by & 15) != 0) return;
    long long rows = (long long)jb.by * rows_per_cta;
#pragma unroll
    for (int j = 0; j < MM_JOBS - 1; j++)
        if (j < jb.j) rows += J.m[j];
    atomicMax(J.mark_ptr, J.mark + (int)((rows * row_bytes) >> 8));
}

// Stores a finished product: out = v, or out += v for an adding job.
__device__ __forceinline__ void mm_store(float* p, float v, bool add) {
    *p = add ? q_add(*p, v) : v;
}

// quant_q8's arithmetic (matmul_fast.cu) for one 32-block of activations
// held by a group of 32 / V consecutive lanes with V values each (lane gl
// of the group holds values V * gl ..): scale d = amax / 127, q = round to
// nearest of v / d clamped to +-127, NaN anywhere makes d NaN and every q
// zero; xq gets the block's 32 int8, *xds {d, d * sum(q)}. Whatever kernel
// calls it (the quantizer, or an elementwise kernel that produced the
// values), a block's bytes are the same: max and integer sums do not
// depend on order. Every lane of the group must call it together.
template <int V>
__device__ __forceinline__ void q8_block(const float* v, int gl, signed char* __restrict__ xq,
                                         float2* __restrict__ xds) {
    constexpr int G = 32 / V;
    int lane = threadIdx.x & 31;
    unsigned mask = G == 32 ? 0xffffffffu : (((1u << G) - 1u) << (lane & ~(G - 1)));
    float amax = fabsf(v[0]);
    bool nan = v[0] != v[0];
#pragma unroll
    for (int i = 1; i < V; i++) {
        amax = fmaxf(amax, fabsf(v[i]));
        nan = nan || v[i] != v[i];
    }
#pragma unroll
    for (int s = G / 2; s >= 1; s >>= 1) amax = fmaxf(amax, __shfl_xor_sync(mask, amax, s));
    nan = __any_sync(mask, nan);
    float d = amax / 127.0f;
    int sum = 0;
    u32 packed = 0;
#pragma unroll
    for (int i = 0; i < V; i++) {
        int q = (d == 0.0f || nan) ? 0 : __float2int_rn(v[i] / d);
        q = max(-127, min(127, q));
        sum += q;
        packed |= ((u32)(q & 0xFF)) << (8 * i);
    }
#pragma unroll
    for (int s = G / 2; s >= 1; s >>= 1) sum += __shfl_xor_sync(mask, sum, s);
    if (V == 4)
        ((u32*)xq)[gl] = packed;
    else if (V == 2)
        ((unsigned short*)xq)[gl] = (unsigned short)packed;
    else
        xq[gl] = (signed char)packed;
    if (gl == 0) {
        if (nan) d = __int_as_float(0x7fc00000);
        *xds = make_float2(d, d * (float)sum);
    }
}

// f32 -> f16 bits for the KV cache, round to nearest even. NaN keeps its
// sign and top payload bits, quieted (as the `half` crate).
__device__ __forceinline__ u16 kv_f16(float x) {
    u32 b = __float_as_uint(x);
    if ((b & 0x7fffffffu) > 0x7f800000u)
        return (u16)(((b >> 16) & 0x8000u) | 0x7C00u | 0x0200u | ((b & 0x7fffffu) >> 13));
    return q_to_f16(x);
}
