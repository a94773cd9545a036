// The L2 read-ahead of a captured one-row decode step (ops/l2_ahead).
//
// Why: a decode step is a chain of dependent kernels, and between (and
// inside) the weight-streaming matvecs sit latency-bound ones (norms, rope,
// attention, the small q/k/v and o matvecs) during which DRAM is mostly
// idle. This kernel runs beside the chain, in its own graph branch, and
// streams the step's weights into L2 a bounded distance ahead of where the
// chain reads them, so the chain finds them there.
//
// head: (3,) u64: the piece count n, the device address of the pieces,
//   and how far past `progress` a piece may end (256-byte units). pieces:
//   (2 n,) u64: piece i is pieces[2 i] (its device address, 16-byte
//   aligned) and pieces[2 i + 1] (low 32 bits: its bytes, a multiple of 16;
//   high 32 bits: where it ends in the step's weight stream, in 256-byte
//   units), in stream order. (Filled after the capture, which fixes only
//   the head's address: the table's size is known only then.)
// progress: (4,) i32: [0] the chain's read position in the same units
//   (mv_mark in common.cuh raises it), [1] CTAs that gave up waiting, [2]
//   the highest piece end one gave up on, [3] the highest position one gave
//   up at (a diagnostic the host logs at trace level, l2_trace); all zeroed
//   before the step.
//
// CTA c (one warp) takes pieces c, c + gridDim.x, ... A piece is fetched
// once progress + ahead reaches its end. Nothing the chain computes depends
// on this kernel: it only reads, and a prefetch returns no data. A chain
// that stops publishing progress (a step some of whose matmuls run another
// kernel) would leave it waiting: after L2A_PATIENCE_NS without progress it
// gives up, so the graph still completes.
//
// A chain that cannot go on while the read-ahead's CTAs are resident is the
// other case, and it was seen (H100, 2026-11-27): with 64 CTAs
// (matvec.l2_ctas = 64) every step after a 512-token prompt waited out the
// whole patience (1B Q4_0 48 tok/s, 8B Q8_0 42, against 1,530 and 276 with
// 32 CTAs). The give-up record (progress[1..3], l2_trace) showed
// all 64 CTAs giving up at the first layer's attention, which runs in
// thread-block clusters from 128 keys on. The clusters off removed the
// stall, and so did a preferred shared-memory carveout of 100% for this
// kernel (31% and 44% did not): an SM holding a read-ahead CTA keeps a
// carveout too small for the cluster form, and the placement of whole
// clusters on the other SMs did not succeed. Decode graphs with this branch
// now merge their attention without clusters (ops/attention/launch.rs).
// The patience stays 2 ms (it was 20): at 2 ms the 1B made 374 tok/s in
// that case, not 48; chain kernels publish progress every few microseconds,
// so 2 ms never cuts a working read-ahead short.
#ifndef L2A_PATIENCE_NS
#define L2A_PATIENCE_NS 2000000ull
#endif
// How a piece is fetched on sm_90+ (tuning knob): 0, one bulk prefetch by
// lane 0 (it holds the thread for about a DRAM round trip: about 130 GB/s
// per CTA with 64 KiB pieces on an H100); 1, 128-byte line prefetches by
// all 32 lanes (what devices before sm_90 always do).
#ifndef L2A_LINES
#define L2A_LINES 0
#endif

__device__ __forceinline__ unsigned long long l2a_now() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

extern "C" __global__ void __launch_bounds__(32) l2_ahead(const unsigned long long* __restrict__ head,
                                                          int* progress) {
    // Its only predecessor is the memset of `progress` (a full graph edge),
    // so the wait returns at once; kept for the rule every entry follows.
    GRID_DEP();
    long long n = (long long)head[0];
    const unsigned long long* __restrict__ pieces = (const unsigned long long*)head[1];
    long long ahead = (long long)head[2];
    int lane = threadIdx.x & 31;
    int seen = -1;
    unsigned long long since = l2a_now();
    for (long long i = blockIdx.x; i < n; i += gridDim.x) {
        unsigned long long a = pieces[2 * i];
        unsigned long long wd = pieces[2 * i + 1];
        long long end = (long long)(wd >> 32);
        unsigned bytes = (unsigned)(wd & 0xffffffffull);
        bool late = false;
        for (;;) {
            int p = *(volatile const int*)progress;
            // The chain already reads past this piece: fetching it now
            // helps no one and would only hold up the graph's end.
            late = end <= (long long)p;
            if ((long long)p + ahead >= end) break;
            unsigned long long t = l2a_now();
            if (p != seen) {
                seen = p;
                since = t;
            } else if (t - since > L2A_PATIENCE_NS) {
                if (lane == 0) {
                    atomicAdd(progress + 1, 1);
                    atomicMax(progress + 2, (int)end);
                    atomicMax(progress + 3, p);
                }
                return;
            }
            __nanosleep(256);
        }
        if (late) continue;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        if (!L2A_LINES) {
            if (lane == 0)
                asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(a), "r"(bytes)
                             : "memory");
            continue;
        }
#endif
        for (unsigned off = 128u * lane; off < bytes; off += 128u * 32u)
            asm volatile("prefetch.global.L2 [%0];" ::"l"(a + off));
    }
}
